"""What a freshly forked child does to itself before it may see user code.

What a child does follows its mode's record (modes.py), field by field. Where
runs have a PID namespace the zygote forks each child into namespaces of its
own: pid 1 of a PID namespace, whose end takes every other process of the
namespace with it (the runners make the signals it sends itself end it, see
python/runner.py), and, with the pivoted tree, a mount, an IPC and
a UTS namespace (`Mode.clone_flags`); with a user namespace per run, that
namespace owns them. The child confines itself (`confine`) and then runs the
code.

The order of confinement lives in one place, `confine()`: one step a line,
its docstring saying why each comes where it does. Filters last: the seccomp
filters are loaded after every other step, and the runner's allow-list later
still, once it has read the run's options from its pipe, before the first line
of user code.

Where /tmp is a directory (no mount namespace) the child works in a directory
of its own: under the service's (a Lambda function), or, in the chroot mode,
/tmp of its uid's cell in the materialized tree its zygote chrooted into (the
child chroots on into the cell, as root, before it drops root: jail/trees/), owned
by its own uid and capped by the service (tmp/caps.py); its RLIMIT_FSIZE is then
no more than the /tmp cap, and RLIMIT_NPROC counts the processes of its uid.

In every mode the child then stacks a small filter that keeps signals and
rlimit changes to itself (`_load_filters`, allowlist.fence_for): sharing a
uid, the kernel would let it signal the service; with a uid of its own, "not
permitted" against "no such process" would tell which pids exist.
"""

from __future__ import annotations

import fcntl
import os
import resource
import select
import signal
import socket
from dataclasses import dataclass

from runtimes.jail.modes import CHROOT, PIVOT, SHARED, TMPFS, USER_NAMESPACE
from runtimes.jail.policy import allowlist
from runtimes.jail.policy.tree_files import RUN_HOSTNAME, cell
from runtimes.jail.zygote_config import Confinement
from runtimes.linux import landlock, namespaces, syscalls


@dataclass(frozen=True)
class Handles:
    """What the zygote lends a new child for its confinement; all closed before user code."""

    lifeline: int  # a pidfd of the zygote: readable once it has exited
    proc: int  # an open /proc (the tree has none), for the ids of a new user namespace
    ids: tuple[int, int]  # the zygote's uid and gid (userns: the run's too)
    landlock: landlock.Prepared | None  # the fixed part of the run's Landlock domain (where confinement.landlock)
    # signals the zygote ignores since whoever started the service did (SIGTERM, SIGHUP): not the run
    ignored: tuple[int, ...]
    # the filters every child stacks last, compiled once by the zygote: the signal fence where every child is
    # pid 1 (else one is made for the child's pid), the landlock mode's shared-uid rules, proxy egress's UDP refusal
    fence: syscalls.SeccompProgram | None = None
    stacked: tuple[syscalls.SeccompProgram, ...] = ()


def confine(confinement: Confinement, uid: int, tmpdir: str, fds: tuple[int, ...], handles: Handles) -> None:
    """Turn the calling (just forked) process into a jailed one. Raises on any failure.

    fds become descriptors 0, 1, 2, ... in that order; every other one is closed. The order is this
    function's body, one step a line; each step follows the mode's fields (and the platform's record):

    1. a session of its own; the signals the zygote ignores back to their default;
    2. the ids of a new user namespace (first: the steps after it need the namespace's capabilities);
    3. its host name (its UTS namespace), the cell of its uid (chroot), its private /tmp (tmpfs);
    4. the identity and capability drop: nothing can be undone after it;
    5. the parent-death signal (after the last credential change, which clears it), the zygote checked alive;
    6. no_new_privs, then Landlock (its fixed rules prepared by the zygote, on descriptors of the zygote's
       that the next step closes);
    7. descriptors: fds as 0, 1, 2, ..., every other one closed; its working directory;
    8. rlimits, and dumpable to its own uid where the service watches its /tmp;
    9. filters last: the seccomp filters the zygote compiled (the signal fence, and the mode's stacked
       ones). Nothing after a filter may need a call it refuses. The runner loads the allow-list itself,
       later still, once it has read the run's options from its pipe, before the first line of user code.
    """
    _new_session(handles)
    uid, gid = _user_namespace_ids(confinement, uid, handles)
    _enter_own_places(confinement, uid)
    tmpdir = _private_tmp(confinement, uid, gid, tmpdir)
    _drop_identity(confinement, uid)
    _arm_parent_death(confinement, handles)
    _restrict(confinement, handles, tmpdir)
    _own_descriptors(fds)
    _work_in(confinement, tmpdir)
    _limit(confinement)
    _load_filters(confinement, handles)


def _new_session(handles: Handles) -> None:
    os.setsid()
    for signum in handles.ignored:
        signal.signal(signum, signal.SIG_DFL)


def _user_namespace_ids(confinement: Confinement, uid: int, handles: Handles) -> tuple[int, int]:
    """The run's uid and gid: the zygote's, mapped in its new user namespace; else the uid it was given."""
    if confinement.mode.identity != USER_NAMESPACE:
        return uid, uid
    uid, gid = handles.ids
    namespaces.map_own_ids(handles.proc, uid, gid)
    return uid, gid


