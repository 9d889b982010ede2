"""Where layers live, and their life: build into a scratch directory, rename into place, retire.

A layer directory is `<data>/layers/<language>/<key>-<serial>`: the key is a hash
of what it was built from (requirements or package.json, and the interpreter),
the serial tells rebuilds apart; the packages an operator asked for on top of
the sources (layers/packages.py) are part of the key too. A finished layer is
never written again; a new build goes next to it and the runtime switches over.
Builds are serialized.

An image may carry layers built when it was built (the service image's Dockerfile: IMAGE_LAYERS), in a
read-only store of the same form: a layer for the current key found there is served as it is, and a new
volume needs no package index for the defaults. Anything else (an operator's additions, other sources) is
built into the data directory as always.

Where the build's uid cannot reach the store (a data volume whose root is closed to others, as
`install -d -m 0770` gives, and a build that runs as that uid on the container's own files: the chroot mode),
the build runs in a staging directory of its own under the temporary directory, and its result is copied in.

Several instances may share a data directory: each holds a shared flock on every
layer it uses, from the moment it starts building it (the scratch directory is
locked before the build and renamed into place with the lock held), and a layer,
finished or not, is removed only when an exclusive lock can be had, that is when
no instance uses or builds it any more (runtimes/linux/dirlock.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from runtimes.linux.dirlock import TRASH, lock_shared, remove_if_unlocked

log = logging.getLogger("sandlot.layers")

SETTLE_SECONDS = 10.0  # a new layer's page cache is dropped this long after it is in place (drop_cached)
ASIDE = ".build-aside"  # beside a layer being built: the service's own directory for it (LayerStore's build)
STALE_BUILD_SECONDS = 3600.0  # a build directory untouched this long, and unlocked, was left by a dead build
IMAGE_LAYERS = "/opt/sandlot/image-layers"  # the service image's layers, one store per language folder (Dockerfile)


def image_layers(folder: str) -> Path:
    """The read-only store of the layers the image carries for a language (may not exist)."""
    return Path(IMAGE_LAYERS) / folder


class LayerBuildError(RuntimeError):
    pass


def what_went_wrong(output: bytes, limit: int = 4000) -> str:
    """The part of a build tool's output that says why it failed: its error lines (pip's `ERROR: ...`, npm's
    `npm error ...`), else its last lines. The whole output is in the build's log."""
    lines = [line.rstrip() for line in output.decode(errors="replace").splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    return "\n".join((errors or lines)[-20:])[-limit:].strip()


Requested = list[str] | dict[str, str] | None  # pip requirement lines, or npm name -> range
Output = Callable[[bytes], None] | None  # a build's output, line by line, as it comes


class LayerStore:
    def __init__(
        self,
        root: Path,
        sources: Callable[[], list[Path]],
        build: Callable[[Path, Requested, Output, Path], None],
        salt: str = "",
        requested: Callable[[], Requested] = lambda: None,
        baked: Path | None = None,
        build_uid: Callable[[], int | None] = lambda: None,
        finish: Callable[[Path], None] | None = None,
    ):
        """sources(): the files the layer is built from; requested(): the packages asked for on top of them (the
        ones the serving layer has); build(scratch, requested, on_output, aside): fills scratch or raises
        LayerBuildError; aside is a directory of the service's own (root's, 0700) on the layer's filesystem, for
        what the service itself prepares beside the build (a seeded build's copy of the image's layer, moved into
        the layer at finish), removed once the layer is in place or the build failed. baked: a read-only store of
        layers built with the image, used as they are when their key is the current one. build_uid(): the uid the
        build runs as when the service is root (staging, above).
        finish(layer): what the service itself does to a built layer, once it is root's and read-only to others
        and before it is renamed into place (Python's: its bytecode, which runs cannot write)."""
        self.root = root
        self.baked = baked
        self._build_uid = build_uid
        self._sources = sources
        self._build = build
        self._salt = salt
        self._requested = requested
        self._finish = finish
        self.settling: threading.Thread | None = None  # the last build's page cache, being dropped
        self._lock = threading.Lock()  # builds run in threads; one at a time
        self._held: dict[str, int] = {}  # layer path -> directory fd holding our shared lock
        self.current = ""

    def key(self, requested: Requested = None) -> str:
        """What the layer is built from, hashed: the sources, and the requested packages (the serving layer's
        when not given). Without requested packages the key is what it always was."""
        requested = self._requested() if requested is None else requested
        digest = hashlib.sha256(self._salt.encode())
        for path in self._sources():
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
        if requested:
            digest.update(b"\0requested\0" + json.dumps(requested, sort_keys=True).encode())
        return digest.hexdigest()[:16]

    def existing(self) -> Path | None:
        """The newest finished layer built from the current sources and requested packages, if any."""
        key = self.key()
        for root in (self.root, self.baked):
            if root is None or not root.is_dir():
                continue
            candidates = [p for p in root.iterdir() if p.name.startswith(key + "-") and _finished(p.name)]
            if candidates:
                return max(candidates, key=_mtime)
        return None

    def seed(self, requested: Requested = None) -> Path | None:
        """The layer the image carries that a build of another key may start from (the newest finished one of
        its store: its distributions count as installed, runtimes/python/seeding.py); None without one."""
        if self.baked is None or not self.baked.is_dir():
            return None
        key = self.key(requested)
        layers = [p for p in self.baked.iterdir() if _finished(p.name) and p.is_dir()]
        if any(p.name.startswith(key + "-") for p in layers):
            return None  # the image's own key: served as it is (existing), or rebuilt as it was built
        return max(layers, key=_mtime, default=None)

    def ensure(self) -> str:
        """A layer for the current sources: an existing one, or a new build. Collects unused ones."""
        while True:
            found = self.existing()
            if found is None:
                self.current = self.rebuild()  # held from the start of its build
                break
            try:
                self.use(str(found))
            except FileNotFoundError:  # dirlock.Gone too
                continue  # another instance removed it just now: look again
            self.current = str(found)
            break
        self.collect()
        return self.current

    def use(self, path: str) -> None:
        """Say (with a shared lock) that this instance runs on path: nobody removes it meanwhile.
        Raises Gone if another instance was removing it."""
        if path in self._held:
            return
        self._held[path] = lock_shared(path)

    def collect(self) -> None:
        """Remove every layer, finished or left half-built by a dead build, that no instance uses or builds.
        A half-built one must also be idle for a while: an instance of an older Sandlot builds unlocked. A build's
        aside directory goes once its scratch is unlocked or gone (its build, which locked it, is over or dead)."""
        for path in self.root.iterdir() if self.root.is_dir() else []:
            if str(path) in self._held:
                continue
            if path.name.endswith(ASIDE):  # its build holds a lock on its scratch (every build that makes one does)
                scratch = str(path)[: -len(ASIDE)] + ".build"  # unlocked, or gone: the build is over, or was killed
                if not os.path.lexists(scratch) or remove_if_unlocked(scratch):
                    remove_if_unlocked(path)
                continue
            if ".build" in path.name and time.time() - _mtime(path) < STALE_BUILD_SECONDS:
                continue
            self._remove_if_unused(str(path))

    def rebuild(self, requested: Requested = None, on_output: Output = None) -> str:
        """Build a new layer directory from the sources and requested packages (the serving layer's when not
        given); the old one stays until retired."""
        with self._lock:
            requested = self._requested() if requested is None else requested
            self.root.mkdir(parents=True, exist_ok=True)
            os.chmod(self.root, 0o755)
            target = self.root / f"{self.key(requested)}-{time.time_ns()}"
            scratch = target.with_name(target.name + ".build")
            shutil.rmtree(scratch, ignore_errors=True)
            scratch.mkdir(mode=0o755)
            held = lock_shared(scratch)  # no other instance's collect() removes it, built or not
            aside = target.with_name(target.name + ASIDE)  # a build's name: young, no instance's collect() takes it
            staging = None
            try:
                aside.mkdir(mode=0o700)
                staging = self._staging()
                if staging is None:
                    self._build(scratch, requested, on_output, aside)
                    make_readable(scratch)
                else:  # built where the build's uid can reach, then copied in by the service
                    self._build(staging, requested, on_output, aside)
                    make_readable(staging)
                    shutil.copytree(staging, scratch, symlinks=True, dirs_exist_ok=True)
                    os.chmod(scratch, 0o755)
                if self._finish is not None:
                    self._finish(scratch)
                os.rename(scratch, target)  # the same directory: our lock stays on it
                # once the runtime's start has read it (a tree's copy, a zygote's imports) from the cache
                self.settling = threading.Timer(SETTLE_SECONDS, drop_cached, (target,), {"written": True})
                self.settling.daemon = True
                self.settling.start()
            except BaseException:
                os.close(held)
                shutil.rmtree(scratch, ignore_errors=True)
                raise
            finally:
                shutil.rmtree(aside, ignore_errors=True)
                if staging is not None:
                    shutil.rmtree(staging, ignore_errors=True)
            self._held[str(target)] = held
            return str(target)

    def _staging(self) -> Path | None:
        """A directory of the build's own outside the store when the build's uid could not reach the store (root
        runs the build as another uid, without a tree of its own where the store is bound in), else None."""
        uid = self._build_uid() if os.geteuid() == 0 else None
        if uid is None or reachable(self.root, uid):
            return None
        staging = Path(tempfile.mkdtemp(prefix="sandlot-layer-build-"))
        os.chmod(staging, 0o755)
        log.info("the build's uid %d cannot reach %s: building in %s, then copying in", uid, self.root, staging)
        return staging

    def retire(self, path: str) -> None:
        """This instance is done with a layer (never the current one): remove it unless another uses it."""
        if not path or path == self.current or Path(path).parent != self.root:
            return
        fd = self._held.pop(path, None)
        if fd is not None:
            os.close(fd)  # our shared lock goes with it
        self._remove_if_unused(path)

    def _remove_if_unused(self, path: str) -> None:
        # another instance may run on it: whoever retires it last removes it
        if remove_if_unlocked(path):
            log.info("removed unused layer %s", path)


def drop_cached(root: str | Path, written: bool = False) -> int:
    """Drop the page cache's copy of the files under root (posix_fadvise DONTNEED: only clean pages no process
    maps go, so a file in use keeps its pages, and what is read later is read again from the disk); how many
    files were told. written: the files were just written (a new layer): their filesystem is flushed first
    (syncfs, one call; else each file's fsync), as dirty pages would stay.

    A layer build leaves the cache it fills charged to the service's cgroup: what it wrote (the layer, read by
    runs' zygotes once, if at all, then held by no process) and what its tool read for the first time (pip's
    or npm's own files). In a container with a memory limit that is memory the service is charged at rest; on
    a plain host it is cache given back."""
    root = str(root)
    each = written and not _syncfs(root)
    told = 0
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            try:
                fd = os.open(os.path.join(dirpath, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError:
                continue  # a symlink, or gone since
            try:
                if each:
                    os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                told += 1
            except OSError:
                pass
            finally:
                os.close(fd)
    return told


def _syncfs(path: str) -> bool:
    """syncfs(2) on path's filesystem (runtimes/linux/syscalls.py; Python's os has none); whether it was done."""
    from runtimes.linux import syscalls  # (ctypes: not at import, which the API's Lambda function does)

    try:
        syscalls.syncfs(path)
    except (OSError, AttributeError):
        return False
    return True


def _finished(name: str) -> bool:
    return ".build" not in name and TRASH not in name


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:  # removed by another instance since we listed it
        return 0.0


def reachable(path: Path, uid: int) -> bool:
    """Whether uid, with no groups, may pass through every directory down to path."""
    path = Path(os.path.realpath(path))
    for directory in [*reversed(path.parents), path]:
        info = os.stat(directory)
        if not info.st_mode & (stat.S_IXUSR if info.st_uid == uid else stat.S_IXOTH):
            return False
    return True


def make_readable(root: Path) -> None:
    """Runs use other uids: world-readable, owned by root, nothing writable but by root. A file with another name
    elsewhere (a hard link the build made, where fs.protected_hardlinks lets any uid link any file) fails the
    build: its owner and mode would be changed for that other name too, and root would write through it."""
    for dirpath, _dirnames, filenames in os.walk(root):
        _settle(dirpath, 0o755)
        for name in filenames:
            path = os.path.join(dirpath, name)
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                continue
            if info.st_nlink > 1:
                raise LayerBuildError(
                    f"the build left {os.path.relpath(path, root)} with {info.st_nlink} names (a hard link): refused"
                )
            _settle(path, 0o755 if info.st_mode & 0o111 else 0o644)


def _settle(path: str, mode: int) -> None:
    if os.geteuid() == 0:
        os.chown(path, 0, 0, follow_symlinks=False)
    os.chmod(path, mode)
