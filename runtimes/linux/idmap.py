"""The ids this process's user namespace maps, less those the image's users and groups have.

setresuid, chown and setgroups refuse any id /proc/self/uid_map and gid_map do not hold (EINVAL). On a host the
maps hold every id; in a container with a user namespace of its own (rootless podman or Docker, userns-remap,
`hostUsers: false`, `--uidmap 0:100000:65536`) they hold a range, and the runs' uid blocks (jail/service/uids.py)
and the layer builds' uid (handler/settings.py) come from it. Outside the jail package: the service's settings
read it too.
"""

from __future__ import annotations

from dataclasses import dataclass

UID_MAP, GID_MAP = "/proc/self/uid_map", "/proc/self/gid_map"
OVERFLOW_IDS = {65534, 65535}  # nobody/nogroup and the 16-bit "no id": never a run's


class UidPoolExhausted(RuntimeError):
    """No id is left to give: the map holds too few, or every one is a user's or group's."""


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


def _ids_in(path: str) -> set[int]:
    """The third field of each line of a passwd or group file."""
    ids = set()
    try:
        with open(path, errors="replace") as f:
            for line in f:
                fields = line.split(":")
                if len(fields) > 2 and fields[2].strip().isdigit():
                    ids.add(int(fields[2]))
    except OSError:
        pass
    return ids


def image_ids(passwd: str = "/etc/passwd", group: str = "/etc/group") -> set[int]:
    """Ids the image's (or host's) users and groups have: never a run's. Read from the files themselves, not
    through NSS (pwd.getpwall): an NSS module such as libnss_systemd loads libcap, whose constructor calls
    prctl, which kills the caller on a platform that answers refused calls with SIGSYS."""
    return _ids_in(passwd) | _ids_in(group)


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
