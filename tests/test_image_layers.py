"""The layers an image carries, and builds into a data dir whose root the build's uid cannot pass through.

The service image builds the default layers when it is built (Dockerfile: IMAGE_LAYERS), so that a new volume
serves them without any package index; an operator's additions still build into the data dir. A data volume
made with `install -d -m 0770` (or a group-owned one) is closed to the build's uid: the build then runs in a
staging directory of its own and the service copies the result in.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from layers.store import LayerStore, reachable

BUILD_UID = 61_999  # a uid nothing else on this machine has


@pytest.fixture
def sources(tmp_path):
    path = tmp_path / "requirements.txt"
    path.write_text("requests\n")
    return path


@pytest.fixture
def open_dir():
    """A directory every uid may pass through, in one whose parents are open too (pytest's own is root's 0700)."""
    path = Path(tempfile.mkdtemp(prefix="sandlot-test-image-layers-", dir="/var/tmp"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def staged() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("sandlot-layer-build-*"))


def write_module(scratch: Path, *_: object) -> None:
    (scratch / "module.py").write_text("VALUE = 1\n")


def no_index(scratch: Path, *_: object) -> None:
    raise AssertionError("built, where the image's layer should have served")


def baked_store(tmp_path: Path, sources: Path) -> Path:
    """A store as the image's build leaves it: one finished layer for the sources."""
    baked = tmp_path / "image" / "python"
    LayerStore(baked, lambda: [sources], write_module).ensure()
    return baked


def test_a_new_data_dir_serves_the_image_layer_without_building(tmp_path, sources):
    baked = baked_store(tmp_path, sources)
    (image_layer,) = baked.iterdir()
    store = LayerStore(tmp_path / "data" / "layers" / "python", lambda: [sources], no_index, baked=baked)
    assert store.ensure() == str(image_layer)
    store.collect()
    store.retire(str(image_layer))  # never removed by the instance: it is the image's
    assert (image_layer / "module.py").is_file()


def test_an_operators_addition_builds_into_the_data_dir(tmp_path, sources):
    baked = baked_store(tmp_path, sources)
    data = tmp_path / "data" / "layers" / "python"
    store = LayerStore(data, lambda: [sources], write_module, baked=baked, requested=lambda: ["six"])
    built = store.ensure()
    assert Path(built).parent == data
    assert (Path(built) / "module.py").is_file()


def test_a_changed_base_file_builds_into_the_data_dir(tmp_path, sources):
    baked = baked_store(tmp_path, sources)
    sources.write_text("requests\nsix\n")  # dify-sandbox's dependencies file, say, with one more line
    data = tmp_path / "data" / "layers" / "python"
    built = LayerStore(data, lambda: [sources], write_module, baked=baked).ensure()
    assert Path(built).parent == data


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the build runs as another uid")
def test_a_build_whose_uid_cannot_pass_through_the_data_dirs_root_is_built_and_moved_in(open_dir, sources):
    volume = open_dir / "volume"
    volume.mkdir(mode=0o700)
    os.chmod(volume, 0o770)  # as `install -d -m 0770` makes it: root's, closed to every other uid
    root = volume / "layers" / "python"
    assert not reachable(root.parent.parent, BUILD_UID)

    def build_as_its_uid(scratch: Path, *_: object) -> None:
        os.chown(scratch, BUILD_UID, BUILD_UID)  # as layers/isolation.py gives it the directory
        subprocess.run(
            ["/bin/sh", "-c", 'echo "VALUE = 3" > "$0/module.py"', str(scratch)],
            user=BUILD_UID,
            group=BUILD_UID,
            extra_groups=[],
            check=True,
            capture_output=True,
        )

    before = staged()
    store = LayerStore(root, lambda: [sources], build_as_its_uid, build_uid=lambda: BUILD_UID)
    built = Path(store.ensure())
    assert built.parent == root
    assert (built / "module.py").read_text() == "VALUE = 3\n"
    info = os.stat(built / "module.py")
    assert info.st_uid == 0 and stat.S_IMODE(info.st_mode) == 0o644  # the runs' layer: root's, read-only
    assert stat.S_IMODE(os.stat(volume).st_mode) == 0o770  # the operator's mode is left alone
    assert staged() <= before  # the staging directory is gone


def test_reachable_follows_every_directory_down(open_dir):
    closed = open_dir / "closed"
    closed.mkdir(mode=0o700)
    os.chmod(closed, 0o770)
    inner = closed / "inner"
    inner.mkdir(mode=0o755)
    assert reachable(open_dir, BUILD_UID)
    assert not reachable(inner, BUILD_UID)
    os.chmod(closed, 0o771)
    assert reachable(inner, BUILD_UID)
