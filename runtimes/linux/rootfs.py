"""The read-only root a run sees (and an isolated layer build: layers/isolation.py, layers/jailer.py).

Service side, `TreeSpec` lists what the tree holds: host paths bound read-only at
the same place (so that modules a zygote imported before it confined itself keep
their paths), paths hidden behind an empty directory, and the device nodes.
Zygote side, `build_and_enter` mounts it in a private mount namespace and
pivots into it; the namespace, and with it every mount, dies with the zygote.

Some files a run sees are made, not bound (`TreeSpec.generate`): what a run's own
are is the jail's policy (runtimes/jail/policy/tree_files.py). The same tree as real
directories, for the chroot mode, is runtimes/jail/trees/materialized.py.
"""

from __future__ import annotations

import functools
import json
import os
import re
import stat
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from runtimes.linux import syscalls

DEVICES = ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom")
SYSTEM_FILES = (
    "/etc/ssl/certs/ca-certificates.crt",
    "/usr/lib/ssl/cert.pem",
    "/etc/resolv.conf",
    "/etc/hosts",
    "/etc/nsswitch.conf",
    "/usr/share/zoneinfo",
)


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
# a file ldd is given names no line of its own: its name holds nothing but these (ldd prints a `<name>:` header
# line for each file; a name with a space, a newline or a tab could print what reads as a library's line)
_PLAIN_PATH = re.compile(r"[\w.+@/-]+\Z", re.ASCII)
ELF_MAGIC = b"\x7fELF"


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
    depends = [*elf_files, LOADER_CACHE]
    key = file_key(depends)
    stored = _ldd_memo.get(key)
    if stored is None or not _libraries_there(stored):
        stored = remembered(_LDD_CACHE, depends, lambda: _ldd(elf_files), _libraries_there, cache_dir)
        _ldd_memo[key] = stored
    return list(stored)


def _ldd(elf_files: list[str]) -> list[str]:
    out = subprocess.run(["ldd", *elf_files], capture_output=True, text=True, check=False).stdout
    found: list[str] = []
    for line in out.splitlines():
        if not line.startswith("\t"):
            continue  # a file's `<name>:` header, or ldd's own words: only a dependency's line is indented
        match = _LDD_PATH.search(line)
        if match and match.group(1) not in found:
            found.append(match.group(1))
    return found


def _libraries_there(found: object) -> bool:
    """An answer of ldd's to use: libraries that are all there, and some (a shared object loads libc at least: ldd
    found nothing where it failed, and that is asked again, never kept)."""
    return bool(found) and isinstance(found, list) and all(isinstance(p, str) and os.path.exists(p) for p in found)


_ldd_memo: dict[str, list[str]] = {}
_LDD_CACHE = "ldd-cache.json"


LOADER_CACHE = "/etc/ld.so.cache"  # rewritten when a library is installed
# The service image's answers (the Dockerfile makes it before it builds the trees, whose specs ask): a container
# finds them under portable_key, its own volume's cache (cache_dir) being new. Written where it exists and can be.
IMAGE_CACHE = "/opt/sandlot/image-cache"


def portable_key(paths: list[str]) -> str:
    """A key of the files' contents as an image carries them (path, type and mode, owner, size, time): the same in
    every container of the image, whose device and inode numbers (file_key's) differ from the image build's."""
    return "portable-" + _key(paths, ("st_mode", "st_uid", "st_size", "st_mtime_ns"))


def image_cache_writable() -> bool:
    """Whether answers go into IMAGE_CACHE too: where it exists (an image of the service) and may be written (the
    image's build; a container on it, whose later starts then find an operator's layer's answers there too)."""
    return os.path.isdir(IMAGE_CACHE) and os.access(IMAGE_CACHE, os.W_OK)


