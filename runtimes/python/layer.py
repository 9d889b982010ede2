"""The Python layer: `pip install --target` from a requirements file, plus the packages an operator asked for.

The requirements file (layers/python/requirements.txt, SANDLOT_PYTHON_REQUIREMENTS or
dify-sandbox's dependencies/python-requirements.txt) is the base; requested packages
(layers/packages.py) are added on top: the build reads one requirements file, a
copy of the base with them listed after it, so pip resolves both together and
every constraint must hold. The service writes that copy for the build, whose uid
may not be allowed to read the operator's own file.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from layers import isolation
from layers.store import LayerBuildError, drop_cached, what_went_wrong
from runtimes.languages import PYTHON
from runtimes.linux import rootfs
from runtimes.python import seeding

if TYPE_CHECKING:
    from layers.manager import Layer

log = logging.getLogger("sandlot.layers")

DEFAULT_REQUIREMENTS = PYTHON.default_base_file()  # layers/python/requirements.txt
DIFY_REQUIREMENTS = Path("dependencies/python-requirements.txt")  # dify-sandbox's location


def requirements_file(configured: str = "") -> Path:
    if configured:
        return Path(configured).resolve()
    if DIFY_REQUIREMENTS.is_file():
        return DIFY_REQUIREMENTS.resolve()
    return DEFAULT_REQUIREMENTS


def managed_layer(settings, data_dir: Path) -> Layer:
    """The Python layer of a service (settings: the service's): its store under data_dir/layers/python, built
    from the requirements file, with the packages an operator asked for on top (kept in data_dir/packages)."""
    from layers.manager import Layer
    from layers.requested import RequestedPackages
    from layers.store import LayerStore, image_layers

    python = os.path.realpath(settings.PYTHON_PATH)
    requirements = lambda: requirements_file(settings.SANDLOT_PYTHON_REQUIREMENTS)  # noqa: E731
    requested = RequestedPackages(PYTHON.wire_name, data_dir / "packages" / f"{PYTHON.wire_name}.json")
    seeded: dict[str, Seeded | None] = {}  # what the last build kept of the image's layer, for its finish
    store = LayerStore(
        data_dir / "layers" / PYTHON.folder,
        sources=lambda: [requirements()],
        build=lambda scratch, wanted, output, aside: seeded.update(
            last=build(
                requirements(),
                scratch,
                settings.build_uid,
                settings.PIP_MIRROR_URL,
                settings.SANDLOT_PIP_FIND_LINKS,
                requested=wanted,
                on_output=output,
                seed=store.seed(wanted),
                aside=aside,
                cache_dir=str(data_dir),
            )
        ),
        salt=python,
        requested=requested.render,
        baked=image_layers(PYTHON.folder),  # the defaults the service image carries (Dockerfile)
        build_uid=lambda: settings.build_uid,
        finish=lambda layer: finish(layer, python, seeded.pop("last", None)),
    )
    return Layer(
        store,
        installed,
        packages=requested,
        base_names=lambda: base_names(requirements()),
        base_file=lambda: str(requirements()),
    )


DEFAULT_INDEX = "https://pypi.org/simple"
FILES_HOST = "https://files.pythonhosted.org"  # where PyPI's pages send pip for the files
INDEX_KEYS = ("index-url", "extra-index-url", "proxy")
MERGED = ".sandlot-requirements.txt"  # the build's own requirements, in scratch; gone before the layer is used


def build(
    requirements: Path,
    scratch: Path,
    build_uid: int,
    mirror_url: str = "",
    find_links: str = "",
    requested: list[str] | None = None,
    on_output: Callable[[bytes], None] | None = None,
    seed: Path | None = None,
    aside: Path | None = None,
    cache_dir: str = "",
) -> Seeded | None:
    """pip install --target scratch, as an unprivileged user (see layers.isolation): the base requirements and
    the requested lines (already validated: layers/specs.py). seed: the layer the image carries, whose
    distributions count as installed (runtimes/python/seeding.py) where every line is a plain named requirement
    and nothing configured makes that doubtful (unseedable); else, and without one, the build is as always. A
    seeded build returns what of the seed the layer keeps: finish copies it in (copy_seed). aside: the service's
    own directory on the layer's filesystem (LayerStore's build), where the seed is copied while pip runs: finish
    then moves what is kept instead of copying it. cache_dir: where pip's configuration listing is kept
    (pip_configuration)."""
    # the build's own copy, written by the service: the build's uid may not be able to read the operator's file
    # (a file only root can read, or a directory closed to others, where there is no tree to bind it into)
    source = scratch / MERGED
    text = copied(requirements) + "".join(f"{line}\n" for line in requested or ())
    source.write_text(text)
    tools = pip_package()
    configuration = pip_configuration(tools, cache_dir)
    env = {k: v for k, v in os.environ.items() if k.startswith("PIP_") or k.lower().endswith("_proxy")}
    pip = [os.path.join(sys.prefix, "bin", "python"), "-m", "pip"]
    target = ["--target", str(scratch)]
    why = "no pip package found" if not tools else unseedable(text, configuration, env) if seed else ""
    if seed and not why:  # the image's layer taken as installed (runtimes/python/seeding.py)
        log.info("the Python layer's build starts from the image's layer %s: pip installs only what it lacks", seed)
        pip = [pip[0], "-S", "-c", SEEDING, str(seed), str(scratch), os.path.dirname(tools[0]), str(source)]
        target = ["--prefix", str(scratch / seeding.PREFIX), "--no-warn-script-location", "--no-warn-conflicts"]
    elif seed:
        log.info("the Python layer's build does not start from the image's layer: %s", why)
    argv = [
        *pip,
        "install",
        "--no-cache-dir",
        "--no-compile",
        "--disable-pip-version-check",
        "--progress-bar",
        "off",
        *target,
        "-r",
        str(source),
    ]
    readable = [sys.prefix, sys.base_prefix, sysconfig.get_paths()["platstdlib"], str(requirements.parent)]
    if mirror_url:
        argv += ["--index-url", mirror_url]
    if find_links:
        argv += ["--no-index", "--find-links", find_links]
        readable.append(find_links)
    if seed and not why:
        readable.append(str(seed))
    readable += isolation.configured_paths(configuration)
    env.update({"HOME": str(scratch), "LANG": "C.UTF-8", "PATH": "/usr/bin:/bin", "PYTHONUNBUFFERED": "1"})
    dynload = next((p for p in sys.path if p.endswith("lib-dynload")), "")
    # the index (or mirror) and where its files are, the extra indexes, the proxies: the build's only way out
    configured = isolation.configured_urls(configuration, INDEX_KEYS)
    index = mirror_url or env.get("PIP_INDEX_URL", "") or DEFAULT_INDEX
    indexes = [index, FILES_HOST, env.get("PIP_EXTRA_INDEX_URL", "")]
    reaches = isolation.reached([*indexes, *configured, *isolation.proxies(env)])
    # the image's layer copied aside (the service's own directory) while pip runs, where the build is seeded: finish
    # moves what the build keeps. Started only now: nothing before pip may fail with the copy going on, and the copy
    # is over (or stopped, if pip failed) before the build returns, which the store's removal of aside follows
    ahead = _CopyAhead(seed, aside) if seed and not why and aside is not None else None
    try:
        result = isolation.run(argv, str(scratch), [*readable, dynload], env, build_uid, on_output, reaches=reaches)
    except BaseException:
        if ahead is not None:
            ahead.join(stop=True)
        raise
    copied_ahead = ahead.join(stop=result.returncode != 0) if ahead is not None else None
    for tool in tools:  # pip's own files, read for the first time (layers/store.py: drop_cached)
        drop_cached(tool)
    source.unlink(missing_ok=True)
    kept = scratch / seeding.KEPT
    listed = kept.read_text() if kept.is_file() and not kept.is_symlink() else None
    kept.unlink(missing_ok=True)
    if result.returncode != 0:
        raise LayerBuildError(f"pip failed with code {result.returncode}: {what_went_wrong(result.stdout)}")
    if not seed or why:
        return None
    if listed is None:
        raise LayerBuildError("the seeded build did not say what it keeps of the image's layer")
    return Seeded(seed, kept_of(seed, listed), copied_ahead)


@dataclasses.dataclass(frozen=True)
class Seeded:
    """What a seeded build keeps of the image's layer: its .dist-info directories' names; copied: where the
    service copied the whole layer while pip ran (_CopyAhead), None if it did not."""

    seed: Path
    kept: tuple[str, ...]
    copied: Path | None = None


class _CopyAhead:
    """The seed's regular files copied into aside (root's, 0700: no build reaches it) in a thread, while pip runs:
    the copy (a few hundred files) overlaps the build instead of following it, and copy_seed then moves what is
    kept (a rename on the layer's filesystem). join(): aside once the copy is whole, None if it failed."""

    def __init__(self, seed: Path, aside: Path):
        self.seed, self.aside, self.error = os.path.realpath(seed), aside, None
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._copy, name="seed-copy", daemon=True)
        self.thread.start()

    def _copy(self) -> None:
        try:
            for directory, _dirs, files in os.walk(self.seed):
                for name in files:
                    if self.stopping.is_set():
                        return
                    path = os.path.join(directory, name)
                    if os.path.islink(path) or not os.path.isfile(path):
                        continue
                    copy = os.path.join(self.aside, os.path.relpath(path, self.seed))
                    os.makedirs(os.path.dirname(copy), mode=0o700, exist_ok=True)
                    shutil.copy2(path, copy)
        except OSError as exc:
            self.error = exc

    def join(self, stop: bool = False) -> Path | None:
        """stop: the build failed, the copy is not wanted: it stops at the next file (None)."""
        if stop:
            self.stopping.set()
        self.thread.join()
        if stop:
            return None
        if self.error is not None:
            log.warning("the image's layer could not be copied beside the build (it is copied after): %s", self.error)
            return None
        return self.aside


