"""The read-only root a run sees (and an isolated layer build: layers/isolation.py).

Service side, `TreeSpec` lists what the tree holds: host paths bound read-only at
the same place (so that modules a zygote imported before it confined itself keep
their paths), paths hidden behind an empty directory, and the device nodes.
Zygote side, `build_and_enter` mounts it in a private mount namespace and
pivots into it; the namespace, and with it every mount, dies with the zygote.

Some files a run sees are made, not bound: the host's `/etc/hosts` names the host
(and whatever else its administrator put there), so a run's tree holds one that
knows only localhost and the run's own hostname; the host's `/etc/resolv.conf`
tells its search domains and options, so a run's holds only the `nameserver`
lines of the resolvers its egress lets it reach, or none (`run_system_files`).
"""

from __future__ import annotations

import errno
import functools
import json
import os
import re
import shutil
import stat
import subprocess
import time
from dataclasses import asdict, dataclass, field

from runtimes.linux import dirlock, syscalls

DEVICES = ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom")
SYSTEM_FILES = (
    "/etc/ssl/certs/ca-certificates.crt",
    "/usr/lib/ssl/cert.pem",
    "/etc/resolv.conf",
    "/etc/hosts",
    "/etc/nsswitch.conf",
    "/usr/share/zoneinfo",
)

LAYER_IN_TREE = "/opt/sandlot/layer"  # where a runtime's dependency layer shows in its tree, whatever the data dir
RUN_HOSTNAME = "sandbox"  # what uname() tells a run (child.py sets it in the run's UTS namespace)
# The run's /etc/hosts: loopback for localhost and for its own hostname, so that resolving
# gethostname() works as on any machine; nothing of the host's.


def run_hosts(hostname: str = RUN_HOSTNAME) -> str:
    """A run's /etc/hosts: localhost and the name uname() tells it, on both loopbacks, nothing else."""
    return f"127.0.0.1\tlocalhost {hostname}\n::1\tlocalhost ip6-localhost ip6-loopback {hostname}\n"


RUN_HOSTS = run_hosts()


@dataclass
class TreeSpec:
    binds: list[str] = field(default_factory=list)
    hidden: list[str] = field(default_factory=list)
    placed: dict[str, str] = field(default_factory=dict)  # path in the tree -> host file (e.g. a wrapper)
    generated: dict[str, str] = field(default_factory=dict)  # path in the tree -> its text (no host file)
    devices: list[str] = field(default_factory=lambda: list(DEVICES))
    tmp_replaced: bool = True  # each child mounts its own /tmp over the tree's: nothing can live there

    def add(self, *paths: str) -> None:
        for path in paths:
            if self.tmp_replaced and under_tmp(path):
                raise ValueError(f"{path} is under /tmp, which every run replaces with its own")
            if os.path.lexists(path) and path not in self.binds:
                self.binds.append(path)

    def place(self, target: str, source: str) -> None:
        """Show host file or directory source at target inside the tree (for files installed anywhere, even /tmp,
        and for a layer, whose path on the host names the data dir: a user's home, a volume)."""
        self.placed[target] = os.path.realpath(source)

    def generate(self, target: str, text: str) -> None:
        """A file at target inside the tree holding text, read-only, made by the zygote in the tree's own root."""
        if self.tmp_replaced and under_tmp(target):
            raise ValueError(f"{target} is under /tmp, which every run replaces with its own")
        self.generated[target] = text

    def to_dict(self) -> dict:
        return asdict(self)


# What a run's resolv.conf says where its runs have no resolver to reach
NO_RESOLVER = "# no resolver: runs here have no DNS (no network, or network only through the proxy)\n"


def run_resolv_conf(nameservers: tuple[str, ...] | list[str]) -> str:
    """A run's /etc/resolv.conf: one `nameserver` line per resolver it may reach, nothing else of the host's
    (no search domain, no options); a comment alone where it may reach none."""
    if not nameservers:
        return NO_RESOLVER
    return "".join(f"nameserver {server}\n" for server in nameservers)