def remembered(
    name: str,
    depends: list[str],
    compute: Callable[[], object],
    valid: Callable[[object], bool],
    cache_dir: str = "",
    salt: str = "",
) -> object:
    """compute()'s answer, which depends on the files depends names (and on salt), asked once: kept in cache_dir
    (the data dir's: under the files' identities, file_key) and in the image's (IMAGE_CACHE: under what the image
    carries of them, portable_key), in the file name there. The first valid one found gives it; else compute's,
    kept in both where it is valid (IMAGE_CACHE where it may be written: image_cache_writable)."""
    salted = lambda key: key if not salt else _digest(salt + "\0" + key)  # noqa: E731
    places = [(cache_dir, salted(file_key(depends)))] if cache_dir else []
    places.append((IMAGE_CACHE, salted(portable_key(depends))))
    for directory, key in places:
        known = cached(directory, name, key)
        if known is not None and valid(known):
            return known
    value = compute()
    if valid(value):
        for directory, key in places:
            if directory != IMAGE_CACHE or image_cache_writable():
                store(directory, name, key, value)
    return value


def file_key(paths: list[str]) -> str:
    """A key made of each file's identity (device, inode, size, time; a missing one by its name alone)."""
    return _key(paths, ("st_dev", "st_ino", "st_size", "st_mtime_ns"))


def _key(paths: list[str], fields: tuple[str, ...]) -> str:
    identities = []
    for path in paths:
        try:
            info = os.stat(path)
        except OSError:
            identities.append([path])
            continue
        identities.append([path, *(getattr(info, name) for name in fields)])
    return _digest(json.dumps(identities))


def _digest(text: str) -> str:
    import hashlib  # here, not at the top: the zygotes import this module, and hashlib loads libcrypto

    return hashlib.sha256(text.encode()).hexdigest()


def cached(cache_dir: str, name: str, key: str) -> object:
    """What store() kept under key in cache_dir's file name, or None."""
    if not cache_dir:
        return None
    try:
        with open(os.path.join(cache_dir, name)) as f:
            return json.load(f).get(key)
    except (OSError, ValueError, AttributeError):
        return None


def store(cache_dir: str, name: str, key: str, value: object) -> None:
    """Kept beside the few other keys in use (others' instances', other runtimes'); written whole, then renamed."""
    path = os.path.join(cache_dir, name)
    try:
        with open(path) as f:
            entries = json.load(f)
        if not isinstance(entries, dict):
            entries = {}
    except (OSError, ValueError):
        entries = {}
    entries = dict(list(entries.items())[-15:])
    entries[key] = value
    try:
        os.makedirs(cache_dir, exist_ok=True)
        scratch = f"{path}.{os.getpid()}"
        with open(scratch, "w") as f:
            json.dump(entries, f)
        os.replace(scratch, path)
    except OSError:
        pass  # a cache only: the next start asks ldd again


def elf_files_under(directory: str) -> list[str]:
    """The shared objects under directory that ldd may be asked of: regular files whose path is plain
    (_PLAIN_PATH) and whose content begins as an ELF file's. A layer's file names are its packages' (the package
    index's): one named to print a line of its own in ldd's answer, or that is no ELF file, is left out."""
    result = []
    for dirpath, _dirs, files in os.walk(directory):
        for name in files:
            path = os.path.join(dirpath, name)
            if ".so" in name and _PLAIN_PATH.match(path) and _is_elf(path):
                result.append(path)
    return sorted(result)


def _is_elf(path: str) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and os.read(fd, 4) == ELF_MAGIC
    finally:
        os.close(fd)


SYSTEM_LIBRARIES = ("/lib/", "/lib64/", "/usr/lib/", "/usr/lib64/", "/usr/local/lib/")


def system_libraries(found: list[str], inside: str = "") -> list[str]:
    """Of the libraries ldd found for files the package index wrote (a layer's), those that are the system's (a
    regular file in its library directories) or the layer's own (inside): a library its ELF file names by an
    absolute path elsewhere is not bound into the runs' tree."""
    top = os.path.realpath(inside) + "/" if inside else ""
    kept = []
    for path in found:
        real = os.path.realpath(path)
        if os.path.isfile(real) and (real.startswith(SYSTEM_LIBRARIES) or (top and real.startswith(top))):
            kept.append(path)
    return kept


# ---- zygote side -----------------------------------------------------------


def mirror(root: str, path: str) -> str:
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
            return mirror(root, f"{real}/{rest}" if rest else real)
        if index < len(parts) - 1:
            os.makedirs(inside, exist_ok=True)
    return path


def bind(root: str, path: str, flags: int, writable: bool = False) -> None:
    """Make host path appear at the same place under root, read-only unless asked otherwise."""
    real = mirror(root, path)
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
        target = root + mirror(root, path)
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