def kept_of(seed: Path, listed: str) -> tuple[str, ...]:
    """The seed's distributions the build listed: only names of .dist-info directories the seed has (the list is
    the build's, written by code from the package index)."""
    names = []
    for name in listed.splitlines():
        if not name.endswith(".dist-info") or "/" in name or name.startswith("."):
            raise LayerBuildError(f"the seeded build kept {name!r} of the image's layer: not a distribution")
        if not (seed / name).is_dir():
            raise LayerBuildError(f"the seeded build kept {name!r}, which the image's layer does not have")
        names.append(name)
    return tuple(names)


def copy_seed(seeded: Seeded, layer: Path) -> None:
    """The seed's distributions a seeded build keeps, copied from the image's layer into the new one (their files
    and bytecode, their scripts in bin/), beside what pip installed (which wins: nothing of it is overwritten);
    none of the others. The service copies them (from the image, not from the build), before the layer is
    compiled and in place: moved from its copy made while pip ran (Seeded.copied), where there is one."""
    seed = os.path.realpath(seeded.seed)
    wanted: set[str] = set()
    for name in seeded.kept:
        wanted |= seeding.files_of(os.path.join(seed, name), seed)
    for path in sorted(wanted):
        if not os.path.isfile(path) or os.path.islink(path) or not path.startswith(seed + os.sep):
            continue
        copy = os.path.join(layer, os.path.relpath(path, seed))
        _no_link_on_the_way(layer, copy)
        if os.path.lexists(copy):
            continue
        os.makedirs(os.path.dirname(copy), mode=0o755, exist_ok=True)
        _place(path, copy, seed, seeded.copied)
    for name in seeded.kept:  # a .dist-info directory's own files (RECORD names some, not all: INSTALLER...)
        for directory, _dirs, files in os.walk(os.path.join(seed, name)):
            for file in files:
                path = os.path.join(directory, file)
                copy = os.path.join(layer, os.path.relpath(path, seed))
                _no_link_on_the_way(layer, copy)
                if os.path.islink(path) or os.path.lexists(copy):
                    continue  # the build's (what pip installed wins), never written over: it may be a hard link
                os.makedirs(os.path.dirname(copy), mode=0o755, exist_ok=True)
                _place(path, copy, seed, seeded.copied)
    drop_cached(seed)  # the image's layer's pages this read (layers/store.py)


