"""A run's tree as a real directory, for the chroot mode, where no mount can be made (service side).

The same tree as runtimes/linux/rootfs.py's build_and_enter mounts, built once as files (materialize), and each
uid's cell in it (make_cell); runtimes/jail/trees/tree_store.py keeps them.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import stat
import time
from dataclasses import dataclass

from runtimes.jail.policy.tree_files import CELLS, cell
from runtimes.linux import dirlock
from runtimes.linux.rootfs import forget_cached_pages, mirror

SLOTS = "/slots"  # an image tree's cells by slot (image_trees.py): never part of a cell

# ---- the tree as a real directory (the chroot mode: no mount can be made) ------------------------------

TREE_FORMAT = 4  # bumped when materialize() changes what a tree holds: older trees are then rebuilt
TREE_TMP_MODE = 0o711  # runs can neither list nor write the tree's /tmp (each has a /tmp of its own, in its cell)
HIDDEN_MODE = 0o555  # what the pivot tree's hiding tmpfs shows: an empty directory
NULL_STAND_IN = "/dev/null"
_NOT_LINKABLE = stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX | stat.S_IWGRP | stat.S_IWOTH


@dataclass
class Materialized:
    """What materialize() did: how many files share their source's inode, how many were copied."""

    linked: int = 0
    copied: int = 0
    copied_bytes: int = 0
    devices: str = "nodes"  # "nodes" (mknod), or "stand-ins" (see materialize)
    uncache: bool = False  # drop the page cache the build itself filled (see materialize)


def linkable(info: os.stat_result) -> bool:
    """Whether a tree may share this file's inode (a hard link shares its owner, its mode and every later
    write): only a plain file of root's that no other uid, group or setuid bit could ever make use of."""
    return stat.S_ISREG(info.st_mode) and info.st_uid == 0 and not info.st_mode & _NOT_LINKABLE


def materialize(spec: dict, root: str, device_nodes: bool = True, uncache: bool = False) -> Materialized:
    """Build at root, an empty directory, the files build_and_enter's tree shows, as real files.

    The same walk as build_and_enter's mounts, in the same order: each bound host path at its own
    place (parents and symlinks on the way recreated), hidden directories empty, the device nodes,
    the placed files, the generated ones (written, root's, 0444), and /tmp. A file is a hard link to
    its source where linkable() allows and the filesystem can (the same one), a copy otherwise (root's,
    without setuid bits or write for others, its times kept so that the interpreter's cached bytecode
    stays valid). Directories are root's, 0755.

    device_nodes: make the nodes with mknod (as /dev shows them). Without (mknod refused, or the
    filesystem is nodev) stand-ins: /dev/null is an empty file nobody may write (reads end at once, as
    from null; a write fails loudly instead of landing where another run could read it), and zero,
    random and urandom are left out: a file cannot stand in for them without handing out predictable
    or short "random" bytes (the interpreters take randomness from getrandom(2), which needs no file).

    uncache: where a tree costs every byte anyway (on overlayfs a link copies a lower file up, reading
    and writing it all; onto another filesystem only a copy can be made), every file is copied, and
    the pages the copy read are dropped from the page cache as it goes (the tree's own, once written
    back, by the caller: drop_cache), so that a container is not charged hundreds of MB of cache for
    files no run may ever read. (A link's copy-up leaves the lower file's pages cached, out of reach:
    the path names the copy from then on.)
    """
    done = Materialized(devices="nodes" if device_nodes else "stand-ins", uncache=uncache)
    hidden = {os.path.realpath(path) for path in spec["hidden"]}
    os.chmod(root, 0o755)
    for path in spec["binds"]:
        _copy_in(root, mirror(root, path), hidden, done)
    hidden_targets = []
    for path in spec["hidden"]:
        target = root + mirror(root, path)
        if os.path.isdir(target):
            hidden_targets.append(target)
    for path in spec["devices"]:
        target = root + mirror(root, path)
        if device_nodes:
            os.mknod(target, stat.S_IFCHR | 0o666, os.stat(path).st_rdev)
            os.chmod(target, 0o666)  # mknod's mode goes through the umask
        elif path == NULL_STAND_IN:
            open(target, "x").close()  # noqa: SIM115 - an empty file
            os.chmod(target, 0o444)
    for target, source in spec.get("placed", {}).items():
        if os.path.isdir(source):
            _copy_in(root, source, hidden, done, at=target)
            continue
        os.makedirs(os.path.dirname(root + target), exist_ok=True)
        if os.path.lexists(root + target):
            os.unlink(root + target)  # a placed file shows over what a bind put there
        _file_in(source, root + target, os.stat(source), done)
    for target, text in spec.get("generated", {}).items():  # made, not bound (the run's /etc/hosts)
        os.makedirs(os.path.dirname(root + target), exist_ok=True)
        if os.path.lexists(root + target):
            os.unlink(root + target)
        fd = os.open(root + target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o444)
        with open(fd, "w") as file:
            file.write(text)
        os.chmod(root + target, 0o444)  # whatever the umask
    os.makedirs(root + "/tmp", exist_ok=True)
    os.makedirs(root + CELLS, exist_ok=True)
    _settle_tree(root, hidden_targets)
    return done


