"""A Python layer build seeded with the layer the image carries: run inside the build's jail (layers/isolation.py)
as `python -S -c <this file> SEED TARGET PIP_SITE REQUIREMENTS pip-arguments...`.

`pip install --target` takes nothing as installed. dify-sandbox's image has its default packages preinstalled,
and an operator's dependencies file installs only what they do not satisfy; so here pip runs with the image's
layer (SEED, read-only) as the only place distributions are installed (not the service's own environment: its
pydantic or anyio never count), and installs the rest into a prefix of its own (`--prefix`: installed
distributions count), which is then moved into TARGET as `--target` would lay it out. pip uninstalls nothing
(the seed is the image's): a distribution it replaces (a pin the seed's version does not satisfy) is simply not
among those kept. Last, it writes KEPT into TARGET: the seed's distributions (their .dist-info names) that the
requirements reach and pip did not replace. The service copies those from the image's layer into the new layer
(runtimes/python/layer.py: copy_seed), which then holds what a fresh build would, by name, with the image's
versions where they satisfy.

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
KEPT = ".sandlot-seeded"  # the seed's .dist-info names to copy in, one a line; read and removed by the service


def main(argv: list[str]) -> int:
    seed, target, pip_site, requirements, *pip_args = argv
    sys.path.insert(0, pip_site)
    from pip._internal.cli.main import main as pip

    try:
        from pip._internal.req.req_install import InstallRequirement
    except ImportError:  # another pip: replacing one of the seed's fails (read-only), and says so
        pass
    else:

        def left_out(self, auto_confirm: bool = False, verbose: bool = False) -> None:
            print(f"{self.name}: the image's copy is left out of the new layer")

        InstallRequirement.uninstall = left_out  # the seed is read-only: what pip replaces there is not kept
    # pip is imported (its modules are found through its package from now on): the only installed
    # distributions are the seed's; the rest of the path is the standard library
    sys.path[:] = [seed, *standard_library(sys.path)]
    code = pip(pip_args)
    if code != 0:
        return code
    installed = move_in(os.path.join(target, PREFIX), target)
    seeded = distributions(seed)
    dists = {name: paths[-1] for name, paths in seeded.items()}
    dists.update({name: paths[-1] for name, paths in distributions(target).items()})  # pip's own over the seed's
    keep = reached(requirements, dists)
    with open(os.path.join(target, KEPT), "w") as kept:
        for name in sorted(keep - installed):
            for dist in seeded.get(name, []):
                kept.write(os.path.basename(dist) + "\n")
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


def reached(requirements: str, dists: dict[str, str]) -> set[str]:
    """The canonical names of the distributions (name -> .dist-info) that the requirements file's lines (plain
    named requirements only: the service checked) reach, through their dependencies, extras and markers."""
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name

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


def files_of(dist: str, root: str) -> set[str]:
    """The paths under root of a distribution's files (its RECORD's: a script's entry, `../../bin/x` as --target
    writes it, is root/bin/x), their bytecode, and its .dist-info."""
    root = os.path.realpath(root)
    files = {os.path.join(root, os.path.basename(dist))}
    try:
        with open(os.path.join(dist, "RECORD"), newline="") as f:
            entries = [row[0] for row in csv.reader(f) if row]
    except (OSError, csv.Error):
        entries = []
    for entry in entries:
        path = os.path.normpath(os.path.join(root, entry))
        if not path.startswith(root + os.sep):
            if os.path.basename(os.path.dirname(path)) != "bin":
                continue
            path = os.path.join(root, "bin", os.path.basename(path))
        files.add(path)
        if path.endswith(".py"):
            files.add(importlib.util.cache_from_source(path))
    return files


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
