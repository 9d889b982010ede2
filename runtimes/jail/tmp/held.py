"""Files a run holds that no directory shows: open, or mapped, after their last name went.

Where a run's /tmp is a plain directory (tmp/caps.py), a file deleted while still open, or made with O_TMPFILE,
keeps its blocks on the disk until the run lets it go, and a walk of the directory never finds it. The run's
own /proc entries do: `/proc/<pid>/fd` names every file it holds open (one table for all its threads: its
seccomp filter admits clone only with CLONE_FILES and close_range never with CLOSE_RANGE_UNSHARE), and a
stat through such a link tells the file's link count and its blocks; `/proc/<pid>/maps` names the files it
has mapped, those whose name went marked "(deleted)". The table and the memory are the thread group's, and
the leader's entries show them only while the leader lives: a run may end its leader alone (the exit system
call), and then another live thread's entries (/proc/<pid>/task/<tid>) are read instead. Paths in maps are
named without symbolic links: the run's directory is compared as os.path.realpath names it.

Reading them needs what ptrace's read check needs: the reader's filesystem uid and gid those of the run, and
the run dumpable (zygote/confine.py makes it so where this counts: the chroot jail, whose runs have uids of their own,
and the landlock jail, whose Landlock domains keep every other run out). The service, root in the chroot
jail, takes the run's filesystem ids in the calling thread only (setfsuid: per thread, the rest of the
process keeps its own) for the reads, and its own back after.

A mapped file whose descriptor is closed cannot be opened or stat'ed without CAP_CHECKPOINT_RESTORE
(/proc/<pid>/map_files), so its size is unknown: it counts as the most a file of the run may hold
(RLIMIT_FSIZE, the cap). Python's mmap keeps a descriptor of its own, so only code that maps and closes
by hand meets this.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import stat
import time
from collections.abc import Iterator

from runtimes.linux.procfs import stat_fields, task_inert

_libc = ctypes.CDLL(None, use_errno=True)
_ASK = 0xFFFFFFFF  # setfsuid(-1): changes nothing, answers the current one
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


class Unreadable(OSError):
    """The run's /proc entries refused the reader: it made itself non-dumpable (an exec of a file it cannot
    read), so what it holds cannot be counted."""


def start_time(pid: int) -> int:
    """The process's start (clock ticks after boot): with its pid, what names it for good."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        return _start_of(f.read())


def _start_of(line: bytes) -> int:
    return int(stat_fields(line)[19])


@contextlib.contextmanager
def as_fs_user(uid: int, gid: int) -> Iterator[None]:
    """The calling thread's filesystem ids are uid and gid inside the block (nothing changes when they are
    its own already)."""
    if _libc.setfsuid(_ASK) == uid and _libc.setfsgid(_ASK) == gid:
        yield
        return
    _libc.setfsgid(gid)
    _libc.setfsuid(uid)
    try:
        if _libc.setfsuid(_ASK) != uid or _libc.setfsgid(_ASK) != gid:
            raise PermissionError(f"could not take filesystem ids {uid}:{gid}")
        yield
    finally:
        _libc.setfsuid(os.geteuid())
        _libc.setfsgid(os.getegid())
        if _libc.setfsuid(_ASK) != os.geteuid() or _libc.setfsgid(_ASK) != os.getegid():
            raise RuntimeError("the scan thread could not take its own filesystem ids back")


def held_bytes(pid: int, started: int, directory: str, uid: int, per_file: int) -> int:
    """The blocks of the files the process (pid, started) holds open or mapped whose last name went, in bytes;
    a mapped one without a descriptor counts as per_file. 0 once the process is gone. Call as_fs_user(the run's
    ids) around it where the caller is not the run's uid; directory as the kernel names it (no symbolic link on
    the way: os.path.realpath). Raises Unreadable if its entries are refused."""
    try:
        proc = os.open(f"/proc/{pid}", _DIR)
    except FileNotFoundError:
        return 0
    try:
        try:
            if _start_of(_stat(proc)) != started:
                return 0  # the number is another process's now: the run is gone
        except (FileNotFoundError, ProcessLookupError):
            return 0  # ended meanwhile
        return _held_by_the_group(proc, str(pid), directory, uid, per_file)
    finally:
        os.close(proc)