def make_cell(root: str, uid: int) -> str:
    """uid's cell in the finished tree at root, made now if there is none; its path (host side).

    Literal /tmp paths (Dify code writes /tmp/report.pdf) need a /tmp of the run's own, and
    without mounts one root cannot show each run another /tmp: each uid gets a root of its own,
    the tree again with every directory made anew (root's, the tree's modes) and every other entry
    (files, symlinks, device nodes) a hard link to the tree's own, so that it costs the tree's
    directories (a few hundred inodes), no file data and no page cache of its own. Its /tmp is
    made for each run (trees.make_run_tmp). Built under a name of its own, locked, and renamed
    into place: never seen half-made (trees.clear_stale_run_tmps removes a dead builder's).
    Nothing in it but its /tmp is writable by a run, so a cell is kept for the uid's next runs.
    """
    path = root + cell(uid)
    if os.path.isdir(path):
        return path
    scratch = f"{path}.build-{os.getpid()}-{time.time_ns()}"
    os.mkdir(scratch, 0o700)
    held = dirlock.lock_shared(scratch)
    try:
        source = os.open(root, _DIRECTORY)
        try:
            clone(source, held, skipped=(os.path.basename(CELLS), os.path.basename(SLOTS), "tmp"))
        finally:
            os.close(source)
        os.chmod(scratch, stat.S_IMODE(os.stat(root).st_mode))
        try:
            os.rename(scratch, path)
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
    finally:
        os.close(held)
        if os.path.lexists(scratch):
            shutil.rmtree(scratch, ignore_errors=True)
    return path


_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _copy_entry(source: int, target: int, name: str) -> None:
    info = os.stat(name, dir_fd=source, follow_symlinks=False)
    if stat.S_ISLNK(info.st_mode):
        os.symlink(os.readlink(name, dir_fd=source), name, dir_fd=target)
    elif stat.S_ISREG(info.st_mode):
        _copy_file(f"/proc/self/fd/{source}/{name}", f"/proc/self/fd/{target}/{name}", info)
    else:
        raise OSError(errno.EMLINK, f"{name}: too many links, and not a file that can be copied")


def renew_devices(cell_root: str) -> None:
    """The device nodes of a cell made again, for its next run: a node is shared by whoever links it, and any
    run may set a 0666 node's times to now (utime with no times needs only write access), which every later run
    of the cell would read: nothing of a run may reach the next. (Stand-ins are files nobody may write.)"""
    devices = cell_root + "/dev"
    try:
        names = os.listdir(devices)
    except FileNotFoundError:
        return
    for name in names:
        path = os.path.join(devices, name)
        info = os.lstat(path)
        if not stat.S_ISCHR(info.st_mode) or _made.get(path) == (info.st_ino, info.st_ctime_ns):
            continue  # a stand-in, or a node no run has touched since it was made (its change time would be new)
        os.unlink(path)
        os.mknod(path, stat.S_IFCHR | 0o666, info.st_rdev)
        os.chmod(path, 0o666)  # mknod's mode goes through the umask
        made = os.lstat(path)
        _made[path] = (made.st_ino, made.st_ctime_ns)