def _place(path: str, copy: str, seed: str, copied: Path | None) -> None:
    """The seed's file at path into the new layer at copy: its copy made while pip ran moved there (the same
    filesystem: a rename), or copied now."""
    if copied is not None:
        try:
            os.rename(os.path.join(copied, os.path.relpath(path, seed)), copy)
            return
        except OSError:
            pass  # not copied ahead (a file the walk did not see), or another filesystem
    shutil.copy2(path, copy)


def _no_link_on_the_way(layer: Path, path: str) -> None:
    """Raise LayerBuildError if path, under layer, is reached through a symbolic link or lands on one: the service
    copies the image's files in as root, and the build (code from the package index, as the build's uid) made the
    layer's entries; a link it left (`urllib3 -> /etc`) must not take a root's write elsewhere."""
    current = os.path.realpath(layer)
    for part in os.path.relpath(path, layer).split(os.sep):
        current = os.path.join(current, part)
        if os.path.islink(current):
            raise LayerBuildError(
                f"the build left a symbolic link at {os.path.relpath(current, layer)}, where the image's layer's "
                "distributions are copied: not followed"
            )
        if not os.path.exists(current):
            return


def finish(layer: Path, python: str, seeded: Seeded | None) -> None:
    """What the service does to a built layer before it is in place: the seed's part copied in, then compiled."""
    if seeded is not None:
        copy_seed(seeded, layer)
    compile_layer(layer, python)


