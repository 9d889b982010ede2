"""A Python layer as runs read it: compiled before it is in place, its build's page cache dropped, and seeded
from the layer the image carries (an operator's addition installs only what that layer does not hold)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import unprivileged
from conftest import needs_root
from service import DOCKER_DEFAULT, standin
from test_build_isolation import LANDLOCK_ABI, RESTRICTED_POD
from test_layers import BUILD_UID, make_wheel, readable

from layers import store as store_module
from layers.store import LayerBuildError, LayerStore
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
    (layer / "pkg" / "stale.py").write_text("S = 1\n")
    python_layer.compile_layer(layer, sys.executable)
    compiled = Path(importlib.util.cache_from_source(str(layer / "pkg" / "mod.py")))
    kept = compiled.stat().st_mtime_ns
    (layer / "pkg" / "stale.py").write_text("S = 2\n")  # its bytecode no longer matches: compiled again
    python_layer.compile_layer(layer, sys.executable)
    assert valid_unchecked_pyc(layer / "pkg" / "stale.py")
    assert compiled.stat().st_mtime_ns == kept  # valid bytecode of the same source (a seeded copy's) is kept
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
def test_a_build_leaves_no_page_cache_of_its_layer_or_of_pip(place, monkeypatch):
    monkeypatch.setattr(store_module, "SETTLE_SECONDS", 0.0)  # not after the runtime's start: now
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


# ---- seeding: an operator's addition starts from the layer the image carries ------------------------------------


wheel = make_wheel  # (test_layers.py)


ALPHA, BETA, GAMMA, OMEGA = "sandlot-seed-alpha", "sandlot-seed-beta", "sandlot-seed-gamma", "sandlot-seed-omega"


def alpha(house: Path, origin: str) -> None:
    wheel(house, ALPHA, "1.0", {"seed_alpha.py": f"ORIGIN = {origin!r}\n"}, (f"{BETA}>=1",))


def beta(house: Path, version: str, origin: str) -> None:
    wheel(house, BETA, version, {"seed_beta/__init__.py": f"VERSION = {version!r}\nORIGIN = {origin!r}\n"})


@pytest.fixture
def image_layer(place):
    """The layer an image carries: alpha (which needs beta) and omega, built as the image's build builds it."""
    house = place / "image-wheels"
    house.mkdir()
    alpha(house, "image")
    beta(house, "1.0", "image")
    wheel(house, OMEGA, "1.0", {"seed_omega.py": "X = 1\n"})
    requirements = place / "image-requirements.txt"
    requirements.write_text(f"{ALPHA}\n{OMEGA}\n")
    layer = place / "image" / "python" / "0123456789abcdef-1"
    layer.mkdir(parents=True)
    readable(place)
    python_layer.build(requirements, layer, BUILD_UID, find_links=str(house))
    python_layer.compile_layer(layer, sys.executable)
    readable(place)
    return layer


def seeded_build(place: Path, lines: str, house: Path, seed: Path | None) -> tuple[Path, str]:
    requirements = place / "requirements.txt"
    requirements.write_text(lines)
    scratch = place / "built"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    readable(place)
    output: list[bytes] = []
    seeded = python_layer.build(
        requirements, scratch, BUILD_UID, find_links=str(house), seed=seed, on_output=output.append
    )
    python_layer.finish(scratch, sys.executable, seeded)  # as the store does once the build is in (copy-in)
    return scratch, b"".join(output).decode()


def holds(layer: Path) -> dict[str, str]:
    return {item["name"]: item["version"] for item in python_layer.installed(str(layer))}


def module(layer: Path, name: str) -> str:
    path = layer / f"{name}.py"
    return (path if path.exists() else layer / name / "__init__.py").read_text()


@needs_root
def test_an_addition_installs_only_what_the_image_layer_lacks(place, image_layer):
    house = place / "index"  # the index has the addition only: alpha and beta must come from the image's layer
    house.mkdir()
    wheel(house, GAMMA, "1.0", {"seed_gamma.py": "G = 1\n"}, (f"{BETA}>=1",))
    layer, output = seeded_build(place, f"{ALPHA}\n{GAMMA}\n", house, image_layer)
    assert holds(layer) == {ALPHA: "1.0", BETA: "1.0", GAMMA: "1.0"}  # not omega: the file does not ask for it
    assert "ORIGIN = 'image'" in module(layer, "seed_alpha")
    assert not (layer / "seed_omega.py").exists()
    assert not (layer / ".sandlot-prefix").exists()
    assert "Successfully installed sandlot-seed-gamma-1.0" in output


