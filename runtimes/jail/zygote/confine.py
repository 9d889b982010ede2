"""What a freshly forked child does to itself before it may see user code.

What a child does follows its mode's record (modes.py), field by field. Where
runs have a PID namespace the zygote forks each child into namespaces of its
own: pid 1 of a PID namespace, whose end takes every other process of the
namespace with it (the runners make the signals it sends itself end it, see
python/runner.py), and, with the pivoted tree, a mount, an IPC and
a UTS namespace (`Mode.clone_flags`); with a user namespace per run, that
namespace owns them. The child confines itself (`confine`) and then runs the
code.

Order matters: the ids of a new user namespace first, then the private /tmp
(needs the namespace's capabilities), then the identity and capability drop
(after which nothing can be undone), then the parent-death signal (the kernel
clears it on a credential change), then no_new_privs and Landlock (its fixed
rules prepared by the zygote, on descriptors of the zygote's that the child
closes next), then descriptors and limits. The allow-list filter is loaded by
the language runner once it has read the run's options from its pipe, before
the first line of user code.

Where /tmp is a directory (no mount namespace) the child works in a directory
of its own: under the service's (a Lambda function), or, in the chroot mode,
/tmp of its uid's cell in the materialized tree its zygote chrooted into (the
child chroots on into the cell, as root, before it drops root: trees.py), owned
by its own uid and capped by the service (tmpcap.py); its RLIMIT_FSIZE is then
no more than the /tmp cap, and RLIMIT_NPROC counts the processes of its uid.

In every mode the child then stacks a small filter that keeps signals and
rlimit changes to itself (`fence_signals`, seccomp_policy.fence_for): sharing a
uid, the kernel would let it signal the service; with a uid of its own, "not
permitted" against "no such process" would tell which pids exist.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import resource
import select
import signal
import socket
from dataclasses import dataclass

from runtimes.jail.modes import CHROOT, PIVOT, SHARED, TMPFS, USER_NAMESPACE, Mode
from runtimes.jail.policy import seccomp as seccomp_policy
from runtimes.jail.policy.tree_files import RUN_HOSTNAME, cell
from runtimes.linux import landlock, namespaces, syscalls


@dataclass(frozen=True)
class ChildPlan:
    """How to confine a child; the same for every child of one zygote."""

    mode: Mode
    tmp_size_bytes: int
    tmp_files: int
    max_open_files: int
    max_threads: int
    max_file_bytes: int
    landlock: int = 0  # Landlock ABI to use, 0 for none
    tmp_huge_pages: bool = False  # set by the zygote when this kernel's tmpfs takes huge=within_size
    time_namespace: bool = False  # a time namespace per run, its clocks from zero (timens.py)
    bounding_set_dropped: bool = False  # set by the zygote when its children inherit its empty bounding set
    # What the platform's record found possible at all (protections.py): where a call is refused it is not
    # made, since some platforms (Lambda, reportedly) kill a caller of a refused call with SIGSYS instead of
    # failing it. A mode that needs one of them is refused before any zygote starts (modes.py).
    dumpable: bool = True  # PR_SET_DUMPABLE (the zygote's)
    pdeathsig: bool = True  # PR_SET_PDEATHSIG
    no_new_privs: bool = True  # PR_SET_NO_NEW_PRIVS
    seccomp: bool = True  # a seccomp filter (the signal fence, the runner's allow-list)
    hostname: bool = True  # sethostname in the run's UTS namespace (cosmetic: skipped where refused)
    # its /tmp is a directory the service caps (tmpcap.py): the run is dumpable to its own uid, whose ids the
    # service takes to read its /proc fd table and maps for files whose names went (unnamed.py)
    watched: bool = False

    @classmethod
    def from_dict(cls, data: dict) -> ChildPlan:
        return cls(**{**data, "mode": Mode.from_dict(data["mode"])})

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "mode": self.mode.to_dict()}


@dataclass(frozen=True)
class Handles:
    """What the zygote lends a new child for its confinement; all closed before user code."""

    lifeline: int  # a pidfd of the zygote: readable once it has exited
    proc: int  # an open /proc (the tree has none), for the ids of a new user namespace
    ids: tuple[int, int]  # the zygote's uid and gid (userns: the run's too)
    landlock: landlock.Prepared | None  # the fixed part of the run's Landlock domain (where plan.landlock)
    # signals the zygote ignores since whoever started the service did (SIGTERM, SIGHUP): not the run
    ignored: tuple[int, ...]


def confine(plan: ChildPlan, uid: int, tmpdir: str, fds: tuple[int, ...], handles: Handles) -> None:
    """Turn the calling (just forked) process into a jailed one. Raises on any failure.

    fds become descriptors 0, 1, 2, ... in that order; every other one is closed.
    """
    os.setsid()
    for signum in handles.ignored:
        signal.signal(signum, signal.SIG_DFL)
    mode = plan.mode
    gid = uid
    if mode.identity == USER_NAMESPACE:
        uid, gid = handles.ids
        namespaces.map_own_ids(handles.proc, uid, gid)
    if mode.tree == PIVOT and plan.hostname:
        socket.sethostname(RUN_HOSTNAME)  # in a UTS namespace of its own
    if mode.tree == CHROOT:  # from its zygote's tree into its uid's cell, whose /tmp is its own (trees.py)
        os.chroot(cell(uid))
        os.chdir("/")
    if mode.tmp == TMPFS:
        syscalls.mount(
            "sandlot-tmp",
            "/tmp",
            "tmpfs",
            syscalls.MS_NOSUID | syscalls.MS_NODEV | syscalls.MS_NOEXEC,
            tmp_options(plan, uid, gid),
        )
        tmpdir = "/tmp"
    if mode.identity != SHARED:
        if not plan.bounding_set_dropped:
            namespaces.drop_bounding_set()
        if mode.own_uid:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
        namespaces.clear_capabilities()
    if plan.pdeathsig:  # without it (Lambda), the serial schedule kills and reaps every run itself
        syscalls.set_parent_death_signal(signal.SIGKILL)  # after the last credential change, which would clear it
    if select.select([handles.lifeline], [], [], 0)[0]:
        os._exit(1)  # the zygote died before the signal was armed: nobody would ever stop this child
    if plan.no_new_privs:  # without it no filter loads either: the runner refuses unless seccomp is optional
        syscalls.set_no_new_privs()
    if plan.landlock:
        # sharing the runtime's uid (Lambda): the run's directory is its only writable place, and (Landlock's
        # ptrace rule) no process outside its domain, the runtime client and the zygote included, can be
        # traced or have its memory, descriptors or environment opened, although they stay dumpable.
        # Before the descriptors below are closed: the prepared rules hold some of the zygote's.
        handles.landlock.restrict(writable=(tmpdir,))

    high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 100) for fd in fds]
    for target, fd in enumerate(high):
        os.dup2(fd, target)
    os.closerange(len(fds), max_fd())

    if mode.tmp != TMPFS:
        os.environ["HOME"] = os.environ["TMPDIR"] = tmpdir
    os.chdir(tmpdir)

    # 1, not 0: a core_pattern piping to a program (apport, systemd-coredump: the host's, in a container) gets a
    # dump whatever the limit, but at 1 (what the kernel gives its own helpers, against recursive dumps); a core
    # file needs a page. A run is dumpable to its uid where /tmp is a directory (watched, below): no dump of it
    # may leave it for the host.
    resource.setrlimit(resource.RLIMIT_CORE, (1, 1))
    resource.setrlimit(resource.RLIMIT_NOFILE, (plan.max_open_files, plan.max_open_files))
    # a directory for /tmp is capped by the service after the fact (tmpcap.py): no single file may pass the cap
    file_bytes = plan.max_file_bytes if mode.tmp == TMPFS else min(plan.max_file_bytes, plan.tmp_size_bytes)
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
    if mode.identity != SHARED:  # counted per uid, or per user namespace: the run's own either way
        resource.setrlimit(resource.RLIMIT_NPROC, (plan.max_threads, plan.max_threads))
    if plan.watched and plan.dumpable:
        # After the last credential change (which made it non-dumpable). Nothing else has its uid (the chroot
        # jail), or Landlock keeps every other run out of it (the landlock jail); /proc is closed to runs.
        syscalls.set_dumpable(True)


def fence_signals(plan: ChildPlan, program: syscalls.SeccompProgram | None = None) -> None:
    """In the child, last: signals and rlimit changes for itself only (program: the fence for its pid, made
    ahead by the zygote where every child is pid 1 of its PID namespace)."""
    if not plan.seccomp:
        return  # no seccomp here: the runner refuses to run, unless the operator opted out of seccomp
    try:
        (program or seccomp_policy.fence_program(os.getpid())).load()
    except OSError:
        pass  # no seccomp here: the runner refuses to run, unless the operator opted out of seccomp


def tmp_options(plan: ChildPlan, uid: int, gid: int) -> str:
    options = f"size={plan.tmp_size_bytes},nr_inodes={plan.tmp_files},mode=700,uid={uid},gid={gid}"
    # Big files (a node startup snapshot is copied in for every run) then cost a
    # few huge pages instead of a thousand small ones.
    return options + ",huge=within_size" if plan.tmp_huge_pages else options


def tmpfs_takes_huge_pages() -> bool:
    """Whether a tmpfs mounted on /tmp here may use huge pages (in a mount namespace of one's own)."""
    try:
        syscalls.mount(
            "sandlot-probe",
            "/tmp",
            "tmpfs",
            syscalls.MS_NOSUID | syscalls.MS_NODEV | syscalls.MS_NOEXEC,
            "size=1m,huge=within_size",
        )
    except OSError:
        return False
    syscalls.umount2("/tmp", syscalls.MNT_DETACH)
    return True


def max_fd() -> int:
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def limit_run(memory_bytes: int, cpu_seconds: int) -> None:
    """Limits that depend on the run's own options."""
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
