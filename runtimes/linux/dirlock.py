"""Directories shared by several service instances: in use while some process holds a flock on them.

A user holds a shared lock on the directory itself; whoever removes it first takes
the exclusive lock and, still holding it, renames the directory out of the way
(`<name>.trash-<random>`), so that a user who opened the old name meanwhile finds, once
it has its lock, that the name no longer leads there (`lock_shared` says so). The
trash name cannot be guessed: where the directory is a run's /tmp, a later run of the
same uid must not find what it holds should its removal fail.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable

from runtimes.linux import removal

TRASH = ".trash-"


class Gone(FileNotFoundError):
    pass


def lock_shared(path: str | os.PathLike) -> int:
    """A descriptor holding a shared lock on the directory at path; Gone if it is being removed."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if not same:
            raise Gone(f"{path} was removed while we waited for it")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _remove(path: str) -> None:
    removal.remove_quietly(path)  # a run's directories in it too, whatever modes the run left them


def remove_if_unlocked(
    path: str | os.PathLike, remove: Callable[[str], None] = _remove, trash_dir: str | None = None
) -> bool:
    """Remove the directory (with remove(), once it is renamed out of the way: beside it, or into trash_dir on
    the same filesystem) unless some process holds a lock on it; True if it is gone."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        try:  # the name may lead elsewhere by now: the directory opened was removed, and a new one, locked by its
            if os.lstat(path).st_ino != os.fstat(fd).st_ino:  # maker or about to be, made under the same name
                return False
        except FileNotFoundError:
            return False
        name = os.fspath(path)
        trash = f"{name}{TRASH}{os.urandom(16).hex()}" if TRASH not in name else name
        if trash_dir is not None and TRASH not in name:
            trash = os.path.join(trash_dir, os.path.basename(trash))
        try:
            os.rename(path, trash)
        except OSError:
            return False  # someone else removed it first
    finally:
        os.close(fd)
    remove(trash)
    return True
