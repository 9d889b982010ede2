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
import grp
import os
import pwd
from dataclasses import dataclass

UID_MAP, GID_MAP = "/proc/self/uid_map", "/proc/self/gid_map"
MIN_BLOCK = 16  # fewer uids than this serve too few runs at once to be worth a block
OVERFLOW_IDS = {65534, 65535}  # nobody/nogroup and the 16-bit "no id": never a run's


class UidPoolExhausted(RuntimeError):
    pass


Ranges = list[tuple[int, int]]  # [first, end) runs of ids


def mapped(path: str) -> Ranges:
    """The ids (as this namespace names them) a user namespace map holds; all of them where the file cannot
    be read (a kernel without user namespaces maps every id)."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        return [(0, 2**32 - 1)]
    ranges = []
    for line in lines:
        fields = line.split()
        if len(fields) == 3:
            inside, _outside, count = (int(x) for x in fields)
            ranges.append((inside, inside + count))
    return sorted(ranges)


def _intersect(a: Ranges, b: Ranges) -> Ranges:
    return sorted((max(f1, f2), min(e1, e2)) for f1, e1 in a for f2, e2 in b if max(f1, f2) < min(e1, e2))


def image_ids() -> set[int]:
    """Ids the image's (or host's) users and groups have: never a run's."""
    return {p.pw_uid for p in pwd.getpwall()} | {g.gr_gid for g in grp.getgrall()}


@dataclass(frozen=True)
class IdMap:
    """The ids usable for runs and builds here: mapped for both uids and gids, none a user's or group's."""

    usable: Ranges  # ids both maps hold
    taken: frozenset[int]

    @classmethod
    def here(cls, uid_map: str = UID_MAP, gid_map: str = GID_MAP) -> IdMap:
        return cls(_intersect(mapped(uid_map), mapped(gid_map)), frozenset(image_ids() | OVERFLOW_IDS | {0}))

    def covers(self, first: int, end: int) -> bool:
        return any(f <= first and end <= e for f, e in self.usable)

    def free_runs(self) -> Ranges:
        """The runs of usable ids no user or group has, largest first."""
        runs = []
        for first, end in self.usable:
            start = first
            for taken in sorted(i for i in self.taken if first <= i < end):
                if taken > start:
                    runs.append((start, taken))
                start = taken + 1
            if start < end:
                runs.append((start, end))
        return sorted(runs, key=lambda r: (r[1] - r[0], r[0]), reverse=True)

    def region(self) -> tuple[int, int]:
        """[first, end): where uid blocks come from when SANDLOT_UID_BASE is not mapped: the largest free run,
        less its last id (the layer builds' uid)."""
        runs = self.free_runs()
        if not runs:
            return (0, 0)
        first, end = runs[0]
        return (first, end - 1)

    def describe(self) -> str:
        shown = ", ".join(f"{f}-{e - 1}" for f, e in self.usable[:4]) or "none"
        return f"the ids mapped here (uid_map and gid_map) are {shown}"


def build_uid(base: int, ids: IdMap | None = None) -> int:
    """The layer builds' uid where SANDLOT_BUILD_UID is not set: base - 1 where it is mapped (on a host), else
    the last id of the largest free run of the map (the uid blocks take the rest of it)."""
    ids = ids or IdMap.here()
    if ids.covers(base - 1, base) and base - 1 not in ids.taken:
        return base - 1
    runs = ids.free_runs()
    if not runs:
        raise UidPoolExhausted(f"no id for layer builds: {ids.describe()}, every one a user's or group's")
    return runs[0][1] - 1


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
