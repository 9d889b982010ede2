"""A thread limit per run where the kernel's counts another's tasks: the landlock jail.

Elsewhere a run's threads are capped by RLIMIT_NPROC (confine.py), which counts the tasks of the run's uid: its
own uid's (full, chroot) or its user namespace's (userns), so the run's alone. In the landlock jail every run
has the service's uid, and that count holds the service, its zygotes and every other run: no per-run value of
it can be set (one run started 3,000 threads). A pids cgroup per run would count the run's alone, but a
restricted pod's cgroup is not delegated (read-only /sys/fs/cgroup) and seccomp cannot count.

So the service counts: every POLL_EVERY seconds, for each child of the mode whose run is under way, one stat of
/proc/<pid>/task (the kernel gives the directory 2 + the process's threads as its link count: one system call,
no listing). A run is one process (fork is refused), so that is all its tasks. Past the limit (the same
`max_threads` the other modes give RLIMIT_NPROC) the run is killed through its pidfd and its answer's error
says `error: thread limit exceeded (64 threads)`. What this cannot give that the rlimit gives: the limit is
enforced after the fact, within a poll, so a run creating threads as fast as it can has more of them for a
moment (docs/security.md gives the number); and past it the run ends instead of seeing thread creation fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import select
import signal

log = logging.getLogger("sandlot.jail")

POLL_EVERY = 0.005  # seconds between two counts of every running run's threads (no timer while none runs)
TASK_DIR_LINKS = 2  # /proc/<pid>/task's link count, but for its threads


def thread_count(pid: int) -> int:
    """The threads of process pid (raises OSError once it is gone)."""
    return os.stat(f"/proc/{pid}/task").st_nlink - TASK_DIR_LINKS


def limit_error(limit: int) -> str:
    return f"error: thread limit exceeded ({limit} threads)"


class ThreadCap:
    """Counts the threads of each watched child (see the module) on one timer of the event loop."""

    def __init__(self, limit: int, every: float = POLL_EVERY):
        self.limit = limit
        self.every = every
        self._children: dict[int, object] = {}  # pid -> the child (supervisor.Child): pidfd, ended_by
        self._timer: asyncio.TimerHandle | None = None

    def watch(self, child) -> None:
        """From its run's start until unwatch(): its pid is its own while its pidfd is open."""
        self._children[child.pid] = child
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.every, self._count)

    def unwatch(self, child) -> None:
        self._children.pop(child.pid, None)
        if not self._children and self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def close(self) -> None:
        self._children.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _count(self) -> None:
        self._timer = None
        for pid, child in list(self._children.items()):
            try:
                over = thread_count(pid) > self.limit
            except OSError:
                over = False  # gone: released soon
            if over:
                self._end(pid, child)
        if self._children:
            self._timer = asyncio.get_running_loop().call_later(self.every, self._count)

    def _end(self, pid: int, child) -> None:
        self._children.pop(pid, None)
        pidfd = getattr(child, "pidfd", -1)
        # its pidfd readable: it has exited, and its pid (unreaped, or reaped and taken since) is not counted again
        if pidfd < 0 or select.select([pidfd], [], [], 0)[0]:
            return
        child.ended_by = child.ended_by or limit_error(self.limit)
        log.info("run %s ended: more than %s threads", pid, self.limit)
        with contextlib.suppress(ProcessLookupError, OSError):
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