def _enter_own_places(confinement: Confinement, uid: int) -> None:
    mode = confinement.mode
    if mode.tree == PIVOT and confinement.hostname:
        socket.sethostname(RUN_HOSTNAME)  # in a UTS namespace of its own
    if mode.tree == CHROOT:  # from its zygote's tree into its uid's cell, whose /tmp is its own (jail/trees/)
        os.chroot(cell(uid))
        os.chdir("/")


def _private_tmp(confinement: Confinement, uid: int, gid: int, tmpdir: str) -> str:
    if confinement.mode.tmp != TMPFS:
        return tmpdir
    syscalls.mount(
        "sandlot-tmp",
        "/tmp",
        "tmpfs",
        syscalls.MS_NOSUID | syscalls.MS_NODEV | syscalls.MS_NOEXEC,
        tmp_options(confinement, uid, gid),
    )
    return "/tmp"


def _drop_identity(confinement: Confinement, uid: int) -> None:
    mode = confinement.mode
    if mode.identity == SHARED:
        return
    if not confinement.bounding_set_dropped:
        namespaces.drop_bounding_set()
    if mode.own_uid:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    namespaces.clear_capabilities()


def _arm_parent_death(confinement: Confinement, handles: Handles) -> None:
    if confinement.pdeathsig:  # without it (Lambda), the serial schedule kills and reaps every run itself
        syscalls.set_parent_death_signal(signal.SIGKILL)  # after the last credential change, which would clear it
    if select.select([handles.lifeline], [], [], 0)[0]:
        os._exit(1)  # the zygote died before the signal was armed: nobody would ever stop this child


def _restrict(confinement: Confinement, handles: Handles, tmpdir: str) -> None:
    if confinement.no_new_privs:  # without it no filter loads either: the runner refuses unless seccomp is optional
        syscalls.set_no_new_privs()
    if confinement.landlock:
        # sharing the runtime's uid (Lambda): the run's directory is its only writable place, and (Landlock's
        # ptrace rule) no process outside its domain, the runtime client and the zygote included, can be
        # traced or have its memory, descriptors or environment opened, although they stay dumpable.
        # Before the descriptors below are closed: the prepared rules hold some of the zygote's.
        handles.landlock.restrict(writable=(tmpdir,))


def _own_descriptors(fds: tuple[int, ...]) -> None:
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 100) for fd in fds]
    for target, fd in enumerate(high):
        os.dup2(fd, target)
    os.closerange(len(fds), max_fd())


def _work_in(confinement: Confinement, tmpdir: str) -> None:
    if confinement.mode.tmp != TMPFS:
        os.environ["HOME"] = os.environ["TMPDIR"] = tmpdir
    os.chdir(tmpdir)


def _limit(confinement: Confinement) -> None:
    mode = confinement.mode
    # 1, not 0: a core_pattern piping to a program (apport, systemd-coredump: the host's, in a container) gets a
    # dump whatever the limit, but at 1 (what the kernel gives its own helpers, against recursive dumps); a core
    # file needs a page. A run is dumpable to its uid where /tmp is a directory (watched, below): no dump of it
    # may leave it for the host.
    resource.setrlimit(resource.RLIMIT_CORE, (1, 1))
    resource.setrlimit(resource.RLIMIT_NOFILE, (confinement.max_open_files, confinement.max_open_files))
    # a directory for /tmp is capped by the service after the fact (tmp/caps.py): no single file may pass the cap
    file_bytes = confinement.max_file_bytes
    if mode.tmp != TMPFS:
        file_bytes = min(file_bytes, confinement.tmp_size_bytes)
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
    if mode.identity != SHARED:  # counted per uid, or per user namespace: the run's own either way
        resource.setrlimit(resource.RLIMIT_NPROC, (confinement.max_threads, confinement.max_threads))
    if confinement.watched and confinement.dumpable:
        # After the last credential change (which made it non-dumpable). Nothing else has its uid (the chroot
        # jail), or Landlock keeps every other run out of it (the landlock jail); /proc is closed to runs.
        syscalls.set_dumpable(True)


def _load_filters(confinement: Confinement, handles: Handles) -> None:
    """Last: signals and rlimit changes for itself only (the fence: for its pid, or made ahead by the zygote
    where every child is pid 1 of its PID namespace), then the mode's stacked filters."""
    if confinement.seccomp:  # no seccomp here: the runner refuses to run, unless the operator opted out of seccomp
        try:
            (handles.fence or allowlist.fence_program(os.getpid())).load()
        except OSError:
            pass  # no seccomp here: the runner refuses to run, unless the operator opted out of seccomp
    for program in handles.stacked:
        program.load()


def tmp_options(confinement: Confinement, uid: int, gid: int) -> str:
    options = f"size={confinement.tmp_size_bytes},nr_inodes={confinement.tmp_files},mode=700,uid={uid},gid={gid}"
    # Big files (a node startup snapshot is copied in for every run) then cost a
    # few huge pages instead of a thousand small ones.
    return options + ",huge=within_size" if confinement.tmp_huge_pages else options


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
