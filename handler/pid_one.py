"""The service as a container's pid 1: a small init in front of it.

In a container started without an init (Docker and Dify's compose file without
`init: true`, Kubernetes, ECS Fargate without `initProcessEnabled`), `sandlot
serve` is pid 1, and every process whose parent dies becomes its child. When a
zygote dies with runs still alive (killed, or out of memory), the kernel ends
them (their parent-death signal) and hands them to pid 1; the service waits
only for the processes it started, so they would stay zombies for the
container's life. The sweep of a run's uid (runtimes/jail/service/sweep.py) also
counts on orphans going to an init, never to the service.

So `sandlot serve` as pid 1 forks first (`front`): the child goes on as the
service, in a process group of its own (the terminal's, under `docker run -it`,
so that a Ctrl-C reaches it once), and pid 1 becomes this module run as a
script by a fresh, isolated interpreter (a few MiB, none of the service's
memory). Like tini, it reaps every process handed to it and exits as the
service exits: with its exit status, or 128 + the signal that ended it. It
passes on the signals that stop a container (SIGTERM, `docker stop`'s; SIGINT);
the others stay what they were for a pid 1 with no handler: ignored. When it
exits the kernel ends whatever is left in the container's PID namespace.

Signals are blocked from before the fork until the init waits for them, so
none sent in between is lost; SIGCHLD goes back to its default action first
(an ignored one, inherited, would have the kernel reap the service unseen).
"""

from __future__ import annotations

import os
import signal
import sys

FORWARDED = (signal.SIGTERM, signal.SIGINT)
WAITED = frozenset((*FORWARDED, signal.SIGCHLD))
PR_SET_DUMPABLE = 4


def front() -> None:
    """As pid 1: put an init in front of the service. Returns in the service's process (never in pid 1)."""
    if os.getpid() != 1:
        return
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, WAITED)
    service = os.fork()
    if service == 0:
        os.setpgid(0, 0)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        return
    _lead_terminal(service)
    script = os.path.abspath(__file__)
    if os.path.isfile(script) and not getattr(sys, "frozen", False):
        try:
            os.execv(sys.executable, [sys.executable, "-I", "-S", script, str(service)])
        except OSError as exc:
            print(f"sandlot: the init runs in the service's interpreter: {exc}", file=sys.stderr, flush=True)
    main(service)  # where this file cannot be run on its own: the same loop, in this copy of the process


def _lead_terminal(service: int) -> None:
    """The service's group becomes the terminal's foreground (if there is one), as under tini."""
    try:
        os.setpgid(service, service)  # also done by the child: whichever comes first
    except OSError:
        pass  # it has ended already: its SIGCHLD tells
    try:
        if os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp():
            os.tcsetpgrp(0, service)
    except OSError:
        pass


def serve_as_init(service: int) -> None:
    """Reap every child, forward stop signals to the service; exit as the service exits."""
    while True:
        _reap(service)  # first too: what ended before this loop began
        signum = signal.sigwaitinfo(WAITED).si_signo
        if signum != signal.SIGCHLD:
            try:
                os.kill(service, signum)
            except ProcessLookupError:
                pass  # it has just ended: its SIGCHLD is on the way


def _reap(service: int) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid == service:
            code = os.waitstatus_to_exitcode(status)
            os._exit(128 - code if code < 0 else code)


def main(service: int) -> None:
    # SIGCHLD is not touched here: front() left it at its default, and setting that again would discard
    # a pending one (a signal whose default is to be ignored), the service's own end among them
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # as the service: /proc/1 root's
    except (OSError, AttributeError):
        pass
    serve_as_init(service)


if __name__ == "__main__":
    main(int(sys.argv[1]))
