"""Where layers live, and their life: build into a scratch directory, rename into place, retire.

A layer directory is `<data>/layers/<language>/<key>-<serial>`: the key is a hash
of what it was built from (requirements or package.json, and the interpreter),
the serial tells rebuilds apart; the packages an operator asked for on top of
the sources (layers/packages.py) are part of the key too. A finished layer is
never written again; a new build goes next to it and the runtime switches over.
Builds are serialized.

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
import threading
import time
from collections.abc import Callable
from pathlib import Path

from runtimes.linux.dirlock import TRASH, lock_shared, remove_if_unlocked

log = logging.getLogger("sandlot.layers")

STALE_BUILD_SECONDS = 3600.0  # a build directory untouched this long, and unlocked, was left by a dead build


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
        build: Callable[[Path, Requested, Output], None],
        salt: str = "",
        requested: Callable[[], Requested] = lambda: None,
    ):
        """sources(): the files the layer is built from; requested(): the packages asked for on top of them (the
        ones the serving layer has); build(scratch, requested, on_output): fills scratch or raises
        LayerBuildError."""
        self.root = root
        self._sources = sources
        self._build = build
        self._salt = salt
        self._requested = requested
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
        if not self.root.is_dir():
            return None
        candidates = [p for p in self.root.iterdir() if p.name.startswith(key + "-") and _finished(p.name)]
        return max(candidates, key=_mtime, default=None)

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
        A half-built one must also be idle for a while: an instance of an older Sandlot builds unlocked."""
        for path in self.root.iterdir() if self.root.is_dir() else []:
            if str(path) in self._held:
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
            try:
                self._build(scratch, requested, on_output)
                make_readable(scratch)
                os.rename(scratch, target)  # the same directory: our lock stays on it
            except BaseException:
                os.close(held)
                shutil.rmtree(scratch, ignore_errors=True)
                raise
            self._held[str(target)] = held
            return str(target)

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


def _finished(name: str) -> bool:
    return ".build" not in name and TRASH not in name


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:  # removed by another instance since we listed it
        return 0.0


def make_readable(root: Path) -> None:
    """Runs use other uids: world-readable, owned by root, nothing writable but by root."""
    for dirpath, _dirnames, filenames in os.walk(root):
        _settle(dirpath, 0o755)
        for name in filenames:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                _settle(path, 0o755 if os.stat(path).st_mode & 0o111 else 0o644)


def _settle(path: str, mode: int) -> None:
    if os.geteuid() == 0:
        os.chown(path, 0, 0, follow_symlinks=False)
    os.chmod(path, mode)