def run_system_files(spec: TreeSpec, hostname: str = RUN_HOSTNAME, nameservers: tuple[str, ...] = ()) -> None:
    """What every run's tree holds of the system: certificates, name service and time zone files from
    the host, and a hosts file (run_hosts) and resolv.conf (run_resolv_conf) of its own instead of the host's."""
    spec.add(*(path for path in SYSTEM_FILES if path not in ("/etc/hosts", "/etc/resolv.conf")))
    spec.generate("/etc/hosts", run_hosts(hostname))
    spec.generate("/etc/resolv.conf", run_resolv_conf(nameservers))


def outside(paths: list[str], directory: str) -> list[str]:
    """paths but those in directory (links resolved): what a placed directory holds already."""
    if not directory:
        return list(paths)
    top = os.path.realpath(directory)
    return [p for p in paths if not (os.path.realpath(p) + "/").startswith(top + "/")]


def under_tmp(path: str) -> bool:
    """Whether path (links resolved) is /tmp or below it."""
    real = os.path.realpath(path)
    return real == "/tmp" or real.startswith("/tmp/")


_LDD_PATH = re.compile(r"(?:=>\s*)?(/\S+)\s+\(0x")


def shared_libraries(elf_files: list[str], cache_dir: str = "") -> list[str]:
    """Every shared library the given ELF files load, as ldd resolves them.

    ldd runs the loader once per file (a layer and the interpreter's extension
    modules: a hundred processes, about a third of a second at every zygote start).
    Its answer is kept in memory and, with cache_dir, in a file there, under a key
    made of what it depends on: each file's identity (device, inode, size, time)
    and the loader's cache (/etc/ld.so.cache, rewritten when a library is
    installed). A changed file, or a library gone, has ldd asked again.
    """
    if not elf_files:
        return []
    key = _ldd_key(elf_files)
    stored = _ldd_memo.get(key) or _ldd_cached(cache_dir, key)
    if stored is not None and all(os.path.exists(path) for path in stored):
        _ldd_memo[key] = stored
        return list(stored)
    out = subprocess.run(["ldd", *elf_files], capture_output=True, text=True, check=False).stdout
    found: list[str] = []
    for line in out.splitlines():
        match = _LDD_PATH.search(line)
        if match and match.group(1) not in found:
            found.append(match.group(1))
    _ldd_memo[key] = found
    if cache_dir:
        _ldd_store(cache_dir, key, found)
    return list(found)


_ldd_memo: dict[str, list[str]] = {}
_LDD_CACHE = "ldd-cache.json"


def _ldd_key(elf_files: list[str]) -> str:
    identities = []
    for path in [*elf_files, "/etc/ld.so.cache"]:
        try:
            info = os.stat(path)
        except OSError:
            identities.append([path])
            continue
        identities.append([path, info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns])
    import hashlib  # here, not at the top: the zygotes import this module, and hashlib loads libcrypto

    return hashlib.sha256(json.dumps(identities).encode()).hexdigest()


def _ldd_cached(cache_dir: str, key: str) -> list[str] | None:
    if not cache_dir:
        return None
    try:
        with open(os.path.join(cache_dir, _LDD_CACHE)) as f:
            found = json.load(f).get(key)
    except (OSError, ValueError, AttributeError):
        return None
    return found if isinstance(found, list) and all(isinstance(p, str) for p in found) else None


def _ldd_store(cache_dir: str, key: str, found: list[str]) -> None:
    """Kept beside the few other keys in use (others' instances', other runtimes'); written whole, then renamed."""
    path = os.path.join(cache_dir, _LDD_CACHE)
    try:
        with open(path) as f:
            entries = json.load(f)
        if not isinstance(entries, dict):
            entries = {}
    except (OSError, ValueError):
        entries = {}
    entries = dict(list(entries.items())[-15:])
    entries[key] = found
    try:
        os.makedirs(cache_dir, exist_ok=True)
        scratch = f"{path}.{os.getpid()}"
        with open(scratch, "w") as f:
            json.dump(entries, f)
        os.replace(scratch, path)
    except OSError:
        pass  # a cache only: the next start asks ldd again


