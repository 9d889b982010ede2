"""Trees materialized as directories, for the chroot mode: built once, off the request path, then reused.

Where nothing can be mounted (a container on default privileges), a run's read-only
root is a real directory that the zygote chroots into (materialized.materialize). Building one
costs a walk and a hard link per file (a copy where a link is not allowed or not
possible), so it is built once per tree spec, before any zygote needs it, and kept:

- `<data dir>/trees/<key>`: the key hashes the spec (the layer's path among it), how
  devices are made, and every source file's type, size, mode, owner and mtime. A
  restart reuses a finished tree; a changed interpreter, certificate bundle or layer
  gives another key, so a stale tree is never served.
- Built as `<key>.build-<ns>` and renamed into place when complete: a tree is never
  seen half-built, by this instance or another.
- The data directory, not /tmp: the layers live there, and hard links need the same
  filesystem; it survives restarts (a restart need not build again); runs never see it.
  Except in the service image (the Dockerfile makes IMAGE_TREES): there the system files
  (the interpreters, their libraries: some 160 MB against a few MB of layer) are most of a
  tree, and the data dir is a volume; the trees go on the image's own filesystem instead,
  nothing of them on the volume. There (overlayfs: a link copies a lower file up, every
  byte read and written) and on any other filesystem than the sources' every file is a
  copy, and the page cache the build filled is dropped (TreeStore.uncache): the container
  is charged for what runs read back, not for 160 MB of copying (a copy-up's pages of the
  lower file could not be: the path names the copy from then on).
- Held like layers (runtimes/linux/dirlock.py): a shared flock per instance that uses a tree;
  a tree is removed only when no instance holds it (collect()).
- Each run has a literal /tmp of its own: a run of uid chroots (from its zygote's tree)
  into the uid's cell, `cells/<uid>` (materialized.make_cell: the tree's directories made again,
  its files hard links, made at the uid's first run and kept), whose `tmp` is 0700 and
  the uid's, made fresh for each run (runtimes/jail/tmp/caps.py caps its size and file
  count). The instance that made it holds a lock on it while its run lives; one that no
  live instance holds was left by a killed instance, and goes when a zygote next starts
  on the tree (clear_stale_run_tmps), or when the uid is next given out.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import stat
import sys
import threading
import time

from runtimes.jail.policy import tree_files
from runtimes.jail.trees import image_trees, materialized
from runtimes.jail.trees.materialized import fingerprint as fingerprint  # re-exported: bench/trees.py
from runtimes.linux import removal
from runtimes.linux.dirlock import TRASH, lock_shared, remove_if_unlocked
from runtimes.linux.removal import remove_tree as remove_tree  # re-exported: runs' /tmp directories, trees

log = logging.getLogger("sandlot.trees")

STALE_BUILD_SECONDS = 3600.0  # a half-built tree untouched this long, and unlocked, was left by a dead build

# One tree built at a time, whichever language: side by side (threads of one process, one disk) each would take as
# long as both. The first language's (the default, Python: a store opened with first=True) goes first: the other
# stores' builds wait until it has its first tree (or FIRST_WAIT_SECONDS), so that the first Python run does not
# wait for the Node.js tree's copy of node (whose runtime asks a little earlier: its tree's spec is quicker made).
_building = threading.Lock()
_first_turn = threading.Condition()
_first_pending = 0  # stores opened with first=True that have not got their first tree yet
FIRST_WAIT_SECONDS = 10.0  # at most: a first store that never builds (its runtime failed) holds no one up for long


IMAGE_TREES = "/var/cache/sandlot"  # made by the service image's Dockerfile, on the image's own filesystem


def trees_dir(data_dir: str) -> str:
    """Where the trees go: IMAGE_TREES/trees where the image made that directory (root's, writable) and the
    data dir is another filesystem (a volume), else <data dir>/trees."""
    try:
        image = os.stat(IMAGE_TREES)
        data = os.stat(data_dir)
    except OSError:
        return os.path.join(data_dir, "trees")
    if stat.S_ISDIR(image.st_mode) and os.access(IMAGE_TREES, os.W_OK) and image.st_dev != data.st_dev:
        return os.path.join(IMAGE_TREES, "trees")
    return os.path.join(data_dir, "trees")


class TreeUnusable(RuntimeError):
    """Trees cannot be materialized here (e.g. a noexec filesystem): the chroot mode cannot serve."""


def devices_work(directory: str) -> str:
    """ "" if a device node made in directory can be opened here (CAP_MKNOD, no nodev, a device cgroup that
    lets null through), else why not."""
    # a name of this call's own: each runtime of a service opens its store at once, from threads of one process
    path = os.path.join(directory, f".sandlot-null-{os.getpid()}-{threading.get_ident()}")
    try:
        os.mknod(path, stat.S_IFCHR | 0o600, os.stat("/dev/null").st_rdev)
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        os.close(fd)
        return ""
    except OSError as exc:
        return f"a device node cannot be {'opened' if os.path.lexists(path) else 'made'} in {directory}: {exc}"
    finally:
        if os.path.lexists(path):
            os.unlink(path)


class TreeStore:
    """The materialized trees of one instance, under root (`<data dir>/trees`)."""

    def __init__(self, root: str, first: bool = False, image_dir: str = image_trees.IMAGE_TREES):
        self.root = root
        self.image_dir = image_dir  # the image's trees (image_trees.py), taken before any is built here
        self._pending_first = False
        os.makedirs(root, mode=0o755, exist_ok=True)
        os.chmod(root, 0o755)
        if os.statvfs(root).f_flag & os.ST_NOEXEC:
            raise TreeUnusable(
                f"{root} is on a noexec filesystem: the interpreters and native libraries of a tree must run "
                "from it (SANDLOT_DATA_DIR)"
            )
        self.no_devices = devices_work(root)  # why stand-ins are used for /dev ("" when real nodes are made)
        # a container's own filesystem (overlayfs), or another one than the interpreter's: a build reads and
        # writes whole files, whose pages, charged to the container, are dropped (materialized.materialize)
        self.uncache = materialized.fills_cache(root, sys.executable)
        if self.no_devices:
            log.warning("trees get stand-ins for /dev (a read-only empty null, no zero or random): %s", self.no_devices)
        self._lock = threading.Lock()
        self._held: dict[str, tuple[int, int]] = {}  # tree path -> (directory fd holding our shared lock, users)
        self._first = first
        if first:
            global _first_pending
            with _first_turn:
                _first_pending += 1
                self._pending_first = True

    @property
    def device_nodes(self) -> bool:
        return not self.no_devices

    def ensure(self, spec: dict, base: dict | None = None) -> str:
        """A finished tree for spec, built now if there is none; held until release() (once per ensure()).
        base: spec's layer-less spec (the runtime's tree(layer=False)): where the image has no tree of spec's but
        one of base's, that one with spec's layer added (image_trees.additions)."""
        try:
            return self._ensure(spec, base)
        finally:
            self._first_done()

    def _first_done(self) -> None:
        global _first_pending
        if self._pending_first:
            with _first_turn:
                _first_pending -= 1
                self._pending_first = False
                _first_turn.notify_all()

    def _ensure(self, spec: dict, base: dict | None = None) -> str:
        key = fingerprint(spec, self.device_nodes)
        path = os.path.join(self.root, key)
        with self._lock:
            if path in self._held:
                fd, users = self._held[path]
                self._held[path] = (fd, users + 1)
                return path
            image = self._image_tree(spec, base)
            if image:
                return image
            while True:
                try:
                    fd = lock_shared(path)
                    break
                except FileNotFoundError:  # none yet, or another instance was removing it (Gone)
                    self._build(spec, path)
            self._held[path] = (fd, 1)
        return path

    def _image_tree(self, spec: dict, base: dict | None = None) -> str:
        """The image's tree for spec, taken (image_trees.take), "" if the image has none. Held like a tree of
        this store's, but never removed. Where the image has none of spec's own, its tree of base (the layer-less
        spec), with what spec adds to base added to it, if spec only adds (image_trees.additions)."""
        path = image_trees.find(spec, self.image_dir)
        added = None
        if not path and base is not None:
            added = image_trees.additions(spec, base)
            if added is not None:
                path = image_trees.find(base, self.image_dir)
        if not path:
            return ""
        if path in self._held:
            if not image_trees.holds_alike(path, spec, added):
                return ""  # its zygotes' runs have other generated files or another layer: a tree of this store's
            fd, users = self._held[path]
            self._held[path] = (fd, users + 1)
            return path
        try:
            fd = image_trees.take(path, spec, self.device_nodes, added, uncache=self.uncache)
        except OSError as exc:  # a read-only root filesystem (readOnlyRootFilesystem): a tree of this store's
            log.warning("the image's tree %s cannot be used here: %s", path, exc)
            return ""
        if fd is None:
            log.warning(
                "the image's tree %s is held by another instance with other generated files or another layer: not used",
                path,
            )
            return ""
        self._held[path] = (fd, 1)
        log.info("tree %s: the image's own, with its cells%s", path, " and the layer added" if added else "")
        return path

    def _build(self, spec: dict, path: str) -> None:
        if not self._first:
            with _first_turn:
                _first_turn.wait_for(lambda: _first_pending == 0, timeout=FIRST_WAIT_SECONDS)
        with _building:
            if os.path.isdir(path):
                return  # another store of this process built it while this one waited
            self._build_now(spec, path)

    def _build_now(self, spec: dict, path: str) -> None:
        scratch = f"{path}.build-{time.time_ns()}"
        os.mkdir(scratch, 0o700)  # nobody looks in while it is built; materialize() opens it up at the end
        held = lock_shared(scratch)  # another instance's collect() leaves it alone
        try:
            started = time.monotonic()
            done = materialized.materialize(spec, scratch, self.device_nodes, uncache=self.uncache)
            os.sync()  # a tree that a power cut left with empty copies must never be found finished
            if self.uncache:
                materialized.drop_cache(scratch)  # written back now: clean pages, which runs read back as they need
            try:
                os.rename(scratch, path)
            except OSError as exc:
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
                shutil.rmtree(scratch, ignore_errors=True)  # another instance finished the same tree first
                return
            log.info(
                "tree %s built in %.2f s: %d files linked, %d copied (%d bytes), devices: %s",
                path,
                time.monotonic() - started,
                done.linked,
                done.copied,
                done.copied_bytes,
                done.devices,
            )
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise
        finally:
            os.close(held)

    def release(self, path: str) -> None:
        """One user of path (a zygote) is gone; when none is left the tree is removed unless another instance
        holds it."""
        with self._lock:
            if path not in self._held:
                return
            fd, users = self._held[path]
            if users > 1:
                self._held[path] = (fd, users - 1)
                return
            del self._held[path]
            os.close(fd)
        if image_trees.is_image_tree(path):
            return  # the image's: it stays
        if remove_if_unlocked(path, remove=_remove_quietly):
            log.info("removed unused tree %s", path)

    def collect(self) -> None:
        """Remove every tree, finished or left half-built by a dead build, that no instance holds."""
        for name in os.listdir(self.root):
            path = os.path.join(self.root, name)
            if path in self._held:
                continue
            building = ".build-" in name and TRASH not in name
            if building and time.time() - _mtime(path) < STALE_BUILD_SECONDS:
                continue
            if remove_if_unlocked(path, remove=_remove_quietly):
                log.info("removed unused tree %s", path)

    def held(self) -> list[str]:
        """The trees this store holds now."""
        with self._lock:
            return list(self._held)

    def close(self) -> None:
        self._first_done()
        with self._lock:
            for fd, _users in self._held.values():
                os.close(fd)
            self._held.clear()


def _remove_quietly(path: str) -> None:
    try:
        remove_tree(path)
    except OSError as exc:
        log.warning("could not remove %s: %s", path, exc)


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except FileNotFoundError:
        return 0.0


def fill_slots(tree_root: str) -> int:
    """An image tree's slots that lack what was added to it get it now (image_trees.fill_slots); nothing for any
    other tree. One cell made at a time, as make_cells does."""
    if not image_trees.is_image_tree(tree_root):
        return 0
    with _making_cells, _cells_lock:
        return image_trees.fill_slots(tree_root)


def forget_pages(tree_root: str) -> int:
    """Drop the page cache of a tree's files that no process maps (its cells' files are the same inodes, and
    are not walked, nor an image tree's slots); how many files were told. Only on a container's own filesystem
    (TreeStore.uncache): a tree of copies of its own, or the image's tree, whose files are the image's (as the
    image's node is in the other modes: provisions.py). Elsewhere the pages of a tree of hard links are the host's
    files' too."""
    return materialized.drop_cache(tree_root, skipped=(tree_root + tree_files.CELLS, tree_root + image_trees.SLOTS))


# ---- each run's own /tmp in a tree ------------------------------------------------------------------------


# One cell made at a time: the children spawned at a start each need one, and made side by side (threads, one
# GIL) every one of them, the first run's among them, would be ready only when the last is.
_making_cells = threading.Lock()
# Held while a cell is found and its run's /tmp made in it, and while idle cells are retired (retire_idle_cells):
# a cell is never taken away between the two.
_cells_lock = threading.Lock()


def make_cells(tree_root: str, uids: list[int]) -> None:
    """The cells of the uids the next runs will have, made ahead (while their zygote starts, beside it)."""
    image = image_trees.is_image_tree(tree_root)
    for uid in uids:
        if not os.path.isdir(tree_root + tree_files.cell(uid)):
            with _making_cells:
                if image:  # a slot of the image's, if one is free (image_trees.assign_slot)
                    with _cells_lock:
                        if os.path.isdir(tree_root + tree_files.cell(uid)) or image_trees.assign_slot(tree_root, uid):
                            continue
                materialized.make_cell(tree_root, uid)


def run_tmp(tree_root: str, uid: int) -> str:
    """The host path of the /tmp of uid's run in that tree: its cell's (materialized.make_cell), seen as /tmp."""
    return tree_root + tree_files.cell(uid) + "/tmp"


def make_run_tmp(tree_root: str, uid: int) -> str:
    """A fresh, empty /tmp for uid's next run, in its cell (made now if the uid has none yet): 0700, the
    uid's own. What a run of this uid left there (a killed instance's) goes first, without following
    anything planted in it."""
    for _ in range(3):
        make_cells(tree_root, [uid])
        with _cells_lock:
            if image_trees.is_image_tree(tree_root):
                image_trees.adopt_slot(tree_root, uid)  # a slot a gone instance gave this uid: this one's now
            if not os.path.isdir(tree_root + tree_files.cell(uid)):
                continue  # retired as idle between the two (retire_idle_cells), or a slot given away: made again
            path = run_tmp(tree_root, uid)
            remove_run_tmp(tree_root, uid)
            materialized.renew_devices(tree_root + tree_files.cell(uid))
            os.mkdir(path, 0o700)
            os.chown(path, uid, uid)
            return path
    raise OSError(errno.EAGAIN, f"the cell of uid {uid} in {tree_root} kept going as it was made")


def retire_idle_cells(tree_root: str, own: range, kept: frozenset[int] = frozenset()) -> list[int]:
    """Remove the cells of the caller's uids (own) that hold no /tmp: no child of those uids, ready or running,
    is in them. Kept, each cell holds the tree's directories again and a name per file (for the Python tree some
    3,500 names and 400 directories: about 4 MB of the kernel's dentries and inodes and of directory blocks,
    charged to the container, none of it reclaimed at rest); a busy spell leaves one per uid it used. At rest only
    the ready children's stay, and those of kept (the next uids to be given out: the next run's child, made on
    demand, finds its cell); a uid's next run makes its cell again (tens of ms, as its first did, off the event
    loop). The uids whose cells went."""
    parent = tree_root + tree_files.CELLS
    retired: list[tuple[int, str]] = []
    with _making_cells, _cells_lock:  # no cell is being made, and no run's /tmp is being made in one
        for name in os.listdir(parent):
            if not name.isdigit() or int(name) not in own or int(name) in kept:
                continue
            path = os.path.join(parent, name)
            try:
                if not stat.S_ISDIR(os.lstat(path).st_mode) or os.path.lexists(os.path.join(path, "tmp")):
                    continue  # not a cell; or a child's (ready, or running), or a /tmp whose removal failed: kept
            except FileNotFoundError:
                continue
            trash = f"{path}{TRASH}{time.time_ns()}"
            try:
                os.rename(path, trash)
            except FileNotFoundError:
                continue
            retired.append((int(name), trash))
    for _uid, trash in retired:
        materialized.forget_devices(trash.split(TRASH)[0])
        _remove_quietly(trash)  # what fails stays a trash name: clear_stale_run_tmps removes it later
    return [uid for uid, _trash in retired]


def clear_stale_run_tmps(tree_root: str, own: range = range(0)) -> list[str]:
    """Remove the runs' /tmp directories in the tree's cells that no live instance holds a lock on
    (RunDirectories holds one on each of its own while its run lives), and cells a dead instance left
    half-made: what killed instances left. Their uids' processes are gone (parent-death signals; a
    restarted instance sweeps its block). The names removed (a uid, or a half-made cell's name).

    own: the uids of the caller's block, left alone: their directories are its own runs' (a dead holder's
    go when the uid is next given out, make_run_tmp), made and removed at any moment, and one removed and
    made again under the same name just as it is looked at must not be taken for a dead one's."""
    parent = tree_root + tree_files.CELLS
    removed = []
    for name in os.listdir(parent):
        path = os.path.join(parent, name)
        if name.startswith(image_trees.LINKING):
            continue  # an image tree's cell being named (image_trees.assign_slot): a slot, maybe another uid's
        if ".build-" in name or TRASH in name:  # a half-made cell, or what an earlier clearing failed to remove
            if remove_if_unlocked(path, remove=_remove_quietly):
                removed.append(name)
        elif name.isdigit() and int(name) in own:
            continue
        # a /tmp is renamed out of its cell before it is removed: were that to fail, the uid's next run, whose
        # root the cell is, would find it there
        elif os.path.isdir(os.path.join(path, "tmp")) and remove_if_unlocked(
            os.path.join(path, "tmp"), remove=_remove_quietly, trash_dir=parent
        ):
            removed.append(name)
    return removed


def remove_run_tmp(tree_root: str, uid: int) -> None:
    """Remove uid's /tmp directory and what is in it (no process of the uid may be left: sweep first)."""
    removal.remove(run_tmp(tree_root, uid))
