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

What node writes after the snapshot proper, its code cache of every built-in
module (2.5 of node 20's 4.2 MB), is dropped (`_drop_code_cache`): each node
started on the blob would copy it before running a line, and a run seldom
needs it. If node does not load the blob without it, the blob is used as built.

Baked (`python -m runtimes.nodejs.snapshot --bake`, a build step of the Node
image: infra/layout.sh): a snapshot built once in the image, for the first
zygote of a runtime function, so that a fresh environment's first run does not
wait for a build (about 300 ms of node starts). Its seed is the same in every
copy of the image, so it is never loaded with --no-rehash-snapshot: each node
started on it draws a seed of its own at load (4-5 ms more per run), and the seed
in the file is no run's. `baked()` hands it out only for the node binary, the
wrapper and the heap limit it was built for, and where node takes it: on the
build's CPU, or on another whose features give node's tag the blob's (V8's tag
covers the CPU: see cpu_features); zygotes after the first, and a first where
node would refuse it, build their own, as above.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import logging
import os
import re
import shutil
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from runtimes.jail import protocol
from runtimes.linux import rootfs
from runtimes.linux.dirlock import remove_if_unlocked
from runtimes.nodejs.node_start import WRAPPER, heap_flags

log = logging.getLogger("sandlot.nodejs")

MAGIC = 0x0143DA19  # node's SnapshotData::kMagic
NO_REHASH = "--no-rehash-snapshot"
_ENV = {"LANG": "C.UTF-8"}


@dataclass(frozen=True)
class Snapshot:
    path: str
    flags: tuple[str, ...]  # exactly what node must be started with to load it
    memory_mb: int


def build(
    node: str, wrapper: str, memory_mb: int, path: str, rehash: bool = False, cache_dir: str = ""
) -> Snapshot | None:
    """A tested snapshot at path, or None if node cannot make one that loads. rehash: loaded with rehashing
    (a seed of its own for every node started on it), never with the seed it was built with. cache_dir: where
    node's tags are kept (_tag)."""
    built = heap_flags(memory_mb)
    scratch = f"{path}.tmp"
    command = [node, *built, "--snapshot-blob", scratch, "--build-snapshot", wrapper]
    result = subprocess.run(command, env=_ENV, cwd="/", capture_output=True, text=True, timeout=120)
    if result.returncode != 0 or not os.path.isfile(scratch):
        log.warning("node could not build a startup snapshot; runs start on the plain wrapper: %s", result.stderr)
        _unlink(scratch)
        return None
    os.chmod(scratch, 0o644)
    whole = _drop_code_cache(scratch)  # the blob as built, if the code cache was dropped from it
    os.rename(scratch, path)
    made = _tested(node, built, memory_mb, path, rehash, cache_dir)
    if made is None and whole is not None:  # node did not take it without its code cache: as built, then
        with open(path, "wb") as blob:
            blob.write(whole)
        made = _tested(node, built, memory_mb, path, rehash, cache_dir)
    if made is None:
        log.warning("node's startup snapshot does not run; runs start on the plain wrapper")
        _unlink(path)
    return made


def _tested(
    node: str, built: list[str], memory_mb: int, path: str, rehash: bool, cache_dir: str = ""
) -> Snapshot | None:
    """The snapshot at path as it loads (retagged for loading without rehashing where asked and possible), or
    None if it does not run. The tags kept in cache_dir first; where the snapshot does not load with them, node's
    own answer (kept for the next start)."""
    no_rehash = [*built, NO_REHASH]
    tried = None
    for fresh in (False, True) if cache_dir else (True,):
        if rehash:
            break
        tags = _tag(node, tuple(built), cache_dir, fresh), _tag(node, tuple(no_rehash), cache_dir, fresh)
        if tags == tried:
            break  # node says what the cache said: no other tag to try
        tried = tags
        if _retag(path, *tags):
            if _loads(node, no_rehash, path):
                return Snapshot(path, tuple(no_rehash), memory_mb)
            _retag(path, tags[1], tags[0])
    if _loads(node, built, path):
        if not rehash:
            log.warning("node loads its startup snapshot only with rehashing (slower starts)")
        return Snapshot(path, tuple(built), memory_mb)
    return None


