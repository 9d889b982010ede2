"""Several instances on one data directory: no instance removes a layer another one uses or builds.

Each LayerStore here stands for one instance (locks are per open file, so two stores in
one process contend as two processes would); the last test uses a second process.
The build is a function that writes a file, so the races can be driven step by step.
"""

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from layers.store import LayerStore
from runtimes.linux import dirlock


@pytest.fixture
def root(tmp_path):
    return tmp_path / "layers" / "python"


def store_for(root: Path, sources: Path, build=None) -> LayerStore:
    def default_build(scratch: Path, *_: object) -> None:
        (scratch / "module.py").write_text("VALUE = 1\n")

    return LayerStore(root, lambda: [sources], build or default_build)


@pytest.fixture
def sources(tmp_path):
    path = tmp_path / "requirements.txt"
    path.write_text("requests\n")
    return path


def test_a_layer_just_built_survives_another_instance_starting(root, sources, tmp_path):
    building = store_for(root, sources)
    path = building.rebuild()  # the manager switches to it next; meanwhile another instance starts
    other_sources = tmp_path / "other.txt"
    other_sources.write_text("httpx\n")
    starting = store_for(root, other_sources)
    starting.ensure()  # builds its own and collects what nobody uses
    assert os.path.isfile(os.path.join(path, "module.py"))
    building.use(path)
    starting.collect()
    assert os.path.isdir(path)


def test_a_layer_being_built_survives_another_instance_collecting(root, sources):
    started, finish = threading.Event(), threading.Event()

    def slow_build(scratch: Path, *_: object) -> None:
        (scratch / "module.py").write_text("VALUE = 2\n")
        started.set()
        assert finish.wait(10)

    building = store_for(root, sources, slow_build)
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("path", building.rebuild()))
    thread.start()
    assert started.wait(10)
    (scratch,) = [p for p in root.iterdir() if p.name.endswith(".build")]
    store_for(root, sources).collect()  # another instance, starting
    assert (scratch / "module.py").is_file()
    finish.set()
    thread.join(10)
    assert (Path(result["path"]) / "module.py").read_text() == "VALUE = 2\n"


def test_a_half_built_layer_of_a_dead_build_is_collected_once_idle(root, sources):
    root.mkdir(parents=True)
    stale = root / "0123456789abcdef-1.build"
    stale.mkdir()
    (stale / "partial").write_text("x")
    recent = root / "0123456789abcdef-2.build"  # perhaps an older Sandlot's build (those are not locked)
    recent.mkdir()
    long_ago = os.stat(stale).st_mtime - 2 * 3600
    os.utime(stale, (long_ago, long_ago))
    store_for(root, sources).ensure()
    assert not stale.exists()
    assert recent.is_dir()


def test_an_unused_layer_is_collected_and_a_used_one_is_not(root, sources, tmp_path):
    first = store_for(root, sources)
    old = first.ensure()
    first.current = first.rebuild()  # an update: the old one is retired once no zygote uses it
    holder = store_for(root, sources)
    holder.use(old)  # another instance still runs on it
    first.retire(old)
    assert os.path.isdir(old)
    os.close(holder._held.pop(old))
    first.collect()
    assert not os.path.exists(old)
    assert [p.name for p in root.iterdir()] == [Path(first.current).name]


def test_an_instance_that_waited_for_a_layer_being_removed_does_not_run_on_it(root, sources, monkeypatch):
    store = store_for(root, sources)
    path = store.ensure()
    os.close(store._held.pop(path))  # the instance is gone: the layer is unused
    user = store_for(root, sources)
    outcome = {}
    entered = threading.Event()
    real_rename = os.rename

    def rename_while_a_user_waits(src, dst):
        # the remover holds the exclusive lock; a user opens the layer now and waits for its lock
        thread = threading.Thread(target=lambda: outcome.setdefault("use", _try_use(user, path)))
        thread.start()
        assert entered.wait(5)
        time.sleep(0.2)  # let it block on the lock
        real_rename(src, dst)
        outcome["thread"] = thread

    def _try_use(store, layer):
        entered.set()
        try:
            store.use(layer)
            return "in use"
        except FileNotFoundError:
            return "gone"

    monkeypatch.setattr(os, "rename", rename_while_a_user_waits)
    assert dirlock.remove_if_unlocked(path)
    monkeypatch.undo()
    outcome["thread"].join(10)
    assert outcome["use"] == "gone"
    assert user.ensure() != path  # it builds (or finds) another


HOLD = """
import sys, time
sys.path.insert(0, {repo!r})
from layers.store import LayerStore
from pathlib import Path
store = LayerStore(Path({root!r}), lambda: [Path({sources!r})], lambda *_: None)
store.use({layer!r})
print('holding', flush=True)
sys.stdin.read()
"""


def test_a_layer_another_process_runs_on_is_never_collected(root, sources):
    store = store_for(root, sources)
    layer = store.ensure()
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    other = subprocess.Popen(
        [sys.executable, "-c", HOLD.format(repo=repo, root=str(root), sources=str(sources), layer=layer)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert other.stdout.readline() == "holding\n"
        store.current = store.rebuild()
        store.retire(layer)
        store.collect()
        assert os.path.isdir(layer)
    finally:
        other.stdin.close()
        other.wait(10)
    store.collect()
    assert not os.path.exists(layer)