ROUNDS = 5  # reads of the group's threads, when in each a thread read ended during its read (a pause between)


def _held_by_the_group(proc: int, pid: str, directory: str, uid: int, per_file: int) -> int:
    """The descriptor table and the memory are the whole thread group's, and any live thread's entries show
    them: the leader's while it lives. A thread can end the leader alone (the exit system call, not
    exit_group) and the group lives on with all it holds, while the leader's entries show nothing (its table
    and memory are gone, its entries root's): then another thread's. A read counts only if its thread was not
    on its way out once it was done (the kernel marks a thread exiting before it lets go of its table and
    memory, so the read saw them whole). 0 when every thread is on its way out: what they hold goes with them."""
    for round_ in range(ROUNDS):
        if round_:
            time.sleep(0.001 * round_)  # a group's exit marks every thread within a few milliseconds
        raced = False
        for tid in [pid, *_threads(proc, pid)]:
            try:
                task = proc if tid == pid else os.open(f"task/{tid}", _DIR, dir_fd=proc)
            except (FileNotFoundError, ProcessLookupError):
                raced = True  # gone since it was listed
                continue
            try:
                found = _read_whole(task, directory, uid, per_file)
            finally:
                if task != proc:
                    os.close(task)
            if found == _GONE and task == proc:
                return 0  # the group is gone (a leader is reaped last), and what it held with it
            if found in (_RACED, _GONE):
                raced = True
            elif found is not None:
                return found
        if not raced:
            return 0
    raise Unreadable(0, f"its threads ended as their entries were read, {ROUNDS} times")


_RACED, _GONE = -1, -2


def _read_whole(task: int, directory: str, uid: int, per_file: int) -> int | None:
    """What the thread's entries show, if it lived through the read; None if it was on its way out before,
    _RACED if it set out during it, _GONE if it is no more."""
    try:
        if task_inert(_stat(task)):
            return None
        try:
            total = _held(task, directory, uid, per_file)
        except PermissionError as exc:
            if task_inert(_stat(task)):
                return _RACED  # its memory went, and with it the reader's access
            raise Unreadable(exc.errno, f"its /proc entries are refused: {exc.strerror}") from None
        return _RACED if task_inert(_stat(task)) else total
    except (FileNotFoundError, ProcessLookupError):
        return _GONE


def _threads(proc: int, pid: str) -> list[str]:
    """The group's other threads, should its leader be on its way out (else none: its entries suffice)."""
    try:
        if not task_inert(_stat(proc)):
            return []
        tasks = os.open("task", _DIR, dir_fd=proc)
    except (FileNotFoundError, ProcessLookupError):
        return []
    try:
        return [tid for tid in os.listdir(tasks) if tid != pid]
    except (FileNotFoundError, ProcessLookupError):
        return []
    finally:
        os.close(tasks)


def _stat(proc: int) -> bytes:
    with open(os.open("stat", os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc), "rb") as f:
        return f.read()


def _held(proc: int, directory: str, uid: int, per_file: int) -> int:
    total = 0
    counted: set[int] = set()
    table = os.open("fd", _DIR, dir_fd=proc)
    try:
        for name in os.listdir(table):
            try:
                info = os.stat(name, dir_fd=table)  # through the link: the file itself
            except (FileNotFoundError, NotADirectoryError):
                continue  # closed since it was listed
            if stat.S_ISREG(info.st_mode) and info.st_nlink == 0 and info.st_uid == uid and info.st_ino not in counted:
                counted.add(info.st_ino)
                total += info.st_blocks * 512
    finally:
        os.close(table)
    with open(os.open("maps", os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc), "rb") as f:
        maps = f.read()
    inside = os.fsencode(directory.rstrip("/")) + b"/"
    for line in maps.splitlines():
        if not line.endswith(b" (deleted)"):
            continue
        fields = line.split(None, 5)
        if len(fields) < 6 or not fields[5].startswith(inside):
            continue
        inode = int(fields[4])
        if inode not in counted:
            counted.add(inode)
            total += per_file
    return total
