"""A Python layer build seeded with the layer the image carries: run inside the build's jail (layers/isolation.py)
as `python -S -c <this file> SEED TARGET PIP_SITE REQUIREMENTS pip-arguments...`.

`pip install --target` takes nothing as installed. dify-sandbox's image has its default packages preinstalled,
and an operator's dependencies file installs only what they do not satisfy; so here: the image's layer (SEED)
is copied into the new layer (TARGET), pip runs with TARGET as the only place distributions are installed (not
the service's own environment: its pydantic or anyio never count) and installs the rest into a prefix of its own
(`--prefix`: installed distributions count), which is then moved into TARGET as `--target` would have. A
distribution pip replaces (a pin the image's version does not satisfy) is uninstalled from TARGET by pip, and
any copy it left is removed. Last, every distribution no requirement reaches is removed: the layer holds what a
fresh build would, by name, with the image's versions where they satisfy.

Only the standard library and pip's own vendored packaging are imported: the service's environment is not on
the build's path.
"""

from __future__ import annotations

import csv
import importlib.util
import os
import shutil
import sys
import sysconfig

PREFIX = ".sandlot-prefix"  # pip's own install prefix, inside TARGET; gone before the build ends


def main(argv: list[str]) -> int:
    seed, target, pip_site, requirements, *pip_args = argv
    shutil.copytree(seed, target, symlinks=True, dirs_exist_ok=True)
    sys.path.insert(0, pip_site)
    from pip._internal.cli.main import main as pip

    # pip is imported (its modules are found through its package from now on): the only installed
    # distributions are the seed's, now in target; the rest of the path is the standard library
    sys.path[:] = [target, *standard_library(sys.path)]
    code = pip(pip_args)
    if code != 0:
        return code
    seeded = set(distributions(target))
    installed = move_in(os.path.join(target, PREFIX), target)
    keep = reached(requirements, target)
    for name, dists in distributions(target).items():  # the seed's that nothing asks for: not in a fresh build
        if name in seeded - installed - keep:
            for dist in dists:
                remove(dist, target)
    return 0


def standard_library(path: list[str]) -> list[str]:
    stdlib = {os.path.realpath(sysconfig.get_path(name)) for name in ("stdlib", "platstdlib")}
    return [p for p in path if p and (os.path.realpath(p) in stdlib or p.endswith(("lib-dynload", ".zip")))]


def move_in(prefix: str, target: str) -> set[str]:
    """What pip installed under prefix, moved into target as --target lays it out (the distributions at the top,
    the scripts in bin/, other data beside); the canonical names of the distributions moved."""
    if not os.path.isdir(prefix):
        return set()
    sites = []
    for dirpath, dirnames, _files in os.walk(prefix):
        for name in list(dirnames):
            if name in ("site-packages", "dist-packages"):
                sites.append(os.path.join(dirpath, name))
                dirnames.remove(name)
    installs = [(site, entry) for site in sites for entry in os.listdir(site)]
    names = {dist_name(entry) for _site, entry in installs if entry.endswith(".dist-info")}
    existing = distributions(target)
    for name in names:  # replaced (a pin the seed's version does not satisfy): any copy pip left goes first
        for dist in existing.get(name, []):
            remove(dist, target)
    for site, entry in installs:
        merge(os.path.join(site, entry), os.path.join(target, entry))
    for entry in os.listdir(prefix):
        if entry not in ("lib", "lib64"):
            merge(os.path.join(prefix, entry), os.path.join(target, entry))
    shutil.rmtree(prefix)
    return names


def merge(source: str, destination: str) -> None:
    if os.path.isdir(source) and not os.path.islink(source) and os.path.isdir(destination):
        for entry in os.listdir(source):
            merge(os.path.join(source, entry), os.path.join(destination, entry))
        return
    if os.path.lexists(destination):
        if os.path.isdir(destination) and not os.path.islink(destination):
            shutil.rmtree(destination)
        else:
            os.unlink(destination)
    os.rename(source, destination)


