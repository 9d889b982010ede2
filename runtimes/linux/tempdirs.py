"""Temporary directories of a service or runtime function: gone when it stops, or at the next start.

Each is made under the temp dir with the maker's pid in its name
(`sandlot-<kind>-<pid>-<random>`) and a shared flock held on it while the maker
lives. The maker removes its own when it stops (`remove_own`, also at exit);
one that was killed (SIGKILL, no stop) leaves them behind, and the next maker of
the same kind removes those whose pid is gone and that nobody holds a lock on,
as the tree mount points (runtime.py) are.

Standard library only.
"""

from __future__ import annotations

import atexit
import glob
import os
import stat
import tempfile

from runtimes.linux import dirlock, removal

_own: dict[str, int] = {}  # path -> the descriptor holding its lock


def make(kind: str, parent: str | None = None) -> str:
    """A new directory `sandlot-<kind>-<pid>-*` (mode 0700), after removing those dead makers left."""
    parent = parent or tempfile.gettempdir()
    collect(kind, parent)
    path = tempfile.mkdtemp(prefix=f"sandlot-{kind}-{os.getpid()}-", dir=parent)
    _own[path] = dirlock.lock_shared(path)
    return path


def collect(kind: str, parent: str | None = None) -> list[str]:
    """Remove the directories of this kind whose maker is gone (pid in the name) and unlocked; what went."""
    parent = parent or tempfile.gettempdir()
    removed = []
    for path in glob.glob(os.path.join(parent, f"sandlot-{kind}-*-*")):
        try:
            info = os.lstat(path)
            owner = int(os.path.basename(path).removeprefix(f"sandlot-{kind}-").split("-", 1)[0])
        except (OSError, ValueError):
            continue  # not one of ours (an older release's names carry no pid: left alone)
        ours = stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid()
        if ours and not alive(owner) and dirlock.remove_if_unlocked(path):
            removed.append(path)
    return removed


def remove(path: str) -> None:
    """Remove one directory this process made (make), whatever it holds; links are not followed."""
    fd = _own.pop(path, -1)
    removal.remove_quietly(path)  # the runs' directories in it too, whatever modes a run left them
    if fd >= 0:
        os.close(fd)


def remove_own() -> None:
    """Remove every directory this process made and still has: at stop, and at exit."""
    for path in list(_own):
        remove(path)


def alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another uid's: alive
    return True


atexit.register(remove_own)
