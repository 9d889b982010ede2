"""Readers of /proc/<pid>/stat: the fields after the command name, whether a task is past doing anything, and how
long ago this process started."""

from __future__ import annotations

import os
import time

PF_EXITING = 0x4  # include/linux/sched.h: the task is in do_exit()


def stat_fields(stat: bytes) -> list[bytes]:
    """/proc/<pid>/stat's fields after "pid (comm) " (the name may hold spaces and parentheses): state first
    (field 3), flags at 6 (field 9), start time at 19 (field 22)."""
    return stat[stat.rindex(b")") + 2 :].split()


def task_inert(stat: bytes) -> bool:
    """From /proc/<pid>/stat or /proc/<pid>/task/<tid>/stat: a zombie or dead task, or one in do_exit()."""
    fields = stat_fields(stat)
    return fields[0] in (b"Z", b"X", b"x") or bool(int(fields[6]) & PF_EXITING)


def since_exec() -> float:
    """Seconds since this process was started (its start time in /proc/self/stat: a clock tick, 10 ms); NaN where
    /proc cannot tell. A fork counts as a start (a container's pid 1 forks the service: handler/pid_one.py)."""
    try:
        with open("/proc/self/stat", "rb") as f:
            ticks = int(stat_fields(f.read())[19])
        return time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")