@needs_root
def test_a_pin_the_image_version_does_not_satisfy_gets_the_pin_and_no_copy_of_the_image_version(place, image_layer):
    house = place / "index"
    house.mkdir()
    beta(house, "2.0", "index")
    layer, _ = seeded_build(place, f"{ALPHA}\n{BETA}==2.0\n", house, image_layer)
    assert holds(layer) == {ALPHA: "1.0", BETA: "2.0"}
    assert [p.name for p in layer.glob("sandlot_seed_beta-*.dist-info")] == ["sandlot_seed_beta-2.0.dist-info"]
    assert "VERSION = '2.0'" in module(layer, "seed_beta")
    assert "ORIGIN = 'image'" in module(layer, "seed_alpha")


@needs_root
def test_the_services_own_packages_never_count_as_installed(place, image_layer):
    import anyio  # the service's own dependency, in its environment

    assert anyio
    house = place / "index"
    house.mkdir()
    wheel(house, "anyio", "0.0.1", {"anyio_stand_in.py": "A = 1\n"})
    layer, _ = seeded_build(place, f"{ALPHA}\nanyio\n", house, image_layer)
    assert holds(layer).get("anyio") == "0.0.1"


@needs_root
@pytest.mark.parametrize("line", ["{wheel}", f"{GAMMA} @ file://{{wheel}}", "--pre"])
def test_a_line_that_is_not_a_plain_requirement_builds_as_before(place, image_layer, line):
    house = place / "index"  # everything, alpha too: an unseeded build installs its own
    house.mkdir()
    alpha(house, "index")
    beta(house, "1.0", "index")
    gamma = wheel(house, GAMMA, "1.0", {"seed_gamma.py": "G = 1\n"}, (f"{BETA}>=1",))
    layer, _ = seeded_build(place, f"{ALPHA}\n{line.format(wheel=gamma)}\n", house, image_layer)
    assert "ORIGIN = 'index'" in module(layer, "seed_alpha")


def test_what_may_not_be_seeded():
    plain = "requests>=2  # a comment\nhttpx[http2]==0.27; python_version >= '3.8'\n\n# only a comment\n"
    assert python_layer.unseedable(plain, [], {}) == ""
    for text in ("-r other.txt\n", "x @ https://example.com/x.whl\n", "./local.whl\n", "-e .\n", "a \\\n"):
        assert python_layer.unseedable(text, [], {}), text
    assert python_layer.unseedable(plain, ["global.target='/x'"], {})
    assert python_layer.unseedable(plain, [], {"PIP_IGNORE_INSTALLED": "1"})
    assert python_layer.unseedable(plain, ["global.find-links='/opt/wheels'"], {"PIP_INDEX_URL": "x"}) == ""


def test_a_store_seeds_a_build_of_another_key_with_the_image_layer(place):
    sources = place / "requirements.txt"
    sources.write_text("requests\n")
    baked = place / "image" / "python"
    LayerStore(baked, lambda: [sources], lambda scratch, *_: None).ensure()
    (image,) = baked.iterdir()
    store = LayerStore(place / "data", lambda: [sources], lambda scratch, *_: None, baked=baked)
    assert store.seed() is None  # the image's own key: served as it is
    assert store.seed(["six"]) == image
    assert LayerStore(place / "data", lambda: [sources], lambda scratch, *_: None).seed(["six"]) is None


SEEDED_BUILD = """
import json, logging, sys
from pathlib import Path
logging.basicConfig(level=logging.INFO)
from runtimes.python import layer as python_layer
requirements, work, house, seed, uid = sys.argv[1:6]
seeded = python_layer.build(Path(requirements), Path(work), int(uid), find_links=house, seed=Path(seed))
python_layer.finish(Path(work), sys.executable, seeded)
print(json.dumps({item["name"]: item["version"] for item in python_layer.installed(work)}))
"""


