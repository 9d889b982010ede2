"""What a freshly forked child does to itself before it may see user code.

Order matters: descriptors first (nothing of the zygote's may leak), then the
private /tmp (needs root), then the identity drop (after which nothing can be
undone), then limits. Without root, a small filter keeps signals and rlimit
changes to the child itself (seccomp_policy.fence_for). The allow-list filter is
loaded by the language runner once it has read the run's options from its pipe,
before the first line of user code.
"""

from __future__ import annotations

import fcntl
import os
import resource
import signal
from dataclasses import dataclass

from runtimes.jail import linux, seccomp_policy


@dataclass(frozen=True)
class ChildPlan:
    """How to confine a child; the same for every child of one zygote."""

    privileged: bool  # root: private mount namespace, tmpfs /tmp, own uid
    tmp_size_bytes: int
    tmp_files: int
    max_open_files: int
    max_threads: int
    max_file_bytes: int
    tmp_huge_pages: bool = False  # set by the zygote when this kernel's tmpfs takes huge=within_size

    @classmethod
    def from_dict(cls, data: dict) -> ChildPlan:
        return cls(**data)


def confine(plan: ChildPlan, uid: int, tmpdir: str, fds: tuple[int, ...]) -> None:
    """Turn the calling (just forked) process into a jailed one. Raises on any failure.

    fds become descriptors 0, 1, 2, ... in that order; every other one is closed.
    """
    os.setsid()
    try:
        linux.set_parent_death_signal(signal.SIGKILL)
    except OSError:
        pass  # prctl refused (Lambda): the record says so; one-shot runs are killed and reaped by the runtime
    for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 100) for fd in fds]
    for target, fd in enumerate(high):
        os.dup2(fd, target)
    os.closerange(len(fds), max_fd())

    if plan.privileged:
        linux.unshare(linux.CLONE_NEWNS)
        linux.mount(
            "sandlot-tmp",
            "/tmp",
            "tmpfs",
            linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC,
            tmp_options(plan, uid),
        )
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        tmpdir = "/tmp"
    else:
        os.environ["HOME"] = os.environ["TMPDIR"] = tmpdir
    os.chdir(tmpdir)
    try:
        linux.set_no_new_privs()
    except OSError:
        pass  # prctl refused: then no filter loads either, and the runner refuses unless seccomp is optional
    if not plan.privileged:  # same uid as the service: only a filter keeps it from signalling it
        fence = seccomp_policy.fence_for(os.getpid())
        try:
            fence.load()
        except OSError:
            pass  # no seccomp here: the runner refuses to run, unless the operator opted out of seccomp

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (plan.max_open_files, plan.max_open_files))
    resource.setrlimit(resource.RLIMIT_FSIZE, (plan.max_file_bytes, plan.max_file_bytes))
    if plan.privileged:  # counted per uid: only meaningful when the uid is the run's own
        resource.setrlimit(resource.RLIMIT_NPROC, (plan.max_threads, plan.max_threads))


def tmp_options(plan: ChildPlan, uid: int) -> str:
    options = f"size={plan.tmp_size_bytes},nr_inodes={plan.tmp_files},mode=700,uid={uid},gid={uid}"
    # Big files (a node startup snapshot is copied in for every run) then cost a
    # few huge pages instead of a thousand small ones.
    return options + ",huge=within_size" if plan.tmp_huge_pages else options


def tmpfs_takes_huge_pages() -> bool:
    """Whether a tmpfs mounted on /tmp here may use huge pages (as root, in a mount namespace of one's own)."""
    try:
        linux.mount(
            "sandlot-probe",
            "/tmp",
            "tmpfs",
            linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC,
            "size=1m,huge=within_size",
        )
    except OSError:
        return False
    linux.umount2("/tmp", linux.MNT_DETACH)
    return True


def max_fd() -> int:
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def limit_run(memory_bytes: int, cpu_seconds: int) -> None:
    """Limits that depend on the run's own options."""
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
