"""V8 startup snapshots of the warmed-up wrapper: a fresh one for every zygote.

Why a snapshot: any V8 flag (the heap limit is one) makes node reject its
built-in code cache and compile its own modules again at every start, about
5 ms of CPU per run here. A snapshot built with the same flags carries that
work, and the wrapper's warm-up, already done.

Why a fresh one each time: when V8 loads a snapshot it normally draws a new
hash seed, derives the string-hash secrets from it (a search for primes) and
rehashes every table, another 4-5 ms per start. Loaded with
--no-rehash-snapshot it keeps the seed the snapshot was built with instead.
That seed must not be one known to everybody (node's own snapshot carries a
seed that is the same in every copy of the binary), so the build does rehash
(V8 draws a random seed when the building node starts) and every zygote gets
a snapshot of its own: the seed changes at every start and every
SANDLOT_ZYGOTE_MAX_FORKS runs. No run can read it: the file is not in the
tree; each jailed child gets a copy in its own /tmp, which the wrapper removes
before it reads the run (runner.py).

node refuses a snapshot built under other V8 flags than it is loaded with: the
header holds the build's v8.cachedDataVersionTag(). --rehash-snapshot only
decides what happens at load time, so the tag is rewritten to the one node
computes with --no-rehash-snapshot (the header layout is node's
SnapshotMetadata). Every snapshot is test-run before it is used; if the
rewritten one does not load, it is loaded as built (rehashing), and if that
fails too, runs start on the plain wrapper.
"""

from __future__ import annotations

import fcntl
import functools
import logging
import os
import shutil
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from runtimes.dirlock import remove_if_unlocked
from runtimes.jail import protocol

log = logging.getLogger("sandlot.nodejs")

MAGIC = 0x0143DA19  # node's SnapshotData::kMagic
NO_REHASH = "--no-rehash-snapshot"
_ENV = {"LANG": "C.UTF-8"}


def heap_flags(memory_mb: int) -> list[str]:
    return [f"--max-old-space-size={memory_mb}"]


@dataclass(frozen=True)
class Snapshot:
    path: str
    flags: tuple[str, ...]  # exactly what node must be started with to load it
    memory_mb: int


def build(node: str, wrapper: str, memory_mb: int, path: str) -> Snapshot | None:
    """A tested snapshot at path, or None if node cannot make one that loads."""
    built = heap_flags(memory_mb)
    scratch = f"{path}.tmp"
    command = [node, *built, "--snapshot-blob", scratch, "--build-snapshot", wrapper]
    result = subprocess.run(command, env=_ENV, cwd="/", capture_output=True, text=True, timeout=120)
    if result.returncode != 0 or not os.path.isfile(scratch):
        log.warning("node could not build a startup snapshot; runs start on the plain wrapper: %s", result.stderr)
        _unlink(scratch)
        return None
    os.chmod(scratch, 0o644)
    os.rename(scratch, path)
    no_rehash = [*built, NO_REHASH]
    if _retag(path, _tag(node, tuple(built)), _tag(node, tuple(no_rehash))):
        if _loads(node, no_rehash, path):
            return Snapshot(path, tuple(no_rehash), memory_mb)
        _retag(path, _tag(node, tuple(no_rehash)), _tag(node, tuple(built)))
    if _loads(node, built, path):
        log.warning("node loads its startup snapshot only with rehashing (slower starts)")
        return Snapshot(path, tuple(built), memory_mb)
    log.warning("node's startup snapshot does not run; runs start on the plain wrapper")
    _unlink(path)
    return None


@functools.lru_cache(maxsize=8)
def _tag(node: str, flags: tuple[str, ...]) -> int:
    """v8.cachedDataVersionTag() of node started with these flags (-1 if it cannot say)."""
    result = subprocess.run(
        [node, *flags, "-p", "v8.cachedDataVersionTag()"], env=_ENV, cwd="/", capture_output=True, text=True, timeout=60
    )
    try:
        return int(result.stdout)
    except ValueError:
        return -1


def _retag(path: str, old: int, new: int) -> bool:
    """Rewrite the header's tag from old to new; False if the header is not as expected."""
    if old < 0 or new < 0:
        return False
    with open(path, "r+b") as blob:
        header = blob.read(4096)
        offset = _tag_offset(header)
        if offset is None or struct.unpack_from("<I", header, offset)[0] != old:
            return False
        blob.seek(offset)
        blob.write(struct.pack("<I", new))
    return True


def _tag_offset(header: bytes) -> int | None:
    """Where SnapshotMetadata's tag is: magic, type byte, three length-prefixed strings, tag."""
    if len(header) < 5 or struct.unpack_from("<I", header)[0] != MAGIC:
        return None
    offset = 5
    for _ in range(3):  # node version, arch, platform
        if offset + 8 > len(header):
            return None
        (length,) = struct.unpack_from("<Q", header, offset)
        offset += 8 + length
    return offset if offset + 4 <= len(header) else None


def _loads(node: str, flags: list[str], path: str) -> bool:
    probe = protocol.run_input({"code": "console.log('sandlot snapshot ok')"}, "")
    try:
        result = subprocess.run(
            [node, *flags, "--snapshot-blob", path], input=probe, env=_ENV, cwd="/", capture_output=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        return False
    return result.returncode == 0 and result.stdout == b"sandlot snapshot ok\n"


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class SnapshotDirectory:
    """One instance's snapshots: `<data>/snapshots/<random>`, flock'ed while the instance lives.

    Several instances may share a data directory; at start, directories whose lock
    can be had belong to no live instance and are removed.
    """

    def __init__(self, root: str):
        self.root = Path(root)
        self.path = ""
        self._fd = -1
        self._serial = 0

    def open(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / ".lock", "a") as lock:  # no collecting while a directory is new and unlocked
            fcntl.flock(lock, fcntl.LOCK_EX)
            self._collect()
            self.path = tempfile.mkdtemp(dir=self.root)
            self._fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            fcntl.flock(self._fd, fcntl.LOCK_EX)

    def next_path(self) -> str:
        self._serial += 1
        return os.path.join(self.path, f"wrapper-{self._serial}.blob")

    def remove(self, path: str) -> None:
        if path and os.path.dirname(path) == self.path:
            _unlink(path)

    def close(self) -> None:
        if self._fd >= 0:
            shutil.rmtree(self.path, ignore_errors=True)
            os.close(self._fd)
            self._fd = -1

    def _collect(self) -> None:
        for entry in self.root.iterdir():
            if entry.name == ".lock":
                continue
            if entry.is_file():  # an older layout: one shared file per node and wrapper
                _unlink(str(entry))
            else:
                remove_if_unlocked(entry)  # left alone while its instance lives