@needs_root
@pytest.mark.parametrize("mode", ["full", "userns", "chroot", "landlock"])
def test_a_seeded_build_reads_the_image_layer_in_every_jail(mode, place, image_layer):
    """The build stays in its jail (layers/isolation.py), which may read the image's layer: with a tree of its
    own (as root, or in a user namespace), as the build's uid on the container's files (chroot), or in a
    Landlock domain as the service's uid (a restricted pod)."""
    if unprivileged.unavailable():
        pytest.skip(unprivileged.unavailable())
    if mode == "landlock" and LANDLOCK_ABI < 4:
        pytest.skip("needs Landlock ABI 4")
    owner = unprivileged.NOBODY if mode in ("userns", "landlock") else 0
    house = place / "index"
    house.mkdir()
    wheel(house, GAMMA, "1.0", {"seed_gamma.py": "G = 1\n"}, (f"{BETA}>=1",))
    requirements = place / "requirements.txt"
    requirements.write_text(f"{ALPHA}\n{GAMMA}\n")
    work = place / "work.build"
    work.mkdir()
    readable(place)
    os.chown(work, owner, owner)
    launcher = standin(DOCKER_DEFAULT) if mode == "chroot" else RESTRICTED_POD if mode == "landlock" else []
    identity = {"user": owner, "group": owner, "extra_groups": []} if owner and mode != "landlock" else {}
    result = subprocess.run(
        [*launcher, unprivileged.venv_python(), "-c", SEEDED_BUILD]
        + [str(requirements), str(work), str(house), str(image_layer), str(BUILD_UID)],
        env={**os.environ, "PYTHONPATH": unprivileged.source(), "HOME": str(place / "no-home")},
        capture_output=True,
        text=True,
        timeout=300,
        cwd="/",
        **identity,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.splitlines()[-1]) == {ALPHA: "1.0", BETA: "1.0", GAMMA: "1.0"}
    assert "starts from the image's layer" in result.stderr


@needs_root
def test_a_services_store_seeds_its_build_and_finishes_the_layer(place, image_layer, monkeypatch):
    monkeypatch.setattr(store_module, "IMAGE_LAYERS", str(place / "image"))  # the image's layers, as in the image
    house = place / "index"
    house.mkdir()
    wheel(house, GAMMA, "1.0", {"seed_gamma.py": "G = 1\n"}, (f"{BETA}>=1",))
    requirements = place / "requirements.txt"
    requirements.write_text(f"{ALPHA}\n{GAMMA}\n")
    readable(place)
    layer = python_layer.managed_layer(service_settings(requirements, house), place / "data")
    built = Path(layer.store.ensure())
    assert built.parent == place / "data" / "layers" / "python"
    assert holds(built) == {ALPHA: "1.0", BETA: "1.0", GAMMA: "1.0"}
    for source in (built / "seed_alpha.py", built / "seed_gamma.py", built / "seed_beta" / "__init__.py"):
        assert valid_unchecked_pyc(source)
        assert os.stat(source).st_uid == 0
    assert not (built / ".sandlot-seeded").exists() and not (built / ".sandlot-requirements.txt").exists()


@pytest.mark.parametrize("listed", ["../../etc\n", "/root/.ssh.dist-info\n", "missing-1.0.dist-info\n", ".x.dist-info"])
def test_what_a_seeded_build_lists_is_only_the_image_layers_distributions(image_layer_like, listed):
    with pytest.raises(LayerBuildError):
        python_layer.kept_of(image_layer_like, listed)
    assert python_layer.kept_of(image_layer_like, "present-1.0.dist-info\n") == ("present-1.0.dist-info",)


@pytest.fixture
def image_layer_like(place):
    (place / "present-1.0.dist-info").mkdir()
    return place