# run by the runs' interpreter (its bytecode is theirs), as the service: every regular .py file under the layer,
# never one a symlink names (the build made the tree: a link to a file only root may read must not become
# bytecode others can), never through a __pycache__ that is not a directory of its own (removed first)
COMPILE = r"""
import importlib.util, os, py_compile, shutil, stat, sys
os.umask(0o022)
MODE, FLAGS = py_compile.PycInvalidationMode.UNCHECKED_HASH, (0b01).to_bytes(4, "little")
LARGEST = 8 << 20  # a source larger than this is left to be compiled at import (a build's file, read whole here)


def regular(path, flags=os.O_RDONLY):  # a descriptor of path if it is a regular file (never a link's, never a FIFO)
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


for directory, dirs, files in os.walk(sys.argv[1]):
    cache = os.path.join(directory, "__pycache__")
    if os.path.lexists(cache) and (os.path.islink(cache) or not os.path.isdir(cache)):
        os.unlink(cache)
    elif os.path.isdir(cache):  # what the build left there that is no regular file (a FIFO, a directory): gone
        for entry in os.scandir(cache):
            try:
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)
                elif not entry.is_file(follow_symlinks=False):
                    os.unlink(entry.path)
            except OSError:
                pass
    dirs[:] = [name for name in dirs if name != "__pycache__"]
    for name in files:
        path = os.path.join(directory, name)
        try:
            info = os.lstat(path)
            if not name.endswith(".py") or not stat.S_ISREG(info.st_mode) or info.st_size > LARGEST:
                continue
            cached = importlib.util.cache_from_source(path)
            fd, source_fd = regular(cached), regular(path)
            if fd is not None and source_fd is not None:  # compiled already, from this very source: kept
                with open(fd, "rb") as pyc, open(source_fd, "rb") as py:
                    fd = source_fd = None
                    if pyc.read(16) == importlib.util.MAGIC_NUMBER + FLAGS + importlib.util.source_hash(py.read()):
                        continue
            for left in (fd, source_fd):
                if left is not None:
                    os.close(left)
            py_compile.compile(path, invalidation_mode=MODE, doraise=False, quiet=2)
        except (OSError, ValueError, MemoryError, RecursionError):
            continue  # this file is imported from its source, as before; the others are compiled
"""


