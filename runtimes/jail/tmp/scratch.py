"""What a run that shares the runtime's uid may leave in the writable places, found and removed.

Where runs have the runtime's own uid and no /tmp of their own (a Lambda
function), anything of that uid that appears in a writable place (/tmp,
/var/tmp, /dev/shm, the temp dir) while a run lives is the run's, and goes
before the next run. The runtime's own files there (a Node startup snapshot, the
runs' parent directory) are fingerprinted: a run that touched them is reported,
and the serial schedule replaces the zygote so that no later run starts from them.
"""

from __future__ import annotations

import os
import stat

from runtimes.linux import removal


def _fingerprint(path: str) -> dict[str, tuple[int, int]]:
    """(inode, ctime) of every file and directory under path: ctime cannot be set back by anyone."""
    prints = {}
    for root, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            full = os.path.join(root, name)
            try:
                st = os.lstat(full)
            except OSError:
                continue
            prints[full] = (st.st_ino, st.st_ctime_ns)
    try:
        st = os.lstat(path)
        prints[path] = (st.st_ino, st.st_ctime_ns)
    except OSError:
        pass
    return prints


class Scratch:
    """The writable places a run shares with the runtime, as they were when the runtime was ready.

    An entry of a place is known by its name and inode. What the runtime's uid had there when the
    runtime was ready stays; any other entry of that uid is what a run left, and goes. Another uid's
    entries stay; in a sticky place the run does not own (/tmp) the run can neither remove nor replace
    them, so one seen once is not looked at again: a run costs a directory read there, however full.
    """

    def __init__(self, places: list[str], uid: int, own: list[str], runs_parent: str):
        self.places = sorted({os.path.realpath(p) for p in places if os.path.isdir(p)})
        self.uid = uid
        self.runs_parent = runs_parent
        self.kept: dict[str, set[tuple[str, int]]] = {}  # the uid's entries when the runtime was ready
        self.others: dict[str, set[tuple[str, int]]] = {}  # other uids' entries, in places that keep them
        for place in self.places:
            self.kept[place] = set()
            self.others[place] = set() if self._keeps_others(place) else None
            for entry, owner in self._entries(place):
                if owner == uid:
                    self.kept[place].add((entry.name, entry.inode()))
                elif self.others[place] is not None:
                    self.others[place].add((entry.name, entry.inode()))
        self.own = own
        self.prints = self._prints()

    def _keeps_others(self, place: str) -> bool:
        try:
            st = os.stat(place)
        except OSError:
            return False
        return bool(st.st_mode & stat.S_ISVTX) and st.st_uid != self.uid

    def _entries(self, place: str, known: frozenset | set = frozenset()):
        """(entry, owner uid) of each entry of place not in known (by name and inode)."""
        try:
            with os.scandir(place) as scan:
                entries = [e for e in scan if (e.name, e.inode()) not in known]
        except OSError:
            return
        for entry in entries:
            try:
                yield entry, entry.stat(follow_symlinks=False).st_uid
            except OSError:
                continue

    def _prints(self) -> dict:
        prints = {}
        for path in self.own:
            prints.update(_fingerprint(path))
        return prints

    def clean(self) -> list[str]:
        """Remove what was not there before (and the runs' own directories); paths removed."""
        removed = []
        for place in self.places:
            others = self.others[place]
            for entry, owner in self._entries(place, self.kept[place] | (others or set())):
                if owner == self.uid:
                    removed.append(remove(entry.path))
                elif others is not None:
                    others.add((entry.name, entry.inode()))
        if self.runs_parent and os.path.isdir(self.runs_parent):
            for name in os.listdir(self.runs_parent):
                removed.append(remove(os.path.join(self.runs_parent, name)))
        return removed

    def tampered(self) -> list[str] | None:
        """None when the runtime's own files are as they were; else what appeared among them since (a run's
        plants: removed here, as no run's file may outlive it), [] when only existing ones changed."""
        now = self._prints()
        if now == self.prints:
            return None
        planted = sorted((path for path in now if path not in self.prints), key=len)
        removed: list[str] = []
        for path in planted:
            if not any(path.startswith(parent + "/") for parent in removed):  # gone with its directory
                removed.append(remove(path))
        return removed

    def rebase(self) -> None:
        self.prints = self._prints()


def remove(path: str) -> str:
    removal.remove_quietly(path)  # never follows a planted link; restores modes a run took away
    return path
