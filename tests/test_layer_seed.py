"""A Python layer as runs read it: compiled before it is in place, its build's page cache dropped, and seeded
from the layer the image carries (an operator's addition installs only what that layer does not hold)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import needs_root
from test_layers import BUILD_UID, make_wheel, readable

from layers.store import LayerStore
from runtimes.python import layer as python_layer


@pytest.fixture
def place():
    """Somewhere a build's uid reaches by the real path (not pytest's root-only /tmp/pytest-of-root)."""
    path = Path(tempfile.mkdtemp(prefix="sandlot-seed-", dir="/var/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def service_settings(requirements: Path, wheels: Path) -> SimpleNamespace:
    return SimpleNamespace(
        PYTHON_PATH=sys.executable,
        SANDLOT_PYTHON_REQUIREMENTS=str(requirements),
        PIP_MIRROR_URL="",
        SANDLOT_PIP_FIND_LINKS=str(wheels),
        build_uid=BUILD_UID,
    )


def valid_unchecked_pyc(source: Path) -> bool:
    cached = Path(importlib.util.cache_from_source(str(source)))
    if not cached.is_file():
        return False
    data = cached.read_bytes()
    flags = int.from_bytes(data[4:8], "little")
    return (
        data[:4] == importlib.util.MAGIC_NUMBER
        and flags == 0b01  # hash-based, not checked against the source: runs never write the layer
        and data[8:16] == importlib.util.source_hash(source.read_bytes())
    )


@needs_root
def test_a_built_layer_is_compiled_before_it_is_in_place(place):
    wheels = place / "wheels"
    wheels.mkdir()
    make_wheel(wheels, "sandlot-compiled", "1.0", {"sandlot_compiled/__init__.py": "VALUE = 1\n"})
    requirements = place / "requirements.txt"
    requirements.write_text("sandlot-compiled\n")
    readable(place)
    layer = python_layer.managed_layer(service_settings(requirements, wheels), place / "data")
    built = Path(layer.store.ensure())
    source = built / "sandlot_compiled" / "__init__.py"
    assert valid_unchecked_pyc(source)  # a zygote imports it without compiling (its tree is read-only)
    cache = source.parent / "__pycache__"
    for path in (cache, *cache.iterdir()):
        info = os.lstat(path)
        assert info.st_uid == 0 and not info.st_mode & 0o022  # root's, like the rest of the layer


def test_compiling_skips_what_a_symlink_names_and_a_pycache_that_is_not_a_directory(place):
    layer = place / "layer"
    (layer / "pkg").mkdir(parents=True)
    (layer / "pkg" / "mod.py").write_text("X = 1\n")
    secret = place / "secret.py"
    secret.write_text("SECRET = 'only root reads this'\n")
    secret.chmod(0o600)
    (layer / "pkg" / "linked.py").symlink_to(secret)  # a build may leave links to files only root may read
    elsewhere = place / "elsewhere"
    elsewhere.mkdir()
    (layer / "__pycache__").symlink_to(elsewhere)  # nor may bytecode be written through a link
    (layer / "top.py").write_text("Y = 2\n")
    python_layer.compile_layer(layer, sys.executable)
    assert valid_unchecked_pyc(layer / "pkg" / "mod.py")
    assert valid_unchecked_pyc(layer / "top.py")
    assert not (layer / "__pycache__").is_symlink()
    assert not list(elsewhere.iterdir())
    assert not Path(importlib.util.cache_from_source(str(layer / "pkg" / "linked.py"))).exists()


def test_a_store_finishes_a_build_before_renaming_it_into_place(place):
    seen = []

    def build(scratch: Path, *_: object) -> None:
        (scratch / "m.py").write_text("Z = 3\n")

    def finish(scratch: Path) -> None:
        seen.append((scratch.name.endswith(".build"), stat.S_IMODE(os.stat(scratch / "m.py").st_mode)))

    LayerStore(place / "store", lambda: [], build, finish=finish).ensure()
    assert seen == [(True, 0o644)]  # in the scratch directory, already read-only to others


def cached_bytes(root: Path) -> int:
    """What the page cache holds of the regular files under root (fincore, util-linux)."""
    files = [str(p) for p in root.rglob("*") if p.is_file() and not p.is_symlink()]
    result = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", *files], capture_output=True)
    return sum(int(line) for line in result.stdout.split())


@needs_root
@pytest.mark.skipif(not shutil.which("fincore"), reason="needs fincore (util-linux) to read the page cache")
def test_a_build_leaves_no_page_cache_of_its_layer_or_of_pip(place):
    wheels = place / "wheels"
    wheels.mkdir()
    make_wheel(wheels, "sandlot-cached", "1.0", {"sandlot_cached/__init__.py": "VALUE = 'x' * 100000\n" * 4})
    requirements = place / "requirements.txt"
    requirements.write_text("sandlot-cached\n")
    readable(place)
    layer = python_layer.managed_layer(service_settings(requirements, wheels), place / "data")
    built = Path(layer.store.ensure())
    layer.store.settling.join(30)
    assert cached_bytes(built) == 0  # written, flushed, dropped: a container is not charged for it at rest
    (pip,) = python_layer.pip_package()
    assert cached_bytes(Path(pip)) == 0  # pip's own files, which the build read
