"""The Node.js layer: `npm install` from a package.json (and its lock) into node_modules.

The package.json (layers/nodejs/package.json or SANDLOT_NODEJS_PACKAGE) is the base;
requested packages (layers/packages.py) are added to its `dependencies` (a requested
range replaces the base's for the same name) in the copy the build installs from.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from layers import isolation
from layers.store import LayerBuildError, drop_cached, what_went_wrong
from runtimes.languages import NODEJS
from runtimes.linux import rootfs

if TYPE_CHECKING:
    from layers.manager import Layer

DEFAULT_PACKAGE = NODEJS.default_base_file()  # layers/nodejs/package.json
DEFAULT_REGISTRY = "https://registry.npmjs.org/"
REGISTRY_KEYS = ("registry", "proxy", "https-proxy")


def package_files(configured: str = "") -> list[Path]:
    package = Path(configured).resolve() if configured else DEFAULT_PACKAGE
    lock = package.with_name("package-lock.json")
    return [package, lock] if lock.is_file() else [package]


def managed_layer(settings, data_dir: Path) -> Layer | None:
    """The Node.js layer of a service (settings: the service's), or None without node: its store under
    data_dir/layers/nodejs, built from the package.json, with the packages an operator asked for on top (kept in
    data_dir/packages)."""
    from layers.manager import Layer
    from layers.requested import RequestedPackages
    from layers.store import LayerStore, image_layers

    node = os.path.realpath(settings.NODEJS_PATH)
    if not os.access(node, os.X_OK):
        return None
    packages = lambda: package_files(settings.SANDLOT_NODEJS_PACKAGE)  # noqa: E731
    requested = RequestedPackages(NODEJS.wire_name, data_dir / "packages" / f"{NODEJS.wire_name}.json")
    store = LayerStore(
        data_dir / "layers" / NODEJS.folder,
        sources=packages,
        build=lambda scratch, wanted, output, _aside: build(
            packages(), scratch, node, settings.build_uid, requested=wanted, on_output=output
        ),
        salt=node,
        requested=requested.render,
        baked=image_layers(NODEJS.folder),  # the defaults the service image carries (Dockerfile)
        build_uid=lambda: settings.build_uid,
    )
    return Layer(
        store,
        installed,
        packages=requested,
        base_names=lambda: base_names(packages()[0]),
        base_file=lambda: str(packages()[0]),
    )


def build(
    files: list[Path],
    scratch: Path,
    node: str,
    build_uid: int,
    requested: dict[str, str] | None = None,
    on_output: Callable[[bytes], None] | None = None,
) -> None:
    """npm ci (with a lock) or npm install into scratch/node_modules; packages' scripts never run. requested:
    name -> range (validated: layers/specs.py), added to the package.json's dependencies; then the lock only
    guides npm install (npm ci would refuse a package.json that no longer matches it)."""
    npm_cli = _npm_cli(node)
    for file in files:
        shutil.copy(file, scratch / file.name)
    if requested:
        (scratch / "package.json").write_text(json.dumps(merged_package(files[0], requested), indent=2) + "\n")
    verb = "ci" if (scratch / "package-lock.json").is_file() and not requested else "install"
    argv = [node, npm_cli, verb, "--omit=dev", "--ignore-scripts", "--no-audit", "--no-fund", "--no-update-notifier"]
    readable = [node, os.path.dirname(os.path.dirname(npm_cli)), *(str(f.parent) for f in files)]
    readable += local_sources(files[0])
    readable += [spec.removeprefix("file:") for spec in (requested or {}).values() if spec.startswith("file:/")]
    configuration = configuration_listing(node, npm_cli)
    readable += isolation.configured_paths(configuration)
    env = {k: v for k, v in os.environ.items() if k.startswith("npm_config_") or k.lower().endswith("_proxy")}
    env.update({"HOME": str(scratch), "LANG": "C.UTF-8", "PATH": os.path.dirname(node)})
    configured = isolation.configured_urls(configuration, REGISTRY_KEYS)
    registry = env.get("npm_config_registry") or DEFAULT_REGISTRY
    reaches = isolation.reached([registry, *configured, *isolation.proxies(env)])
    result = isolation.run(argv, str(scratch), readable, env, build_uid, on_output, reaches=reaches)
    # npm runs on node three times a build, reading some 80 MB of the binary: in the chroot jail on a container's
    # overlayfs runs exec the tree's copy of node (jail/trees/tree_store.py), so those pages, charged to the container,
    # would only be read again by the next build; elsewhere the ready children map what runs use of it, which stays
    rootfs.forget_cached_pages(node)
    drop_cached(os.path.dirname(os.path.dirname(npm_cli)))  # npm's own files, as node's (layers/store.py)
    if result.returncode != 0:
        raise LayerBuildError(f"npm failed with code {result.returncode}: {what_went_wrong(result.stdout)}")
    (scratch / "node_modules").mkdir(exist_ok=True)
    shutil.rmtree(scratch / ".npm", ignore_errors=True)  # npm's cache and logs (HOME is scratch): not for runs


def configuration_listing(node: str, npm_cli: str) -> list[str]:
    """`npm config list` as the service (its HOME: the operator's ~/.npmrc is read), leaving nothing behind: npm
    would write its debug log and the update notifier's state under ~/.npm at every build. Its cache is a
    directory of its own, gone before the lines are read (so not a path the build is given), no log file is
    kept, no update is looked for."""
    cache = tempfile.mkdtemp(prefix="sandlot-npm-listing-")
    quiet = {"npm_config_cache": cache, "npm_config_logs_max": "0", "npm_config_update_notifier": "false"}
    try:
        return isolation.listing([node, npm_cli, "config", "list"], env={**os.environ, **quiet})
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def merged_package(package: Path, requested: dict[str, str]) -> dict:
    """The base package.json with the requested packages in its dependencies; its relative `file:` specs made
    absolute (the build installs from a copy elsewhere)."""
    try:
        meta = json.loads(package.read_text())
    except (OSError, ValueError) as exc:
        raise LayerBuildError(f"{package}: {exc}") from exc
    if not isinstance(meta, dict):
        raise LayerBuildError(f"{package}: not a JSON object")
    for section in ("dependencies", "optionalDependencies"):
        for name, spec in list((meta.get(section) or {}).items()):
            if isinstance(spec, str) and spec.startswith("file:") and not spec.startswith("file:/"):
                meta[section][name] = "file:" + str((package.parent / spec.removeprefix("file:")).resolve())
    dependencies = dict(meta.get("dependencies") or {})
    for name, spec in requested.items():
        (meta.get("optionalDependencies") or {}).pop(name, None)
        dependencies[name] = spec
    meta["dependencies"] = dependencies
    return meta


def base_names(package: Path) -> set[str]:
    """The packages a package.json asks for (dependencies and optionalDependencies)."""
    try:
        meta = json.loads(package.read_text())
    except (OSError, ValueError):
        return set()
    if not isinstance(meta, dict):
        return set()
    return {name for section in ("dependencies", "optionalDependencies") for name in (meta.get(section) or {})}


def local_sources(package: Path) -> list[str]:
    """Paths that `file:` dependencies name: the build must be able to read them."""
    try:
        meta = json.loads(package.read_text())
    except (OSError, ValueError) as exc:
        raise LayerBuildError(f"{package}: {exc}") from exc
    found = []
    for section in ("dependencies", "optionalDependencies"):
        for spec in (meta.get(section) or {}).values():
            if isinstance(spec, str) and spec.startswith("file:"):
                path = (package.parent / spec.removeprefix("file:")).resolve()
                if path.exists():
                    found.append(str(path))
    return found


def _npm_cli(node: str) -> str:
    for candidate in (
        os.path.join(os.path.dirname(os.path.dirname(node)), "lib", "node_modules", "npm", "bin", "npm-cli.js"),
        "/usr/lib/node_modules/npm/bin/npm-cli.js",
        "/usr/share/nodejs/npm/bin/npm-cli.js",
    ):
        if os.path.isfile(candidate):
            return candidate
    which = shutil.which("npm")
    if which:
        return os.path.realpath(which)
    raise LayerBuildError("npm is not installed next to node")


def modules_dir(layer: str) -> str:
    return os.path.join(layer, "node_modules") if layer else ""


def installed(layer: str) -> list[dict[str, str]]:
    """Top-level packages in the layer's node_modules, with their package.json versions."""
    root = modules_dir(layer)
    if not root or not os.path.isdir(root):
        return []
    found = []
    for entry in sorted(os.listdir(root)):
        if entry.startswith("."):
            continue
        paths = (
            [os.path.join(root, entry, e) for e in sorted(os.listdir(os.path.join(root, entry)))]
            if entry.startswith("@")
            else [os.path.join(root, entry)]
        )
        for path in paths:
            try:
                with open(os.path.join(path, "package.json")) as f:
                    meta = json.load(f)
            except (OSError, ValueError):
                continue
            found.append({"name": meta.get("name", os.path.basename(path)), "version": meta.get("version", "")})
    return found
