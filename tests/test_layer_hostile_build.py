"""What a hostile package (an sdist's setup.py, run as the build's uid) can leave in a new Python layer, and what
the service (root) then does to it: make_readable, copy_seed (a seeded build's copy of the image's layer) and
the compile step. Each expected failure is a weakness found on main, with the fix it needs."""

from __future__ import annotations

import importlib.util
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import needs_root
from test_layer_seed import ALPHA, BETA, holds, image_layer, seeded_build  # noqa: F401 - image_layer: test_layer_seed's fixture
from test_layers import BUILD_UID, make_wheel, readable

from layers.store import make_readable
from runtimes.python import layer as python_layer


@pytest.fixture
def place():
    """One filesystem for the layer and the file outside it (a hard link cannot cross filesystems)."""
    path = Path(tempfile.mkdtemp(prefix="sandlot-hostile-", dir="/var/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def root_only(place: Path, text: str = "SECRET = 'root only'\n") -> Path:
    """A file of root's outside the layer that nobody else may read (/etc/shadow, an operator's secrets)."""
    outside = place / "outside"
    outside.mkdir(mode=0o700)
    secret = outside / "secret.py"
    secret.write_text(text)
    secret.chmod(0o600)
    return secret


@needs_root
def test_a_hard_link_the_build_left_is_not_made_readable(place):
    secret = root_only(place)
    layer = place / "layer"
    (layer / "pkg").mkdir(parents=True)
    # what the build's uid does in setup.py where the kernel lets anyone link anything: os.link(secret, ...)
    os.link(secret, layer / "pkg" / "leak.py")

    try:
        make_readable(layer)
    except Exception:
        pass  # a refusal (the build fails, saying where) is the fix
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600, "root made a root-only file outside the layer readable"


@needs_root
def test_copy_seed_never_writes_through_a_hard_link_the_build_left(place):
    victim = root_only(place, "the operator's file\n")
    seed = place / "seed"
    info = seed / "foo-1.0.dist-info"
    info.mkdir(parents=True)
    (seed / "foo").mkdir()
    (seed / "foo" / "__init__.py").write_text("")
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: foo\nVersion: 1.0\n")
    (info / "RECORD").write_text("foo/__init__.py,,\nfoo-1.0.dist-info/METADATA,,\nfoo-1.0.dist-info/RECORD,,\n")
    layer = place / "layer"
    (layer / "foo-1.0.dist-info").mkdir(parents=True)
    os.link(victim, layer / "foo-1.0.dist-info" / "METADATA")  # the build's, as above

    try:
        python_layer.copy_seed(python_layer.Seeded(seed, ("foo-1.0.dist-info",)), layer)
    except Exception:
        pass  # a refusal is the fix
    assert victim.read_text() == "the operator's file\n", "root wrote the image's METADATA into a file outside"
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600


def test_a_fifo_the_build_left_does_not_hang_the_compile_step(place):
    layer = place / "layer"
    layer.mkdir()
    module = layer / "m.py"
    module.write_text("X = 1\n")
    cached = Path(importlib.util.cache_from_source(str(module)))
    cached.parent.mkdir()
    os.mkfifo(cached)  # setup.py: mknod is not refused to the build

    # compile_layer's own command, with a timeout a test can wait for
    try:
        result = subprocess.run(
            [sys.executable, "-I", "-S", "-c", python_layer.COMPILE, str(layer)],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the compile step hung on a FIFO the build left")
    assert result.returncode == 0, result.stderr
    assert cached.is_file() and not stat.S_ISFIFO(cached.lstat().st_mode)


def test_giving_a_slot_does_not_touch_what_other_slots_see_of_the_dev_stand_in(place):
    import time

    from runtimes.jail.trees import image_trees

    root = place / "tree"
    (root / "dev").mkdir(parents=True)
    stand_in = root / "dev" / "null"  # materialized: where device nodes cannot be made, an empty read-only file
    stand_in.write_text("")
    stand_in.chmod(0o444)
    slots = [root / "slots" / str(n) for n in range(2)]
    for slot in slots:
        (slot / "dev").mkdir(parents=True)
        os.link(stand_in, slot / "dev" / "null")
    seen = os.stat(slots[0] / "dev" / "null")  # what a run in slot 0 sees of its /dev/null

    time.sleep(0.05)
    image_trees._prepare(str(root), str(slots[1]))  # slot 1 given to another uid

    now = os.stat(slots[0] / "dev" / "null")
    assert now.st_nlink == seen.st_nlink
    assert now.st_ctime_ns == seen.st_ctime_ns, "a run in slot 0 sees when slot 1 changed hands"


# an sdist with an in-tree build backend (PEP 517: nothing to fetch): what it runs, as the build's uid, leaves a FIFO
# where the compile step looks for a module's bytecode, in the new layer (the build's HOME)
BACKEND = """
import importlib.util, os, zipfile


def get_requires_for_build_wheel(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    layer = os.environ["HOME"]
    with open(os.path.join(layer, "hostile_mod.py"), "w") as f:
        f.write("X = 1\\n")
    os.makedirs(os.path.join(layer, "__pycache__"), exist_ok=True)
    os.mkfifo(importlib.util.cache_from_source(os.path.join(layer, "hostile_mod.py")))
    info = "hostile-1.0.dist-info/"
    name = "hostile-1.0-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as wheel:
        wheel.writestr(info + "METADATA", "Metadata-Version: 2.1\\nName: hostile\\nVersion: 1.0\\n")
        tags = "Wheel-Version: 1.0\\nGenerator: x\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"
        wheel.writestr(info + "WHEEL", tags)
        wheel.writestr(info + "RECORD", f"{info}METADATA,,\\n{info}WHEEL,,\\n{info}RECORD,,\\n")
    return name
"""


@needs_root
def test_a_hostile_sdist_does_not_stall_the_finishing_of_its_layer(place, monkeypatch):
    import tarfile
    import time

    source = place / "src" / "hostile-1.0"
    source.mkdir(parents=True)
    (source / "backend.py").write_text(BACKEND)
    (source / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n'
    )
    (source / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: hostile\nVersion: 1.0\n")
    house = place / "house"
    house.mkdir()
    with tarfile.open(house / "hostile-1.0.tar.gz", "w:gz") as sdist:
        sdist.add(source, arcname="hostile-1.0")
    requirements = place / "requirements.txt"
    requirements.write_text("hostile\n")
    layer = place / "layer"
    layer.mkdir()
    readable(place)
    seeded = python_layer.build(requirements, layer, BUILD_UID, find_links=str(house))
    assert stat.S_ISFIFO(os.lstat(importlib.util.cache_from_source(str(layer / "hostile_mod.py"))).st_mode)

    real_run = subprocess.run

    def capped(*args, **kwargs):  # compile_layer's 600 s, made one a test waits for
        kwargs["timeout"] = min(kwargs.get("timeout") or 15, 15)
        return real_run(*args, **kwargs)

    monkeypatch.setattr(python_layer.subprocess, "run", capped)
    started = time.monotonic()
    python_layer.finish(layer, sys.executable, seeded)
    assert time.monotonic() - started < 10, "the service's compile step waited on the build's FIFO"
    cached = importlib.util.cache_from_source(str(layer / "hostile_mod.py"))
    assert stat.S_ISREG(os.lstat(cached).st_mode), "the layer was left uncompiled"


@needs_root
def test_a_seeded_layer_holds_what_pip_reads_of_the_requirements(place, request):
    image = request.getfixturevalue("image_layer")  # test_layer_seed's: alpha (needs beta) and omega
    house = place / "index"
    house.mkdir()
    make_wheel(house, ALPHA, "1.0", {"seed_alpha.py": "ORIGIN = 'index'\n"}, (f"{BETA}>=1",))
    make_wheel(house, BETA, "1.0", {"seed_beta/__init__.py": "ORIGIN = 'index'\n"})
    lines = f"{ALPHA}  # the image's \\\nsandlot-seed-omega\n"
    layer, _ = seeded_build(place, lines, house, image)  # a continued line: built as before, from the index
    assert holds(layer) == {ALPHA: "1.0", BETA: "1.0"}  # pip reads one requirement: alpha (and beta, its own)
