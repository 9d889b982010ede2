"""Directories shared by several service instances: in use while some process holds a flock on them."""

from __future__ import annotations

import fcntl
import os
import shutil


def remove_if_unlocked(path: str | os.PathLike) -> bool:
    """Remove the directory unless some process holds a lock on it; True if it is gone."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    shutil.rmtree(path, ignore_errors=True)
    return True
