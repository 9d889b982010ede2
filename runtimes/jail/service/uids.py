"""A pool of uids that no host user and no other Sandlot instance uses.

An instance claims a block of uids by holding an flock on a file named after
the block, for as long as it lives; blocks that overlap a host user or group
are skipped. A uid goes back to the pool only once the run that had it is dead.
The lock file goes when the instance closes the pool (a lock counts only while
the file it holds is still the one under that name).

Only ids this process's user namespace maps can be given (/proc/self/uid_map and
gid_map: setresuid, chown and setgroups refuse any other with EINVAL). On a host
the maps hold every id and the blocks start at SANDLOT_UID_BASE as always. In a
container with a user namespace of its own (rootless podman or Docker, userns-remap,
`hostUsers: false`, `--uidmap 0:100000:65536`) that base lies outside the map: the
blocks, and the layer builds' uid, then come from the largest run of ids both maps
hold that no user or group of the image has. A map too small for a whole block
gives a smaller one (fewer runs at once, and `note` says so); one too small even for
MIN_BLOCK refuses, saying what the map holds.
"""

from __future__ import annotations

import fcntl
import os

from runtimes.linux.idmap import IdMap, UidPoolExhausted, build_uid, image_ids  # noqa: F401 (the jail's names for them)

MIN_BLOCK = 16  # fewer uids than this serve too few runs at once to be worth a block


class UidPool:
    def __init__(self, base: int, size: int, lock_dir: str, max_blocks: int = 64, ids: IdMap | None = None):
        os.makedirs(lock_dir, mode=0o755, exist_ok=True)
        ids = ids or IdMap.here()
        self.note = ""  # what the map changed, for the health detail
        starts = [base + block * size for block in range(max_blocks)]
        if not any(ids.covers(first, first + size) for first in starts):
            first, end = ids.region()
            fits = min(size, (end - first) // 2)  # both runtimes of a service take a block of it
            if fits < MIN_BLOCK:
                raise UidPoolExhausted(
                    f"no block of uids for runs: SANDLOT_UID_BASE ({base}) is not mapped in this user namespace, "
                    f"and {ids.describe()}, leaving {max(0, end - first)} ids no user or group has (at least "
                    f"{2 * MIN_BLOCK} needed)"
                )
            if fits < size:
                self.note = (
                    f"uid blocks of {fits} ids, not {size}: at most {fits} runs and ready children at once "
                    f"({ids.describe()})"
                )
            size = fits
            starts = [first + block * size for block in range((end - first) // size)]
        for first in starts:
            if not ids.covers(first, first + size) or any(first <= i < first + size for i in ids.taken):
                continue
            path = os.path.join(lock_dir, f"uids-{first}.lock")
            fd = _lock(path)
            if fd is None:
                continue
            self._lock_fd, self._lock_path = fd, path
            self.first, self.size = first, size
            self._free = list(range(first + size - 1, first - 1, -1))
            return
        raise UidPoolExhausted(f"no free block of {size} uids from {starts[0]} (SANDLOT_UID_BASE)")

    def acquire(self) -> int:
        if not self._free:
            raise UidPoolExhausted("every uid of this instance's block is in use")
        return self._free.pop()

    def upcoming(self, count: int) -> list[int]:
        """The uids the next count acquire() calls give, first first (if none is released meanwhile)."""
        return self._free[::-1][:count]

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