def test_the_images_distributions_are_never_copied_through_a_link_the_build_left(tmp_path):
    """The service copies what a seeded build keeps of the image's layer into the new layer, as root; the build
    (code from the package index, as the build's uid) made that layer's entries: a symbolic link it left where a
    kept distribution's files go (`seedpkg -> /somewhere`) fails the build, and nothing is written through it."""
    seed = tmp_path / "image-layer"
    (seed / "seedpkg").mkdir(parents=True)
    (seed / "seedpkg" / "__init__.py").write_text("X = 1\n")
    info = seed / "seedpkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: seedpkg\nVersion: 1.0\n")
    (info / "RECORD").write_text(
        "seedpkg/__init__.py,,\nseedpkg-1.0.dist-info/METADATA,,\nseedpkg-1.0.dist-info/RECORD,,\n"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for planted in ("seedpkg", "seedpkg-1.0.dist-info"):
        layer = tmp_path / f"layer-{planted}"
        layer.mkdir()
        (layer / planted).symlink_to(elsewhere)
        with pytest.raises(LayerBuildError, match="symbolic link"):
            python_layer.copy_seed(python_layer.Seeded(seed, ("seedpkg-1.0.dist-info",)), layer)
        assert os.listdir(elsewhere) == []
    clean = tmp_path / "layer-clean"
    clean.mkdir()
    python_layer.copy_seed(python_layer.Seeded(seed, ("seedpkg-1.0.dist-info",)), clean)
    assert (clean / "seedpkg" / "__init__.py").read_text() == "X = 1\n"


def test_a_seeded_builds_copy_of_the_image_layer_made_while_pip_ran_is_moved_in_and_nothing_else(tmp_path):
    """The service copies the image's layer aside while pip runs (its own directory: the build never reaches it);
    finish then moves the kept distributions' files from there, the same bytes, modes and times a copy would give,
    and none of the others. A build's symbolic link on the way still fails it, and nothing is moved through it."""
    seed = tmp_path / "image-layer"
    for name, value in (("kept", "1"), ("dropped", "2")):
        (seed / name).mkdir(parents=True)
        (seed / name / "__init__.py").write_text(f"X = {value}\n")
        info = seed / f"{name}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        (info / "RECORD").write_text(f"{name}/__init__.py,,\n{name}-1.0.dist-info/METADATA,,\n")
    os.utime(seed / "kept" / "__init__.py", ns=(1, 1_000_000_000))
    aside = tmp_path / "aside"
    aside.mkdir(mode=0o700)
    copied = python_layer._CopyAhead(seed, aside).join()
    assert copied == aside
    early = os.stat(aside / "kept" / "__init__.py")
    layer = tmp_path / "layer"
    layer.mkdir()
    python_layer.copy_seed(python_layer.Seeded(seed, ("kept-1.0.dist-info",), copied), layer)
    placed = os.stat(layer / "kept" / "__init__.py")
    assert placed.st_ino == early.st_ino  # moved, not copied again
    assert (placed.st_mtime_ns, placed.st_mode) == (1_000_000_000, os.stat(seed / "kept" / "__init__.py").st_mode)
    assert (layer / "kept" / "__init__.py").read_text() == "X = 1\n"
    assert sorted(os.listdir(layer)) == ["kept", "kept-1.0.dist-info"]
    assert not (aside / "kept" / "__init__.py").exists() and (aside / "dropped" / "__init__.py").exists()

    planted = tmp_path / "layer-planted"
    planted.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (planted / "dropped").symlink_to(elsewhere)
    with pytest.raises(LayerBuildError, match="symbolic link"):
        python_layer.copy_seed(python_layer.Seeded(seed, ("dropped-1.0.dist-info",), copied), planted)
    assert os.listdir(elsewhere) == [] and (aside / "dropped" / "__init__.py").exists()


def test_a_stores_aside_directory_is_its_own_for_the_build_and_gone_after(place):
    """The directory a store gives a build beside its layer (for what the service prepares meanwhile) is root's
    own, 0700, on the layer's filesystem, and is gone once the layer is in place, or once the build failed."""
    seen = []

    def build(scratch: Path, _requested, _output, aside: Path) -> None:
        info = os.stat(aside)
        seen.append((aside, stat.S_IMODE(info.st_mode), info.st_uid, info.st_dev == os.stat(scratch).st_dev))
        (aside / "left.txt").write_text("x")
        (scratch / "module.py").write_text("VALUE = 1\n")
        if len(seen) == 2:
            raise LayerBuildError("the second build fails")

    store = LayerStore(place / "store", lambda: [], build)
    layer = store.ensure()
    aside, mode, uid, same = seen[0]
    assert (mode, uid, same) == (0o700, os.geteuid(), True) and aside.parent == Path(layer).parent
    assert not aside.exists()
    with pytest.raises(LayerBuildError):
        store.rebuild()
    assert not seen[1][0].exists()
    assert sorted(p.name for p in (place / "store").iterdir()) == [os.path.basename(layer)]


def test_a_seeded_build_that_fails_before_pip_leaves_no_copy_of_the_image_layer_behind(place, monkeypatch):
    """A seeded build that fails before pip runs (an operator's pip configuration with a malformed index URL:
    urlsplit refuses it) stops its copy of the image's layer with it: nothing is copied into the store's aside
    directory after the build is over, and the store's removal of it is the last word (no copy of the image's
    whole layer left beside the store for the hour before another instance's collect)."""
    import threading
    import time

    seed = place / "image-layer"
    for n in range(100):
        (seed / f"pkg{n}").mkdir(parents=True)
        (seed / f"pkg{n}" / "__init__.py").write_text(f"X = {n}\n")
    slow_copy = shutil.copy2

    def copy2(source, target, **kwargs):
        copied = slow_copy(source, target, **kwargs)
        time.sleep(0.05)  # a big layer: the copy takes longer than pip's configuration does to go wrong
        return copied

    monkeypatch.setattr(python_layer.shutil, "copy2", copy2)
    (place / "xdg" / "pip").mkdir(parents=True)
    (place / "xdg" / "pip" / "pip.conf").write_text("[global]\nextra-index-url = http://[fe80::1/simple\n")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(place / "xdg"))
    monkeypatch.delenv("PIP_CONFIG_FILE", raising=False)
    requirements = place / "requirements.txt"
    requirements.write_text("requests\n")

    def build(scratch: Path, wanted, output, aside: Path) -> None:
        python_layer.build(requirements, scratch, BUILD_UID, requested=wanted, on_output=output, seed=seed, aside=aside)

    store = LayerStore(place / "store", lambda: [requirements], build)
    with pytest.raises(ValueError):
        store.rebuild()
    time.sleep(0.5)
    assert not [t for t in threading.enumerate() if t.name == "seed-copy" and t.is_alive()]
    assert not [p.name for p in (place / "store").iterdir()]


