"""Start a command under a platform's restrictions: an honest stand-in for Lambda or a container.

    python tests/outer_filter.py [--uid N] [--eperm prctl,seccomp] [--sigsys NAME,...] -- command ...

As root it changes to --uid first (groups dropped), then loads a seccomp filter
that allows everything but the named calls (EPERM, or death by SIGSYS), then
execs the command, which inherits the filter for good, as a process on such a
platform would.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys

import pyseccomp


def _names(value: str) -> list[str]:
    return [name for name in value.split(",") if name]


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--uid", type=int, default=None)
    parser.add_argument("--eperm", type=_names, default=[])
    parser.add_argument("--sigsys", type=_names, default=[])
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command")
    if args.uid is not None:
        os.setgroups([])
        os.setresgid(args.uid, args.uid, args.uid)
        os.setresuid(args.uid, args.uid, args.uid)
    flt = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    for name in args.eperm:
        flt.add_rule(pyseccomp.ERRNO(errno.EPERM), name)
    for name in args.sigsys:
        flt.add_rule(pyseccomp.KILL_PROCESS, name)
    flt.load()  # sets no_new_privs first, as an unprivileged process must
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