TAGS_CACHE = "node-tags.json"  # in the data dir: node's tags by its identity, its flags and the CPU's features


def _tag(node: str, flags: tuple[str, ...], cache_dir: str = "", fresh: bool = False) -> int:
    """v8.cachedDataVersionTag() of node started with these flags (-1 if it cannot say): V8 makes it of its
    version, its flags and the CPU's features. Asked of node once; with cache_dir, kept there under the node
    binary's identity, the flags and the CPU's features, so that a start does not wait for two node starts.
    fresh: node's own answer, not the one kept."""
    cpu = cpu_features()
    cache_dir = cache_dir if cpu is not None else ""  # a CPU that does not say: node's own answer, never kept
    key = f"{rootfs.file_key([os.path.realpath(node)])}:{' '.join(flags)}:{cpu}"
    if cache_dir and not fresh:
        known = rootfs.cached(cache_dir, TAGS_CACHE, key)
        if type(known) is int and known >= 0:
            return known
    tag = _asked_tag(node, flags)
    if cache_dir and tag >= 0:
        rootfs.store(cache_dir, TAGS_CACHE, key, tag)
    return tag


@functools.lru_cache(maxsize=8)
def _asked_tag(node: str, flags: tuple[str, ...]) -> int:
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


def _drop_code_cache(path: str) -> bytes | None:
    """Rewrite the blob at path without node's code cache of its built-in modules; the blob as it was, or None
    if it was left alone (not a layout this reads, or no cache in it).

    The blob (node's SnapshotData) ends with that cache: a count, then per module its id and its cache (a length
    and the bytes each), 2.5 MB of node 20's 4.2 MB. Every node started on the blob copies it, page by page, before
    it runs a line, about 3 ms of CPU, and a run seldom uses it: the modules the wrapper loaded are in the snapshot
    already, compiled, and a module loaded later compiles only what it runs (less than reading its cache costs,
    as measured with `require('http')`, `crypto`, `net`, `dns`, `fetch`, `vm` and a worker; see
    docs/benchmarks.md). What precedes it (the header, V8's own snapshot, node's state) is kept byte for byte,
    and the count becomes 0, as in a blob built without a cache."""
    with open(path, "rb") as blob:
        data = blob.read()
    header = _tag_offset(data[:4096])
    if header is None or header + 12 > len(data):
        return None
    (v8_size,) = struct.unpack_from("<i", data, header + 8)  # after the tag: node's flags, then V8's blob
    start = _code_cache_start(data, header + 12 + max(v8_size, 0))
    if start is None or struct.unpack_from("<Q", data, start)[0] == 0:
        return None
    with open(path, "wb") as blob:
        blob.write(data[:start] + struct.pack("<Q", 0))
    return data


_MODULE_ID = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_/-.:")
# where a count (below 2**32) may start, followed by its first entry's id: a length below 256, then a letter
_FIRST_ENTRY = re.compile(rb"(?=[\x00-\xff]{3}[\x00-\xff]\x00{4}[\x01-\xff]\x00{7}[A-Za-z_])")


def _code_cache_start(data: bytes, after: int) -> int | None:
    """Where the code cache's count is: the first offset from `after` whose count of (id, cache) entries, each id a
    module's name, ends exactly at the blob's end (node's state before it is not parsed here)."""
    end = len(data)
    for found in _FIRST_ENTRY.finditer(data, after):
        start = found.start()
        (count,) = struct.unpack_from("<Q", data, start)
        offset = start + 8
        for _ in range(count):
            if offset + 8 > end:
                break
            (length,) = struct.unpack_from("<Q", data, offset)
            name = data[offset + 8 : offset + 8 + length]
            if not 0 < length <= 256 or len(name) != length or not _MODULE_ID.issuperset(name):
                break
            offset += 8 + length
            if offset + 8 > end:
                break
            (size,) = struct.unpack_from("<Q", data, offset)
            offset += 8 + size
            if offset > end:
                break
        else:
            if offset == end:
                return start
    return None


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


BAKED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "baked")  # in the image: read-only
_BAKED_BLOB = "wrapper.blob"
_BAKED_META = "snapshot.json"