_made: dict[str, tuple[int, int]] = {}  # each cell node this process made: its inode and change time then


def forget_devices(cell_root: str) -> None:
    """A cell is gone (retired): what renew_devices remembered of its nodes goes too."""
    devices = cell_root + "/dev/"
    for path in [path for path in _made if path.startswith(devices)]:
        del _made[path]


def clone(source: int, target: int, skipped: tuple[str, ...] = ()) -> None:
    """Into the directory open as target, the entries of the one open as source: directories made anew (the
    maker's, with the source's mode), everything else a hard link. By descriptors: no path is walked again, and
    nothing is followed."""
    with os.scandir(source) as entries:
        found = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in entries if entry.name not in skipped]
    for name, is_dir in found:
        if not is_dir:
            try:
                os.link(name, name, src_dir_fd=source, dst_dir_fd=target, follow_symlinks=False)
            except OSError as exc:  # the file's links at the filesystem's limit (ext4: 65,000): a copy of it
                if exc.errno != errno.EMLINK:
                    raise
                _copy_entry(source, target, name)
            continue
        mode = stat.S_IMODE(os.stat(name, dir_fd=source, follow_symlinks=False).st_mode)
        os.mkdir(name, 0o700, dir_fd=target)
        inner_source = os.open(name, _DIRECTORY, dir_fd=source)
        try:
            inner_target = os.open(name, _DIRECTORY, dir_fd=target)
            try:
                clone(inner_source, inner_target)
                os.fchmod(inner_target, mode)
            finally:
                os.close(inner_target)
        finally:
            os.close(inner_source)


def _copy_in(root: str, source: str, hidden: set[str], done: Materialized, at: str = "") -> None:
    """Copy host path source (a real path) to the same place under root (or to at); directories whole, but
    those in hidden empty; symlinks as symlinks; nothing but directories, files and symlinks (no fifo, socket
    or device a bound directory may hold)."""
    at = at or source
    info = os.lstat(source)
    if not stat.S_ISDIR(info.st_mode):
        if stat.S_ISREG(info.st_mode) and not os.path.lexists(root + at):
            _file_in(source, root + at, info, done)
        return
    pending = [source]
    while pending:
        directory = pending.pop()
        os.makedirs(root + at + directory[len(source) :], exist_ok=True)
        if directory in hidden:
            continue
        with os.scandir(directory) as entries:
            for entry in entries:
                target = root + at + entry.path[len(source) :]
                if entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
                elif os.path.lexists(target):
                    continue  # bound twice (the stdlib and its platform part may be one directory)
                elif entry.is_symlink():
                    os.symlink(os.readlink(entry.path), target)
                elif entry.is_file(follow_symlinks=False):
                    _file_in(entry.path, target, entry.stat(follow_symlinks=False), done)


def _file_in(source: str, target: str, info: os.stat_result, done: Materialized) -> None:
    if linkable(info) and not done.uncache:
        try:
            os.link(source, target, follow_symlinks=False)
            done.linked += 1
            return
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.EACCES):
                raise
    done.copied_bytes += _copy_file(source, target, info, done.uncache)
    done.copied += 1


def drop_cache(root: str, skipped: tuple[str, ...] = ()) -> int:
    """Drop what the page cache holds of the files under root (written back first: dirty pages stay), except
    pages a process maps, and the directories in skipped; how many files were told."""
    told = 0
    pending = [root]
    while pending:
        with os.scandir(pending.pop()) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    if entry.path not in skipped:
                        pending.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    told += forget_cached_pages(entry.path)
    return told


def fills_cache(root: str, source: str) -> bool:
    """Whether materializing under root reads and writes the bytes of files from source's filesystem: root on
    overlayfs (linking a file of a lower layer copies it up first) or on another filesystem (a copy)."""
    try:
        return os.stat(root).st_dev != os.stat(source).st_dev or filesystem(root) == "overlay"
    except OSError:
        return False