SEEDING = Path(seeding.__file__).read_text()  # run by the build's interpreter with -c, inside its jail
# pip options that change what counts as installed, or where an install goes: with one configured, no seeding
DOUBTFUL = {"target", "prefix", "root", "user", "home", "ignore-installed", "no-deps", "upgrade", "force-reinstall"}
DOUBTFUL |= {"require-hashes", "editable", "src", "upgrade-strategy", "no-build-isolation"}


def unseedable(text: str, configuration: list[str], env: dict[str, str]) -> str:
    """Why a build of these requirements (the build's own copy's text) may not start from the image's layer
    ("" if it may): a line that is not a plain named requirement (an option, an include, a URL, a path, an
    editable, a continued line), or pip configured (its configuration listing's lines, PIP_ variables) with an
    option that changes what counts as installed."""
    from packaging.requirements import InvalidRequirement, Requirement

    for raw in text.splitlines():
        if raw.rstrip().endswith("\\"):  # pip joins the next line to it before it drops a comment: never seeded
            return f"the line {raw.strip()!r} is continued"
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-") or line.endswith("\\"):
            return f"the line {line!r} is not a plain named requirement"
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            return f"the line {line!r} is not a plain named requirement"
        if requirement.url:
            return f"the line {line!r} names a URL"
    for line in configuration:
        name, _, _value = line.partition("=")
        if name.strip().rsplit(".", 1)[-1] in DOUBTFUL:
            return f"pip's configuration sets {name.strip()}"
    for name in env:
        if name.startswith("PIP_") and name[4:].lower().replace("_", "-") in DOUBTFUL:
            return f"{name} is set"
    return ""


