"""The service as a container's pid 1: a small init in front of it.

In a container started without an init (Docker and Dify's compose file without
`init: true`, Kubernetes, ECS Fargate without `initProcessEnabled`), `sandlot
serve` is pid 1, and every process whose parent dies becomes its child. When a
zygote dies with runs still alive (killed, or out of memory), the kernel ends
them (their parent-death signal) and hands them to pid 1; the service waits
only for the processes it started, so they would stay zombies for the
container's life. The sweep of a run's uid (runtimes/jail/sweep.py) also
counts on orphans going to an init, never to the service.

So `sandlot serve` as pid 1 forks first (`front`): the child goes on as the
service, and pid 1 becomes this module run as a script by a fresh, isolated
interpreter (a few MiB, none of the service's memory). Like tini, it forwards
the signals a container is stopped or told things with to the service, reaps
every process handed to it, and exits as the service exits: with its exit
status, or 128 + the signal that killed it. When it exits the kernel ends
whatever is left in the container's PID namespace.

Signals are blocked from before the fork until the init waits for them, so
none sent in between is lost.
"""

from __future__ import annotations

import os
import signal
import sys

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
WAITED = frozenset((*FORWARDED, signal.SIGCHLD))
PR_SET_DUMPABLE = 4


def front() -> None:
    """As pid 1: put an init in front of the service. Returns in the service's process (never in pid 1)."""
    if os.getpid() != 1:
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, WAITED)
    service = os.fork()
    if service == 0:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, WAITED)
        return
    try:
        os.execv(sys.executable, [sys.executable, "-I", "-S", os.path.abspath(__file__), str(service)])
    except OSError as exc:  # no init then: the service still serves, as it did before
        print(f"sandlot: no init in front of the service as pid 1: {exc}", file=sys.stderr, flush=True)
        serve_as_init(service)


def serve_as_init(service: int) -> None:
    """Forward signals to the service, reap every child; exit as the service exits."""
    while True:
        signum = signal.sigwaitinfo(WAITED).si_signo
        if signum != signal.SIGCHLD:
            try:
                os.kill(service, signum)
            except ProcessLookupError:
                pass  # it has just ended: its SIGCHLD is on the way
            continue
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                pid, status = 0, 0
            if pid == 0:
                break
            if pid == service:
                code = os.waitstatus_to_exitcode(status)
                sys.stdout.flush()
                os._exit(128 - code if code < 0 else code)


def main() -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # as the service: /proc/1 root's
    except (OSError, AttributeError):
        pass
    serve_as_init(int(sys.argv[1]))


if __name__ == "__main__":
    main()
