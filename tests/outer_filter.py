"""Start a command under a platform's restrictions: an honest stand-in for Lambda or a container.

    python tests/outer_filter.py [--caps docker-default|NAME,...] [--uid N] [--eperm prctl,seccomp]
                                 [--enosys NAME,...] [--sigsys NAME,...] [--profile docker-default]
                                 [--pid-namespace] -- command ...

A call may be NAME:N, refused only when its first argument is N (`prctl:22`,
PR_SET_SECCOMP, refuses seccomp filters through prctl and leaves the rest of
prctl alone). As root it first narrows the capability bounding set to --caps (the command
then starts as a root without the others, as in a container: `docker-default`
is Docker's default set), changes to --uid (groups dropped), then loads a
seccomp filter that allows everything but the named calls (EPERM, or death by
SIGSYS), then execs the command, which inherits the filter for good, as a
process on such a platform would.

`--profile docker-default` adds what Docker's default seccomp profile refuses a
container without CAP_SYS_ADMIN (moby's profiles/seccomp/default.json): the
namespace, mount, key, bpf and perf calls (EPERM), clone with any CLONE_NEW*
flag (EPERM, one masked-argument rule per flag, as Docker's
`flags & 0x7E020000 == 0` condition), and clone3 (ENOSYS, so that libc falls
back to clone, whose flags a filter can read).

`--pid-namespace` first gives the command what every container has and the
other options do not make: a PID namespace of its own, in which it is pid 1,
with a /proc of its own (in a mount namespace of its own). This process stays
outside, as a container runtime does: it passes SIGTERM, SIGINT and SIGHUP on,
and ends as pid 1 ended; if it is killed, pid 1 is killed with it (and with pid
1, the kernel kills the rest of the namespace).
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import os
import signal
import sys

import pyseccomp

PR_CAPBSET_DROP = 24
CAPABILITIES = [
    "chown",
    "dac_override",
    "dac_read_search",
    "fowner",
    "fsetid",
    "kill",
    "setgid",
    "setuid",
    "setpcap",
    "linux_immutable",
    "net_bind_service",
    "net_broadcast",
    "net_admin",
    "net_raw",
    "ipc_lock",
    "ipc_owner",
    "sys_module",
    "sys_rawio",
    "sys_chroot",
    "sys_ptrace",
    "sys_pacct",
    "sys_admin",
    "sys_boot",
    "sys_nice",
    "sys_resource",
    "sys_time",
    "sys_tty_config",
    "mknod",
    "lease",
    "audit_write",
    "audit_control",
    "setfcap",
    "mac_override",
    "mac_admin",
    "syslog",
    "wake_alarm",
    "block_suspend",
    "audit_read",
    "perfmon",
    "bpf",
    "checkpoint_restore",
]
# what `docker run` grants by default (moby's oci/caps/defaults.go)
DOCKER_DEFAULT_CAPS = [
    "chown",
    "dac_override",
    "fsetid",
    "fowner",
    "mknod",
    "net_raw",
    "setgid",
    "setuid",
    "setfcap",
    "setpcap",
    "net_bind_service",
    "sys_chroot",
    "kill",
    "audit_write",
]


# Docker's default profile, for a process without CAP_SYS_ADMIN: refused with EPERM
DOCKER_REFUSED = [
    "unshare",
    "setns",
    "mount",
    "umount2",
    "pivot_root",
    "open_tree",
    "move_mount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "fanotify_init",
    "quotactl",
    "sethostname",
    "setdomainname",
]
# clone's flags Docker's profile refuses (0x7E020000): NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET
CLONE_NEW_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)


def docker_profile(flt: pyseccomp.SyscallFilter) -> None:
    """The rules of Docker's default seccomp profile that a root without CAP_SYS_ADMIN meets."""
    for name in DOCKER_REFUSED:
        flt.add_rule(pyseccomp.ERRNO(errno.EPERM), name)
    for flag in CLONE_NEW_FLAGS:  # rules of one action on one call are alternatives: any of the flags refuses
        flt.add_rule(pyseccomp.ERRNO(errno.EPERM), "clone", pyseccomp.Arg(0, pyseccomp.MASKED_EQ, flag, flag))
    flt.add_rule(pyseccomp.ERRNO(errno.ENOSYS), "clone3")


def _names(value: str) -> list[str]:
    return [name for name in value.split(",") if name]


def _call(spec: str) -> tuple:
    """NAME, or NAME:N for the call only when its first argument is N (prctl:22 is PR_SET_SECCOMP)."""
    name, _, first = spec.partition(":")
    if not first:
        return (name,)
    return name, pyseccomp.Arg(0, pyseccomp.EQ, int(first, 0))


def _caps(value: str) -> list[str]:
    names = DOCKER_DEFAULT_CAPS if value == "docker-default" else _names(value.lower().replace("cap_", ""))
    unknown = set(names) - set(CAPABILITIES)
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown capabilities: {', '.join(sorted(unknown))}")
    return names


def keep_only(capabilities: list[str]) -> None:
    """Drop every other capability from the bounding set: what root gets on its next exec."""
    libc = ctypes.CDLL(None, use_errno=True)
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    for number in range(last + 1):
        name = CAPABILITIES[number] if number < len(CAPABILITIES) else ""
        if name not in capabilities and libc.prctl(PR_CAPBSET_DROP, number, 0, 0, 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"cannot drop capability {name or number}: {os.strerror(err)}")


CLONE_NEWNS, CLONE_NEWPID = 0x20000, 0x20000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 0x4000, 0x40000
PR_SET_PDEATHSIG = 1


def own_pid_namespace() -> None:
    """Returns in pid 1 of a new PID namespace with its own /proc; the caller's process waits outside."""
    libc = ctypes.CDLL(None, use_errno=True)

    def check(result: int, what: str) -> None:
        if result != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")

    check(libc.unshare(CLONE_NEWNS | CLONE_NEWPID), "unshare")
    pid = os.fork()
    if pid == 0:
        check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl")
        check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
        check(libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None), "mount /proc")
        return
    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(number, lambda received, _frame: os.kill(pid, received))
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code < 0:  # killed by a signal: so is this process
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--caps", type=_caps, default=None)
    parser.add_argument("--uid", type=int, default=None)
    parser.add_argument("--eperm", type=_names, default=[])
    parser.add_argument("--enosys", type=_names, default=[])
    parser.add_argument("--sigsys", type=_names, default=[])
    parser.add_argument("--profile", choices=["docker-default"], default=None)
    parser.add_argument("--pid-namespace", action="store_true")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command")
    if args.pid_namespace:
        own_pid_namespace()
    if args.caps is not None:
        keep_only(args.caps)
    if args.uid is not None:
        os.setgroups([])
        os.setresgid(args.uid, args.uid, args.uid)
        os.setresuid(args.uid, args.uid, args.uid)
    flt = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    for name in args.eperm:
        flt.add_rule(pyseccomp.ERRNO(errno.EPERM), *_call(name))
    for name in args.enosys:
        flt.add_rule(pyseccomp.ERRNO(errno.ENOSYS), *_call(name))
    for name in args.sigsys:
        flt.add_rule(pyseccomp.KILL_PROCESS, *_call(name))
    if args.profile == "docker-default":
        docker_profile(flt)
    flt.load()  # sets no_new_privs first, as an unprivileged process must
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