def test_a_build_whose_staging_cannot_be_made_leaves_nothing_beside_the_store(place, monkeypatch):
    """Where the build's staging directory cannot be made (a full /tmp) the build fails and leaves neither its
    scratch directory nor its aside directory (root's) in the store, nor a lock held on either."""
    store = LayerStore(place / "store", lambda: [], lambda *_args: None)

    def full() -> Path:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store, "_staging", full)
    with pytest.raises(OSError, match="No space"):
        store.rebuild()
    assert not [p.name for p in (place / "store").iterdir()]


def test_a_killed_builds_aside_directory_goes_at_the_next_collect_and_a_live_ones_stays(place):
    """A build killed with the service (a stop during a start's build, an OOM kill) leaves its aside directory (a
    seeded build's copy of the image's whole layer) and its scratch: the next collect removes them, not an hour
    later (every build that makes an aside holds a lock on its scratch: an unlocked one's build is gone). A live
    build's, another instance's or this one's, stays."""
    import threading

    dead = place / "store" / "0123456789abcdef-1"
    (place / "store").mkdir()
    for name in (".build", store_module.ASIDE):
        (dead.parent / (dead.name + name) / "pkg").mkdir(parents=True)
        (dead.parent / (dead.name + name) / "pkg" / "big.so").write_bytes(b"x" * 1024)
    builds, inside, release = [], threading.Event(), threading.Event()

    def build(scratch: Path, _requested, _output, aside: Path) -> None:
        (scratch / "module.py").write_text("VALUE = 1\n")
        builds.append(aside)
        if len(builds) == 2:  # the second build: held while another instance's collect runs
            inside.set()
            release.wait(10)

    store = LayerStore(place / "store", lambda: [], build)
    layer = store.ensure()
    assert sorted(p.name for p in (place / "store").iterdir()) == [os.path.basename(layer)]
    other = LayerStore(place / "store", lambda: [], build)  # another instance on the same data dir
    building = threading.Thread(target=store.rebuild)
    building.start()
    try:
        assert inside.wait(10)
        other.collect()
        assert builds[1].is_dir() and builds[1].with_name(builds[1].name.replace(store_module.ASIDE, ".build")).is_dir()
    finally:
        release.set()
        building.join()