def elf_files_under(directory: str) -> list[str]:
    result = []
    for dirpath, _dirs, files in os.walk(directory):
        result.extend(os.path.join(dirpath, f) for f in files if ".so" in f)
    return sorted(result)


# ---- zygote side -----------------------------------------------------------


def _mirror(root: str, path: str) -> str:
    """Recreate path's parents inside root (symlinks as symlinks); return the real path."""
    parts = path.strip("/").split("/")
    current = ""
    for index, part in enumerate(parts):
        current = f"{current}/{part}"
        inside = root + current
        if os.path.islink(current):
            if not os.path.lexists(inside):
                os.symlink(os.readlink(current), inside)
            rest = "/".join(parts[index + 1 :])
            real = os.path.realpath(current)
            return _mirror(root, f"{real}/{rest}" if rest else real)
        if index < len(parts) - 1:
            os.makedirs(inside, exist_ok=True)
    return path


def bind(root: str, path: str, flags: int, writable: bool = False) -> None:
    """Make host path appear at the same place under root, read-only unless asked otherwise."""
    real = _mirror(root, path)
    target = root + real
    if os.path.isdir(real):
        os.makedirs(target, exist_ok=True)
    elif not os.path.exists(target):
        open(target, "w").close()  # noqa: SIM115 - an empty file to mount over
    syscalls.mount(real, target, None, syscalls.MS_BIND | syscalls.MS_REC)
    readonly = 0 if writable else syscalls.MS_RDONLY
    syscalls.mount(None, target, None, syscalls.MS_REMOUNT | syscalls.MS_BIND | readonly | flags | kept_flags(real))


# statvfs flag -> mount flag: what a bind mount must keep (in a user namespace the kernel locks
# them, and a remount that would clear one fails with EPERM)
_KEPT = (
    (os.ST_RDONLY, syscalls.MS_RDONLY),
    (os.ST_NOSUID, syscalls.MS_NOSUID),
    (os.ST_NODEV, syscalls.MS_NODEV),
    (os.ST_NOEXEC, syscalls.MS_NOEXEC),
    (os.ST_NOATIME, syscalls.MS_NOATIME),
    (os.ST_NODIRATIME, syscalls.MS_NODIRATIME),
    (os.ST_RELATIME, syscalls.MS_RELATIME),
)


def kept_flags(path: str) -> int:
    """The flags of the mount path is on that a read-only bind of it keeps."""
    have = os.statvfs(path).f_flag
    return functools.reduce(lambda acc, pair: acc | (pair[1] if have & pair[0] else 0), _KEPT, 0)


