"""A time namespace per run, so that a run's clocks do not tell it the machine's uptime.

CLOCK_MONOTONIC and CLOCK_BOOTTIME count from the machine's boot: two runs that
read them learn that they share a machine (and when it booted). In a time
namespace (Linux 5.6 and later) both clocks carry offsets; a run's namespace gets
offsets that put both at zero when it is made, so the run reads the time since
its process was prepared instead (CLOCK_REALTIME is the same everywhere and says
nothing of the machine).

unshare(CLONE_NEWTIME) does not move the caller: it makes the namespace its
later children enter, and the offsets may be written (through the caller's
/proc/<pid>/timens_offsets) only until the first of them has entered. So the
zygote, before each fork of a run, makes a new namespace and writes its offsets
(`TimeNamespaces.next`); the run is the first and only process to enter it. The
inits of the runs' PID namespaces are forks of the init maker, made before any
of this: they stay in the zygote's namespace, which does not matter, since they
run nothing of the run.

Both steps need capabilities over the zygote's user namespace: CAP_SYS_ADMIN for
unshare, CAP_SYS_TIME for the offsets. Root's zygote has them, and so has a
userns zygote in the user namespace it owns. The offsets file is opened once, as
the zygote starts; the kernel checks the opener's capabilities against each new
namespace's owner, which is the same user namespace every time.

Standard library only: imported by the zygote before it confines itself.
"""

from __future__ import annotations

import ctypes
import os
import time

from runtimes.linux import syscalls

_PR_SET_DUMPABLE = 4
_libc = ctypes.CDLL(None, use_errno=True)


def offsets(monotonic_ns: int, boottime_ns: int) -> bytes:
    """What timens_offsets takes to bring both clocks, as read now, back to zero."""
    lines = []
    for name, now in (("monotonic", monotonic_ns), ("boottime", boottime_ns)):
        seconds, nanoseconds = divmod(-now, 1_000_000_000)  # seconds negative, nanoseconds in [0, 1e9)
        lines.append(f"{name} {seconds} {nanoseconds}\n")
    return "".join(lines).encode()


class TimeNamespaces:
    """The zygote's handle for making a fresh time namespace for each run it forks."""

    def __init__(self, proc: int) -> None:
        """proc: an open /proc (the tree has none). Raises OSError if the offsets cannot be written here."""
        # A non-dumpable process's /proc files belong to root, which a zygote without root (or in a user
        # namespace of its own) is not: dumpable for the open only, before it has any child.
        dumpable = _libc.prctl(3, 0, 0, 0, 0)  # PR_GET_DUMPABLE
        _libc.prctl(_PR_SET_DUMPABLE, ctypes.c_ulong(1), 0, 0, 0)
        try:
            self.fd = os.open("self/timens_offsets", os.O_WRONLY | os.O_CLOEXEC, dir_fd=proc)
        finally:
            _libc.prctl(_PR_SET_DUMPABLE, ctypes.c_ulong(max(dumpable, 0)), 0, 0, 0)
        self.next()  # fail now, at start, rather than at a run's fork

    def next(self) -> None:
        """A new namespace for the next child, its clocks at zero. Raises OSError."""
        syscalls.unshare(syscalls.CLONE_NEWTIME)
        written = offsets(time.clock_gettime_ns(time.CLOCK_MONOTONIC), time.clock_gettime_ns(time.CLOCK_BOOTTIME))
        os.write(self.fd, written)

    def close(self) -> None:
        os.close(self.fd)