def _identity(node: str, wrapper: str, memory_mb: int) -> dict:
    """What a baked snapshot was built for: the node binary (path, size, mtime), the wrapper, the heap limit and
    the CPU's features."""
    node = os.path.realpath(node)
    found = os.stat(node)
    with open(wrapper, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    return {
        "node": node,
        "node_size": found.st_size,
        "node_mtime_ns": found.st_mtime_ns,
        "wrapper_sha256": digest,
        "memory_mb": memory_mb,
        "cpu": cpu_features(),
    }


@functools.lru_cache(maxsize=1)
def cpu_features() -> str | None:
    """The machine and its first processor's feature flags as /proc/cpuinfo lists them (x86's `flags`, arm64's
    `Features`), or None if it does not say.

    The snapshot's tag is V8's cachedDataVersionTag, which covers the CPU features V8 detects: node refuses (exit
    14, the run lost) a snapshot baked on a CPU with other features, as an arm64 image built under qemu-user's
    `max` CPU and started on a Cortex-A72 was. Where they differ from the build's (or the CPU does not say),
    node's own tag decides (baked: one node start)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return f"{os.uname().machine}: {' '.join(sorted(value.split()))}"
                if not line.strip():  # the first processor's block ends
                    break
    except OSError:
        pass
    return None


def bake(node: str, wrapper: str, memory_mb: int, directory: str = BAKED_DIR) -> Snapshot | None:
    """Build time: a snapshot loaded with rehashing, and what it was built for, in directory."""
    os.makedirs(directory, exist_ok=True)
    built = build(node, wrapper, memory_mb, os.path.join(directory, _BAKED_BLOB), rehash=True)
    if built is not None:
        meta = {"identity": _identity(node, wrapper, memory_mb), "flags": list(built.flags)}
        with open(os.path.join(directory, _BAKED_META), "w") as f:
            json.dump(meta, f)
    return built


def baked(node: str, wrapper: str, memory_mb: int, directory: str = BAKED_DIR) -> Snapshot | None:
    """The image's baked snapshot, if it was built for this node, wrapper, heap limit and CPU (else None)."""
    try:
        with open(os.path.join(directory, _BAKED_META)) as f:
            meta = json.load(f)
        identity, recorded = _identity(node, wrapper, memory_mb), meta.get("identity") or {}
        if {**recorded, "cpu": None} != {**identity, "cpu": None}:
            return None
    except (OSError, ValueError, TypeError):
        return None
    flags = tuple(meta.get("flags") or ())
    path = os.path.join(directory, _BAKED_BLOB)
    if NO_REHASH in flags or not os.path.isfile(path):
        return None  # its seed is in every copy of the image: never loaded as built
    if (identity["cpu"] is None or recorded.get("cpu") != identity["cpu"]) and not _loads_here(node, flags, path):
        return None
    return Snapshot(path, flags, memory_mb)


def _loads_here(node: str, flags: tuple[str, ...], path: str) -> bool:
    """On another CPU than the build's (or one that does not say), whether node takes the blob: the tag node
    computes here with these flags is the blob's (one node start, a sixth of a build's)."""
    try:
        with open(path, "rb") as blob:
            header = blob.read(4096)
    except OSError:
        return False
    offset = _tag_offset(header)
    return offset is not None and struct.unpack_from("<I", header, offset)[0] == _tag(node, flags)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="bake a startup snapshot into the image (a build step)")
    parser.add_argument("--bake", action="store_true", required=True)
    parser.add_argument("--node", default=os.environ.get("NODEJS_PATH", "/usr/bin/node"))
    parser.add_argument("--memory-mb", type=int, default=int(os.environ.get("SANDLOT_MEMORY_LIMIT_MB", "512")))
    parser.add_argument("--directory", default=BAKED_DIR)
    args = parser.parse_args(argv)
    made = bake(args.node, WRAPPER, args.memory_mb, args.directory)
    print(f"baked {made.path} ({' '.join(made.flags)})" if made else "no snapshot baked: node could not make one")
    return 0


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


if __name__ == "__main__":
    raise SystemExit(main())