def compile_layer(layer: Path, python: str) -> None:
    """The layer's bytecode, as the image's layers have it (Dockerfile: compileall --invalidation-mode
    unchecked-hash): runs read the layer read-only, and a zygote would otherwise compile every module it imports
    from source at each start. A layer is never written again, so the sources are not checked (unchecked-hash).
    Where it fails, runs compile as before: the log says so."""
    try:
        result = subprocess.run(
            [python, "-I", "-S", "-c", COMPILE, str(layer)], capture_output=True, text=True, timeout=600
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("the layer's bytecode was not compiled (runs compile what they import): %s", exc)
        return
    if result.returncode != 0:
        log.warning("the layer's bytecode was not compiled (runs compile what they import): %s", result.stderr[-2000:])


CONFIGURATION_CACHE = "pip-configuration.json"
# `pip config debug`'s line for each file pip reads its configuration from: `  /etc/pip.conf, exists: False`
_CONFIGURATION_FILE = re.compile(r"^  (/.*), exists: (?:True|False)$")


def pip_configuration(tools: list[str], cache_dir: str = "") -> list[str]:
    """pip's configuration listing (`pip config list`'s lines: unseedable, configured_paths and configured_urls read
    them), asked of the pip that builds run (tools: its package) once, and kept (rootfs.remembered: in cache_dir, and
    in the image's cache, which the image's build fills) under what decides it: the interpreter and that pip, the
    environment pip reads its files' places and its values from (PIP_, XDG_, HOME, VIRTUAL_ENV), and each file it
    reads (`pip config debug` names them, read or missing), as they were. A start on a new volume of the service's
    image then begins its build at once, instead of after a pip start (0.2 s) that lists what the image listed."""
    if not tools:
        return isolation.listing([sys.executable, "-m", "pip", "config", "list"])
    scope = sorted(
        (key, value)
        for key, value in os.environ.items()
        if key.startswith(("PIP_", "XDG_")) or key in ("HOME", "VIRTUAL_ENV")
    )
    salt = json.dumps([sys.prefix, scope])
    depends = [os.path.realpath(sys.executable), os.path.join(tools[0], "__init__.py")]
    return rootfs.remembered(CONFIGURATION_CACHE, depends, _configuration, _files_as_listed, cache_dir, salt)["lines"]


def _configuration() -> dict:
    """pip's listing, and the files it read: both asked at once (two pips side by side)."""
    from concurrent.futures import ThreadPoolExecutor

    ask = [sys.executable, "-m", "pip", "config"]
    started = time.time_ns()
    with ThreadPoolExecutor(2) as pool:
        debug, lines = pool.map(isolation.listing, (ask + ["debug"], ask + ["list"]))
    files = [match.group(1) for line in debug if (match := _CONFIGURATION_FILE.match(line))]
    # every file pip named, or none kept: a listing whose files are not all known is asked again at every build;
    # and none changed (or came) while pip listed them: the key, taken after, would name their new state with the
    # old listing. Asked again at the next build, then
    named = sum(", exists: " in line for line in debug)
    settled = all(_unchanged_since(path, started - _TIMESTAMP_SLACK_NS) for path in files)
    key = rootfs.portable_key(files) if files and named == len(files) and settled else ""
    return {"files": files, "key": key, "lines": lines}


_TIMESTAMP_SLACK_NS = 100_000_000  # a file's times are the kernel's coarse clock's: a tick or so behind the real one


def _unchanged_since(path: str, moment: int) -> bool:
    try:
        info = os.stat(path)
    except OSError:
        return True  # missing: its name alone is in the key, and a file that came since changes it
    return max(info.st_mtime_ns, info.st_ctime_ns) < moment


def _files_as_listed(known: object) -> bool:
    """A kept listing still holds: its files are as they were when it was listed (none changed, came or went)."""
    if not isinstance(known, dict) or not isinstance(known.get("lines"), list) or not known.get("key"):
        return False
    files = known.get("files")
    if not isinstance(files, list) or not files or not all(isinstance(path, str) for path in [*files, *known["lines"]]):
        return False
    return rootfs.portable_key(files) == known["key"]


def pip_package() -> list[str]:
    """The directory of the pip that builds run (the service's environment's: the first on its path)."""
    found = [os.path.join(p, "pip") for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    return [path for path in found if os.path.isfile(os.path.join(path, "__init__.py"))][:1]


def installed(layer: str) -> list[dict[str, str]]:
    """The distributions in a layer, with the versions their metadata gives."""
    if not layer or not os.path.isdir(layer):
        return []
    import importlib.metadata  # (what the layer holds is asked for later than the service's start)

    found = {}
    for dist in importlib.metadata.distributions(path=[layer]):
        name = dist.metadata["Name"]
        if name:
            found[name.lower()] = {"name": name, "version": dist.version}
    return [found[key] for key in sorted(found)]


INCLUDES = ("--requirement", "--constraint", "-r", "-c")  # a file named by these is relative to the one naming it


def copied(requirements: Path) -> str:
    """The requirements file's text, its includes made absolute (they then name the same files from a copy)."""
    lines = []
    for raw in requirements.read_text().splitlines():
        line = raw.strip()
        option = next((o for o in INCLUDES if line.startswith(o)), "")
        if option:
            named = line.removeprefix(option).lstrip("= ").split(" #", 1)[0].strip()
            raw = f"{option} {requirements.parent / named}"
        lines.append(raw + "\n")
    return "".join(lines)


def base_names(requirements: Path) -> set[str]:
    """The canonical names a requirements file asks for, following its `-r` includes (options are skipped)."""
    from packaging.requirements import InvalidRequirement, Requirement  # (a build's, not every start's)
    from packaging.utils import canonicalize_name

    names: set[str] = set()
    seen: set[Path] = set()

    def read(path: Path) -> None:
        path = path.resolve()
        if path in seen:
            return
        seen.add(path)
        try:
            text = path.read_text()
        except OSError:
            return
        for raw in text.splitlines():
            line = raw.split(" #", 1)[0].strip()
            if not line or line.startswith("#"):
                continue
            include = ""
            if line.startswith("--requirement"):
                include = line.removeprefix("--requirement").lstrip("= ").strip()
            elif line.startswith("-r"):
                include = line.removeprefix("-r").strip()
            if include:
                read(path.parent / include)
                continue
            if line.startswith("-"):
                continue
            try:
                names.add(canonicalize_name(Requirement(line).name))
            except InvalidRequirement:
                continue

    read(requirements)
    return names
