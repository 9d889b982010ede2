"""A pool of uids that no host user and no other Sandlot instance uses.

An instance claims a block of uids by holding an flock on a file named after
the block, for as long as it lives; blocks that overlap a host user or group
are skipped. A uid goes back to the pool only once the run that had it is dead.
The lock file goes when the instance closes the pool (a lock counts only while
the file it holds is still the one under that name).
"""

from __future__ import annotations

import fcntl
import grp
import os
import pwd


class UidPoolExhausted(RuntimeError):
    pass


class UidPool:
    def __init__(self, base: int, size: int, lock_dir: str, max_blocks: int = 64):
        os.makedirs(lock_dir, mode=0o755, exist_ok=True)
        host_ids = {p.pw_uid for p in pwd.getpwall()} | {g.gr_gid for g in grp.getgrall()}
        for block in range(max_blocks):
            first = base + block * size
            if any(first <= i < first + size for i in host_ids):
                continue
            path = os.path.join(lock_dir, f"uids-{first}.lock")
            fd = _lock(path)
            if fd is None:
                continue
            self._lock_fd, self._lock_path = fd, path
            self.first, self.size = first, size
            self._free = list(range(first + size - 1, first - 1, -1))
            return
        raise UidPoolExhausted(f"no free block of {size} uids from {base} (SANDLOT_UID_BASE)")

    def acquire(self) -> int:
        if not self._free:
            raise UidPoolExhausted("every uid of this instance's block is in use")
        return self._free.pop()

    def release(self, uid: int) -> None:
        self._free.append(uid)

    @property
    def in_use(self) -> int:
        return self.size - len(self._free)

    def close(self) -> None:
        try:  # still locked: nobody can hold this file meanwhile, and a newcomer makes a new one
            os.unlink(self._lock_path)
        except OSError:
            pass
        os.close(self._lock_fd)


def _lock(path: str) -> int | None:
    """An exclusive flock on the file now at path, or None if another instance holds it."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)  # its holder closed and removed it between our open and our lock: try the new one
