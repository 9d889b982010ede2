"""Readers of /proc/<pid>/stat: the fields after the command name, and whether a task is past doing anything."""

from __future__ import annotations

PF_EXITING = 0x4  # include/linux/sched.h: the task is in do_exit()


def stat_fields(stat: bytes) -> list[bytes]:
    """/proc/<pid>/stat's fields after "pid (comm) " (the name may hold spaces and parentheses): state first
    (field 3), flags at 6 (field 9), start time at 19 (field 22)."""
    return stat[stat.rindex(b")") + 2 :].split()


def task_inert(stat: bytes) -> bool:
    """From /proc/<pid>/stat or /proc/<pid>/task/<tid>/stat: a zombie or dead task, or one in do_exit()."""
    fields = stat_fields(stat)
    return fields[0] in (b"Z", b"X", b"x") or bool(int(fields[6]) & PF_EXITING)