def dist_name(entry: str) -> str:
    """The canonical name of a `name-version.dist-info` directory."""
    from pip._vendor.packaging.utils import canonicalize_name

    return canonicalize_name(entry[: -len(".dist-info")].rsplit("-", 1)[0])


def distributions(target: str) -> dict[str, list[str]]:
    """Canonical name -> the .dist-info directories in target."""
    found: dict[str, list[str]] = {}
    for entry in sorted(os.listdir(target)):
        path = os.path.join(target, entry)
        if entry.endswith(".dist-info") and os.path.isdir(path) and not os.path.islink(path):
            found.setdefault(dist_name(entry), []).append(path)
    return found


def metadata(dist: str) -> tuple[str, list[str]]:
    """A distribution's name and requirements, from its METADATA."""
    import email.parser

    with open(os.path.join(dist, "METADATA"), "rb") as f:
        message = email.parser.BytesParser().parse(f, headersonly=True)
    return str(message.get("Name", "")), [str(r) for r in message.get_all("Requires-Dist") or []]


def reached(requirements: str, target: str) -> set[str]:
    """The canonical names of the distributions in target that the requirements file's lines (plain named
    requirements only: the service checked) reach, through their dependencies, extras and markers."""
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name

    dists = {name: paths[-1] for name, paths in distributions(target).items()}
    pending: list[tuple[str, frozenset[str]]] = []
    with open(requirements) as f:
        for raw in f:
            line = raw.split(" #", 1)[0].strip()
            if line and not line.startswith("#"):
                requirement = Requirement(line)
                if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                    pending.append((canonicalize_name(requirement.name), extras_of(requirement)))
    keep: set[str] = set()
    seen: set[tuple[str, frozenset[str]]] = set()
    while pending:
        name, extras = pending.pop()
        if (name, extras) in seen or name not in dists:
            continue
        seen.add((name, extras))
        keep.add(name)
        for line in metadata(dists[name])[1]:
            requirement = Requirement(line)
            marker = requirement.marker
            if marker is None or any(marker.evaluate({"extra": extra}) for extra in ("", *sorted(extras))):
                pending.append((canonicalize_name(requirement.name), extras_of(requirement)))
    return keep


def extras_of(requirement) -> frozenset[str]:
    """Its extras as written and as canonical names (a marker compares `extra` to either)."""
    from pip._vendor.packaging.utils import canonicalize_name

    return frozenset({*requirement.extras, *(canonicalize_name(extra) for extra in requirement.extras)})


def remove(dist: str, target: str) -> None:
    """A distribution's files in target (its RECORD's: a script's entry, `../../bin/x` as --target writes it,
    is target/bin/x), their bytecode, its .dist-info, and the directories that leaves empty."""
    root = os.path.realpath(target)
    files = []
    try:
        with open(os.path.join(dist, "RECORD"), newline="") as f:
            files = [row[0] for row in csv.reader(f) if row]
    except (OSError, csv.Error):
        pass
    parents = set()
    for entry in files:
        path = os.path.normpath(os.path.join(root, entry))
        if not path.startswith(root + os.sep):
            if os.path.basename(os.path.dirname(path)) != "bin":
                continue
            path = os.path.join(root, "bin", os.path.basename(path))
        for doomed in (path, importlib.util.cache_from_source(path) if path.endswith(".py") else ""):
            if doomed and os.path.lexists(doomed) and not os.path.isdir(doomed):
                os.unlink(doomed)
                parents.add(os.path.dirname(doomed))
    shutil.rmtree(dist, ignore_errors=True)
    for directory in sorted(parents, key=len, reverse=True):  # deepest first
        while directory.startswith(root + os.sep):
            try:
                os.rmdir(directory)
            except OSError:
                break
            directory = os.path.dirname(directory)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