def filesystem(path: str) -> str:
    """The type of the filesystem mounted where path lies (/proc/self/mountinfo), "" if not found."""
    path = os.path.realpath(path)
    found, kind = "", ""
    try:
        with open("/proc/self/mountinfo") as mounts:
            for line in mounts:
                fields = line.split()
                point = fields[4].replace("\\040", " ")
                after = fields[fields.index("-") + 1]
                inside = path == point or path.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(found):
                    found, kind = point, after
    except (OSError, ValueError, IndexError):
        return ""
    return kind


def _copy_file(source: str, target: str, info: os.stat_result, uncache: bool = False) -> int:
    """Copy a regular file's bytes (copy_file_range: a reflink where the filesystem offers it); return the
    size. The copy is root's, its mode without setuid bits or write for group and others."""
    src = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        dst = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            size = _copy_bytes(src, dst, info.st_size)
            if os.geteuid() == 0:
                os.fchown(dst, 0, 0)
            os.fchmod(dst, stat.S_IMODE(info.st_mode) & 0o755)
            os.utime(dst, ns=(info.st_atime_ns, info.st_mtime_ns))
        finally:
            os.close(dst)
        if uncache:  # the source's pages this read (clean: dropped now, unless a process maps them)
            os.posix_fadvise(src, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(src)
    return size


def _copy_bytes(src: int, dst: int, size: int) -> int:
    copied = 0
    try:
        while copied < size:
            step = os.copy_file_range(src, dst, size - copied)
            if step == 0:
                break
            copied += step
        return copied
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP) or copied:
            raise
    while chunk := os.read(src, 1 << 20):
        view = memoryview(chunk)
        while view:
            view = view[os.write(dst, view) :]
        copied += len(chunk)
    return copied


def _settle_tree(root: str, hidden: list[str]) -> None:
    """Every directory and symlink of the tree root's (a file is already: copies are made so, links are
    of root's files only); directories 0755, hidden ones 0555, /tmp and the cells' parent 0711."""
    special = {root + "/tmp": TREE_TMP_MODE, root + CELLS: TREE_TMP_MODE, **dict.fromkeys(hidden, HIDDEN_MODE)}
    for dirpath, dirnames, filenames in os.walk(root):
        if os.geteuid() == 0:
            os.chown(dirpath, 0, 0)
        os.chmod(dirpath, special.get(dirpath, 0o755))
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            if os.path.islink(path) and os.geteuid() == 0:
                os.chown(path, 0, 0, follow_symlinks=False)


def fingerprint(spec: dict, device_nodes: bool) -> str:
    """The key of the tree a spec gives: the spec, and the type, size, mode, owner and mtime of every file
    it would hold (a walk of stats, no reads)."""
    digest = hashlib.sha256(
        json.dumps({"format": TREE_FORMAT, "spec": spec, "devices": device_nodes}, sort_keys=True).encode()
    )
    hidden = {os.path.realpath(path) for path in spec["hidden"]}
    sources = [*spec["binds"], *spec.get("placed", {}).values(), *spec["devices"]]
    for path in sources:
        for name, info in _stats(os.path.realpath(path), hidden):
            digest.update(
                f"{name}\0{info.st_mode}\0{info.st_size}\0{info.st_uid}\0{info.st_mtime_ns}\0{info.st_rdev}\n".encode()
            )
    return digest.hexdigest()[:24]


def _stats(path: str, hidden: set[str]):
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        yield path, os.stat_result((0,) * 10)
        return
    yield path, info
    if not stat.S_ISDIR(info.st_mode) or path in hidden:
        return
    pending = [path]
    while pending:
        directory = pending.pop()
        with os.scandir(directory) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                entry_info = entry.stat(follow_symlinks=False)
                yield entry.path, entry_info
                if stat.S_ISDIR(entry_info.st_mode) and entry.path not in hidden:
                    pending.append(entry.path)
