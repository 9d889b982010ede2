"""Start a command under a platform's restrictions: an honest stand-in for Lambda or a container.

    python tests/outer_filter.py [--caps docker-default|NAME,...] [--uid N] [--eperm prctl,seccomp]
                                 [--sigsys NAME,...] -- command ...

A call may be NAME:N, refused only when its first argument is N (`prctl:22`,
PR_SET_SECCOMP, refuses seccomp filters through prctl and leaves the rest of
prctl alone). As root it first narrows the capability bounding set to --caps (the command
then starts as a root without the others, as in a container: `docker-default`
is Docker's default set), changes to --uid (groups dropped), then loads a
seccomp filter that allows everything but the named calls (EPERM, or death by
SIGSYS), then execs the command, which inherits the filter for good, as a
process on such a platform would.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import os
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


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--caps", type=_caps, default=None)
    parser.add_argument("--uid", type=int, default=None)
    parser.add_argument("--eperm", type=_names, default=[])
    parser.add_argument("--sigsys", type=_names, default=[])
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command")
    if args.caps is not None:
        keep_only(args.caps)
    if args.uid is not None:
        os.setgroups([])
        os.setresgid(args.uid, args.uid, args.uid)
        os.setresuid(args.uid, args.uid, args.uid)
    flt = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    for name in args.eperm:
        flt.add_rule(pyseccomp.ERRNO(errno.EPERM), *_call(name))
    for name in args.sigsys:
        flt.add_rule(pyseccomp.KILL_PROCESS, *_call(name))
    flt.load()  # sets no_new_privs first, as an unprivileged process must
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