def build_and_enter(spec: dict, root: str, writable: tuple[str, ...] = (), tmp_options: str = "") -> None:
    """Mount the tree at root in a new mount namespace and make it this process's /.

    writable: host directories bound read-write; tmp_options: a tmpfs of this
    process's own on /tmp (else /tmp is only a mount point for children's own).
    """
    syscalls.unshare(syscalls.CLONE_NEWNS)
    syscalls.mount(None, "/", None, syscalls.MS_REC | syscalls.MS_PRIVATE)
    syscalls.mount("sandlot-root", root, "tmpfs", syscalls.MS_NOSUID | syscalls.MS_NODEV, "size=1m,mode=755")
    os.makedirs(root + "/tmp", exist_ok=True)
    if tmp_options:  # first: binds below /tmp then land inside it
        syscalls.mount("sandlot-tmp", root + "/tmp", "tmpfs", syscalls.MS_NOSUID | syscalls.MS_NODEV, tmp_options)
    for path in spec["binds"]:
        bind(root, path, syscalls.MS_NOSUID | syscalls.MS_NODEV)
    for path in spec["hidden"]:
        target = root + _mirror(root, path)
        if os.path.isdir(target):
            syscalls.mount("sandlot-hidden", target, "tmpfs", syscalls.MS_RDONLY, "size=4k,mode=555")
    for path in spec["devices"]:
        bind(root, path, syscalls.MS_NOSUID)
    for target, source in spec.get("placed", {}).items():
        if os.path.isdir(source):
            os.makedirs(root + target, exist_ok=True)
            syscalls.mount(source, root + target, None, syscalls.MS_BIND | syscalls.MS_REC)
        else:
            os.makedirs(os.path.dirname(root + target), exist_ok=True)
            open(root + target, "w").close()  # noqa: SIM115 - an empty file to mount over
            syscalls.mount(source, root + target, None, syscalls.MS_BIND)
        flags = syscalls.MS_REMOUNT | syscalls.MS_BIND | syscalls.MS_RDONLY | syscalls.MS_NOSUID | kept_flags(source)
        syscalls.mount(None, root + target, None, flags)
    for target, text in spec.get("generated", {}).items():
        os.makedirs(os.path.dirname(root + target), exist_ok=True)
        fd = os.open(root + target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o444)
        with open(fd, "w") as file:
            file.write(text)
    for path in writable:
        bind(root, path, syscalls.MS_NOSUID | syscalls.MS_NODEV, writable=True)
    os.makedirs(root + "/.old", exist_ok=True)
    syscalls.pivot_root(root, root + "/.old")
    os.chdir("/")
    syscalls.umount2("/.old", syscalls.MNT_DETACH)
    os.rmdir("/.old")
    syscalls.mount(None, "/", None, syscalls.MS_REMOUNT | syscalls.MS_RDONLY | syscalls.MS_NOSUID | syscalls.MS_NODEV)


# ---- the tree as a real directory (the chroot mode: no mount can be made) ------------------------------

TREE_FORMAT = 4  # bumped when materialize() changes what a tree holds: older trees are then rebuilt
TREE_TMP_MODE = 0o711  # runs can neither list nor write the tree's /tmp (each has a /tmp of its own, in its cell)
CELLS = "/cells"  # each uid's cell: the tree again, its directories made and its files hard links (make_cell)
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
        _copy_in(root, _mirror(root, path), hidden, done)
    hidden_targets = []
    for path in spec["hidden"]:
        target = root + _mirror(root, path)
        if os.path.isdir(target):
            hidden_targets.append(target)
    for path in spec["devices"]:
        target = root + _mirror(root, path)
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


def cell(uid: int) -> str:
    """The root a run of uid chroots into, as its zygote (chrooted into the tree) names it."""
    return f"{CELLS}/{uid}"


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
            _clone(source, held, skipped=(os.path.basename(CELLS), "tmp"))
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


def _clone(source: int, target: int, skipped: tuple[str, ...] = ()) -> None:
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
                _clone(inner_source, inner_target)
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


def forget_cached_pages(path: str) -> bool:
    """Drop the page cache's copy of a file (its clean pages that no process maps); whether it could be opened."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return True


def drop_cache(root: str) -> int:
    """Drop what the page cache holds of the files under root (written back first: dirty pages stay), except
    pages a process maps; how many files were told."""
    told = 0
    pending = [root]
    while pending:
        with os.scandir(pending.pop()) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    told += forget_cached_pages(entry.path)
    return told


def fills_cache(root: str, source: str) -> bool:
    """Whether materializing under root reads and writes the bytes of files from source's filesystem: root on
    overlayfs (linking a file of a lower layer copies it up first) or on another filesystem (a copy)."""
    try:
        return os.stat(root).st_dev != os.stat(source).st_dev or _filesystem(root) == "overlay"
    except OSError:
        return False


def _filesystem(path: str) -> str:
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
