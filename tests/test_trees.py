"""The read-only tree as a real directory (the chroot mode): what it holds, who may write it, how it is kept."""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import needs_root

from runtimes.config import RuntimeConfig
from runtimes.jail.policy import tree_files
from runtimes.jail.trees import image_trees, materialized
from runtimes.jail.trees import tree_store as trees
from runtimes.linux import dirlock, rootfs
from runtimes.nodejs.runtime import NodeRuntime
from runtimes.python.runtime import PythonRuntime

RUN_UID = 1_499_999_000  # not a host user: a run's uid stands in


@pytest.fixture
def place():
    """A scratch directory on the data directory's filesystem (not /tmp: trees never live there)."""
    path = tempfile.mkdtemp(prefix="sandlot-trees-", dir="/var/tmp")
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def listing(root: str) -> dict[str, tuple]:
    """Every path below root with what a run can tell of it: type, size, symlink target, device number."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            info = os.lstat(path)
            kind = stat.S_IFMT(info.st_mode)
            found[path[len(root) :] or "/"] = (
                kind,
                info.st_size if stat.S_ISREG(info.st_mode) else 0,
                os.readlink(path) if stat.S_ISLNK(info.st_mode) else "",
                info.st_rdev,
            )
    return found


PIVOT_LISTING = """
import json, os, sys
sys.path.insert(0, {source!r})
from runtimes.linux import rootfs
spec, root = json.loads({spec!r}), {root!r}
rootfs.build_and_enter(spec, root)
sys.path.insert(0, {source!r})
found = {{}}
for dirpath, dirnames, filenames in os.walk("/"):
    for name in dirnames + filenames:
        path = os.path.join(dirpath, name)
        info = os.lstat(path)
        found[path] = [info.st_mode & 0o170000, info.st_size if (info.st_mode & 0o170000) == 0o100000 else 0,
                       os.readlink(path) if (info.st_mode & 0o170000) == 0o120000 else "", info.st_rdev]
print(json.dumps(found))
"""


def pivot_listing(spec: dict, scratch: str) -> dict[str, tuple]:
    """What build_and_enter's tree shows, seen from inside it (a child of its own: a mount namespace)."""
    root = tempfile.mkdtemp(prefix="sandlot-pivot-", dir=scratch)
    source = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = PIVOT_LISTING.format(source=source, spec=json.dumps(spec), root=root)
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, check=True)
    return {path: tuple(value) for path, value in json.loads(out.stdout).items()}


def runtime_specs(place: str) -> dict[str, dict]:
    python_layer = tempfile.mkdtemp(prefix="sandlot-layer-", dir=place)  # removed with the test's place
    os.makedirs(os.path.join(python_layer, "probe"))
    with open(os.path.join(python_layer, "probe", "__init__.py"), "w") as f:
        f.write("VALUE = 1\n")
    specs = {"python3": PythonRuntime(RuntimeConfig(python_layer=python_layer)).tree().to_dict()}
    node = NodeRuntime(RuntimeConfig(nodejs_path=shutil.which("node") or "/usr/bin/node"))
    if not node.missing():
        specs["nodejs"] = node.tree().to_dict()
    return specs


@needs_root
@pytest.mark.parametrize("language", ["python3", "nodejs"])
def test_the_materialized_tree_holds_exactly_what_the_pivot_tree_shows(language, place):
    specs = runtime_specs(place)
    if language not in specs:
        pytest.skip("no node here")
    spec = specs[language]
    root = os.path.join(place, "tree")
    os.mkdir(root)
    materialized.materialize(spec, root)
    cell = materialized.make_cell(root, RUN_UID)  # what a run's root is: its uid's cell, with a /tmp of its run's own
    os.mkdir(cell + "/tmp")
    shown = listing(cell)
    assert shown == pivot_listing(spec, place)
    assert {path: entry for path, entry in listing(root).items() if not path.startswith("/cells")} == shown
    for path in spec["hidden"]:  # the interpreter's own site-packages: an empty directory, as in the pivot tree
        assert os.listdir(cell + os.path.realpath(path)) == []
    # a cell costs its directories: every file in it is the tree's own inode
    for dirpath, _dirnames, filenames in os.walk(cell):
        for name in filenames:
            path = os.path.join(dirpath, name)
            assert os.lstat(path).st_ino == os.lstat(root + path[len(cell) :]).st_ino, path


def test_only_root_files_nobody_else_may_write_are_hard_linked(place):
    source = os.path.join(place, "src")
    os.mkdir(source)
    modes = {"plain": 0o644, "script": 0o755, "world_writable": 0o666, "group_writable": 0o664, "setuid": 0o4755}
    for name, mode in modes.items():
        with open(os.path.join(source, name), "w") as f:
            f.write(name)
        os.chmod(os.path.join(source, name), mode)
    foreign = os.path.join(source, "build_uid_owned")
    with open(foreign, "w") as f:
        f.write("built")
    if os.geteuid() == 0:
        os.chown(foreign, RUN_UID, RUN_UID)
    root = os.path.join(place, "tree")
    os.mkdir(root)
    done = materialized.materialize({"binds": [source], "hidden": [], "devices": [], "placed": {}}, root)
    linked = {name for name in [*modes, "build_uid_owned"] if _same_inode(source, root, name)}
    if os.geteuid() == 0:
        assert linked == {"plain", "script"}
        assert done.linked == 2 and done.copied == 4
    for name in ["world_writable", "group_writable", "setuid", "build_uid_owned"]:
        info = os.stat(root + os.path.join(source, name))
        assert not info.st_mode & (stat.S_ISUID | stat.S_IWGRP | stat.S_IWOTH), name
        assert info.st_uid == os.geteuid()
        with open(root + os.path.join(source, name)) as f:
            assert f.read() in ("built", name)


def _same_inode(source: str, root: str, name: str) -> bool:
    return os.stat(os.path.join(source, name)).st_ino == os.stat(root + os.path.join(source, name)).st_ino


def test_across_filesystems_files_are_copied_with_their_times(place):
    """/dev/shm is another filesystem here: no link is possible, copies keep mtimes (cached bytecode stays valid)."""
    if os.stat("/dev/shm").st_dev == os.stat(place).st_dev:
        pytest.skip("/dev/shm is on the same filesystem here")
    root = tempfile.mkdtemp(prefix="sandlot-tree-", dir="/dev/shm")
    try:
        source = os.path.join(place, "module.py")
        with open(source, "w") as f:
            f.write("x = 1\n" * 1000)
        os.utime(source, ns=(1_000_000_000, 1_700_000_000_123_456_789))
        done = materialized.materialize({"binds": [source], "hidden": [], "devices": [], "placed": {}}, root)
        assert done.linked == 0 and done.copied == 1 and done.copied_bytes == 6000
        copy = os.stat(root + source)
        assert copy.st_mtime_ns == 1_700_000_000_123_456_789 and copy.st_size == 6000
    finally:
        shutil.rmtree(root)


@needs_root
def test_device_nodes_or_safe_stand_ins(place):
    spec = {"binds": [], "hidden": [], "devices": list(rootfs.DEVICES), "placed": {}}
    real = os.path.join(place, "real")
    os.mkdir(real)
    materialized.materialize(spec, real, device_nodes=True)
    for path in rootfs.DEVICES:
        info = os.stat(real + path)
        assert stat.S_ISCHR(info.st_mode) and info.st_rdev == os.stat(path).st_rdev
        assert stat.S_IMODE(info.st_mode) == 0o666
    with open(real + "/dev/urandom", "rb") as f:
        assert len(f.read(16)) == 16
    stand_in = os.path.join(place, "stand-in")
    os.mkdir(stand_in)
    assert materialized.materialize(spec, stand_in, device_nodes=False).devices == "stand-ins"
    null = os.stat(stand_in + "/dev/null")
    assert stat.S_ISREG(null.st_mode) and null.st_size == 0 and stat.S_IMODE(null.st_mode) == 0o444
    assert null.st_uid == 0
    assert sorted(os.listdir(stand_in + "/dev")) == ["null"]  # no file pretends to be a source of randomness


CONFINED = """
import os, sys
os.chroot({root!r})
os.chdir("/")
os.chroot("/cells/{uid}")  # as the child does, from its zygote's tree into its uid's cell
os.chdir("/")
os.setgroups([])
os.setresgid({uid}, {uid}, {uid})
os.setresuid({uid}, {uid}, {uid})
writable = []
for dirpath, dirnames, filenames in os.walk("/"):
    if os.access(dirpath, os.W_OK):
        writable.append(dirpath)
    for name in filenames:
        path = os.path.join(dirpath, name)
        if not os.path.islink(path) and os.access(path, os.W_OK) and not path.startswith("/dev/"):
            writable.append(path)
with open("/tmp/report.txt", "w") as f:  # a literal /tmp path, as Dify code writes one
    f.write("mine")
print(writable, os.listdir("/tmp"), os.path.exists("/cells"), flush=True)
os.execv({python!r}, [{python!r}, "-I", "-S", "-c",
         "import json, ssl, sqlite3, zoneinfo; print(zoneinfo.ZoneInfo('Europe/Paris').key, ssl.OPENSSL_VERSION[:7])"])
"""


@needs_root
def test_a_run_uid_in_the_tree_writes_only_its_own_tmp_and_the_interpreter_runs(place):
    spec = runtime_specs(place)["python3"]
    store = trees.TreeStore(os.path.join(place, "trees"))
    root = store.ensure(spec)
    try:
        own = trees.make_run_tmp(root, RUN_UID)
        assert stat.S_IMODE(os.stat(own).st_mode) == 0o700 and os.stat(own).st_uid == RUN_UID
        assert own == root + f"/cells/{RUN_UID}/tmp"
        assert stat.S_IMODE(os.stat(root + "/cells").st_mode) == 0o711
        python = os.path.realpath(RuntimeConfig().python_path)
        code = CONFINED.format(root=root, uid=RUN_UID, python=python)
        out = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        # its own /tmp is its only writable place, and no other uid's cell is in sight
        assert out.stdout.splitlines() == ["['/tmp'] ['report.txt'] False", "Europe/Paris OpenSSL"]
        assert os.listdir(own) == ["report.txt"]
        trees.remove_run_tmp(root, RUN_UID)
        assert not os.path.exists(own)
    finally:
        store.release(root)
        store.close()


def test_a_leftover_tmp_goes_without_following_what_was_planted(place):
    root = os.path.join(place, "tree")
    os.makedirs(os.path.join(root, "cells"))
    victim = os.path.join(place, "victim")
    os.mkdir(victim)
    open(os.path.join(victim, "keep"), "w").close()
    left = trees.run_tmp(root, os.getuid())
    os.makedirs(os.path.join(left, "deep", "er"))
    os.symlink(victim, os.path.join(left, "deep", "link"))
    fresh = trees.make_run_tmp(root, os.getuid())
    assert os.listdir(fresh) == [] and os.listdir(victim) == ["keep"]


def test_a_run_tmp_nested_past_recursion_and_path_limits_is_removed(place):
    root = os.path.join(place, "tree")
    os.makedirs(os.path.join(root, "cells"))
    victim = os.path.join(place, "victim")
    os.mkdir(victim)
    open(os.path.join(victim, "keep"), "w").close()
    left = trees.run_tmp(root, os.getuid())
    os.makedirs(left)
    fd = os.open(left, os.O_RDONLY | os.O_DIRECTORY)
    for level in range(3000):  # deeper than Python's recursion limit, and far past PATH_MAX
        name = ("n" * 200) if level % 2 else ".sandlot-rm-1"
        os.mkdir(name, dir_fd=fd)
        open(f"/proc/self/fd/{fd}/file", "w").close()
        if level % 100 == 0:
            os.symlink(victim, f"/proc/self/fd/{fd}/link")
        deeper = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = deeper
    os.close(fd)
    trees.remove_run_tmp(root, os.getuid())
    assert os.listdir(os.path.dirname(left)) == [] and os.listdir(victim) == ["keep"]


def _store_spec(place: str) -> tuple[dict, str]:
    source = os.path.join(place, "layer")
    os.makedirs(os.path.join(source, "pkg"), exist_ok=True)
    module = os.path.join(source, "pkg", "mod.py")
    with open(module, "w") as f:
        f.write("x = 1\n")
    return {"binds": [source], "hidden": [], "devices": ["/dev/null"], "placed": {}}, module


@needs_root
def test_a_tree_is_built_once_reused_after_a_restart_and_rebuilt_when_a_source_changes(place, monkeypatch):
    spec, module = _store_spec(place)
    built = []
    materialize = materialized.materialize

    def watched(spec, scratch, device_nodes=True, uncache=False):
        built.append(scratch)
        done = materialize(spec, scratch, device_nodes, uncache)
        final = scratch.rsplit(".build-", 1)[0]
        assert not os.path.exists(final), "a tree is visible under its name only once it is complete"
        return done

    monkeypatch.setattr(materialized, "materialize", watched)
    first = trees.TreeStore(os.path.join(place, "trees"))
    path = first.ensure(spec)
    assert first.ensure(spec) == path and len(built) == 1  # a second zygote on the same tree
    first.close()  # the instance is killed: nothing removes its tree
    restarted = trees.TreeStore(os.path.join(place, "trees"))
    assert restarted.ensure(spec) == path and len(built) == 1  # reused, not built again
    os.utime(module, ns=(0, 1))  # the source changed (an upgraded package): another tree
    changed = restarted.ensure(spec)
    assert changed != path and len(built) == 2
    restarted.release(path)
    restarted.release(path)  # after its last user
    assert not os.path.exists(path)
    restarted.release(changed)
    restarted.close()


@needs_root
def test_the_runtimes_trees_are_built_one_at_a_time(place, monkeypatch):
    # side by side, each would take as long as both: the first Python run would wait for node's copy too
    python_spec, _ = _store_spec(os.path.join(place, "python"))
    node_spec, _ = _store_spec(os.path.join(place, "nodejs"))
    building, overlapped = [], []
    materialize = materialized.materialize

    def watched(spec, scratch, device_nodes=True, uncache=False):
        building.append(scratch)
        overlapped.append(len(building) > 1)
        time.sleep(0.2)
        try:
            return materialize(spec, scratch, device_nodes, uncache)
        finally:
            building.remove(scratch)

    monkeypatch.setattr(materialized, "materialize", watched)
    stores = [trees.TreeStore(os.path.join(place, "trees")) for _ in range(2)]  # each runtime opens its own
    with ThreadPoolExecutor(2) as pool:
        paths = list(pool.map(lambda store, spec: store.ensure(spec), stores, [python_spec, node_spec]))
    assert len(set(paths)) == 2 and all(os.path.isdir(path) for path in paths)
    assert overlapped == [False, False]
    for store in stores:
        store.close()


@needs_root
def test_the_default_languages_tree_is_built_first_though_another_asked_first(place, monkeypatch):
    # the Node.js runtime asks a little earlier (its spec is quicker made): the first Python run must not wait for
    # node's copy
    python_spec, _ = _store_spec(os.path.join(place, "python"))
    node_spec, _ = _store_spec(os.path.join(place, "nodejs"))
    order = []
    materialize = materialized.materialize

    def watched(spec, scratch, device_nodes=True, uncache=False):
        order.append("python" if spec is python_spec else "nodejs")
        return materialize(spec, scratch, device_nodes, uncache)

    monkeypatch.setattr(materialized, "materialize", watched)
    python_store = trees.TreeStore(os.path.join(place, "trees"), first=True)
    node_store = trees.TreeStore(os.path.join(place, "trees"))
    with ThreadPoolExecutor(2) as pool:
        node = pool.submit(node_store.ensure, node_spec)
        time.sleep(0.3)  # node's build is waiting its turn
        python = pool.submit(python_store.ensure, python_spec)
        python.result(10), node.result(10)
    assert order == ["python", "nodejs"]
    python_store.close()
    node_store.close()


@needs_root
def test_a_tree_another_instance_holds_is_not_removed(place):
    spec, _module = _store_spec(place)
    first = trees.TreeStore(os.path.join(place, "trees"))
    second = trees.TreeStore(os.path.join(place, "trees"))
    path = first.ensure(spec)
    assert second.ensure(spec) == path
    first.release(path)
    assert os.path.isdir(path)  # the second instance still serves from it
    first.collect()
    assert os.path.isdir(path)
    second.release(path)
    assert not os.path.exists(path)
    os.mkdir(os.path.join(place, "trees", "abandoned.build-1"))
    os.utime(os.path.join(place, "trees", "abandoned.build-1"), (0, 0))  # left by a dead build long ago
    second.collect()
    assert os.listdir(os.path.join(place, "trees")) == []


def test_a_noexec_data_directory_is_refused_naming_it(place, monkeypatch):
    real = os.statvfs

    def noexec(path):
        result = real(path)
        return os.statvfs_result((*result[:8], result.f_flag | os.ST_NOEXEC, *result[9:]))

    monkeypatch.setattr(os, "statvfs", noexec)
    with pytest.raises(trees.TreeUnusable, match="noexec"):
        trees.TreeStore(os.path.join(place, "trees"))


def test_runtimes_opening_their_stores_at_once_get_the_same_answer_about_devices(tmp_path):
    """Each runtime of a service opens its tree store from a thread of its own, at the same moment: the probe of
    one must not take the other's device node away (which left a runtime unavailable at start)."""
    alone = trees.devices_work(str(tmp_path))
    start = threading.Barrier(4)

    def probe() -> set[str]:
        start.wait()
        return {trees.devices_work(str(tmp_path)) for _ in range(200)}

    with ThreadPoolExecutor(4) as pool:
        answers = set().union(*pool.map(lambda _: probe(), range(4)))
    assert answers == {alone}
    assert os.listdir(tmp_path) == []


def test_in_the_image_trees_go_on_its_own_filesystem_not_the_data_volume(tmp_path, monkeypatch):
    """The service image makes /var/cache/sandlot: where the data dir is another filesystem (a volume), the
    trees go there, their system files hard links instead of 160 MB of copies on the volume; anywhere else
    (no such directory, or the same filesystem) <data dir>/trees as before."""
    from runtimes.jail.trees import tree_store as trees_module

    data = str(tmp_path / "data")
    os.makedirs(data)
    monkeypatch.setattr(trees_module, "IMAGE_TREES", str(tmp_path / "absent"))
    assert trees_module.trees_dir(data) == os.path.join(data, "trees")
    monkeypatch.setattr(trees_module, "IMAGE_TREES", str(tmp_path / "image"))
    os.makedirs(tmp_path / "image")
    assert trees_module.trees_dir(data) == os.path.join(data, "trees")  # one filesystem: links work there
    volume = tempfile.mkdtemp(dir="/dev/shm")  # another filesystem, as a volume is
    try:
        if os.stat(volume).st_dev == os.stat(tmp_path).st_dev:
            pytest.skip("/dev/shm is the same filesystem as the test's directory here")
        assert trees_module.trees_dir(volume) == str(tmp_path / "image" / "trees")
    finally:
        os.rmdir(volume)


@needs_root
def test_what_dead_instances_left_in_cells_goes_and_nothing_of_it_stays_in_a_cell(place, monkeypatch):
    """A killed instance leaves its runs' /tmp directories in their uids' cells, and maybe a cell half made. The
    next zygote on the tree removes them unless a live instance holds them; a /tmp is first renamed out of the
    cell (the uid's next run, whose root the cell is, would otherwise find it there should its removal fail)."""
    root = os.path.join(place, "tree")
    os.makedirs(os.path.join(root, "etc"))
    os.makedirs(os.path.join(root, "cells"))
    dead, live = RUN_UID, RUN_UID + 1
    for uid in (dead, live):
        with open(os.path.join(trees.make_run_tmp(root, uid), "left"), "w") as f:
            f.write("a run's file")
    held = dirlock.lock_shared(trees.run_tmp(root, live))
    half = os.path.join(root, "cells", f"{RUN_UID + 2}.build-1-1")
    os.makedirs(os.path.join(half, "etc"))
    failing: list[str] = []

    def remove_tree(path: str) -> None:  # a removal that fails (an I/O error): the trash stays where it was put
        failing.append(path)
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(trees, "remove_tree", remove_tree)
    try:
        removed = trees.clear_stale_run_tmps(root)
    finally:
        os.close(held)
    assert sorted(removed) == sorted([str(dead), os.path.basename(half)])
    assert sorted(os.listdir(os.path.join(root, "cells", str(dead)))) == ["etc"]  # no /tmp, and no trash of it
    assert os.listdir(trees.run_tmp(root, live)) == ["left"]
    assert any(os.path.dirname(path) == os.path.join(root, "cells") for path in failing)
    monkeypatch.undo()
    trees.clear_stale_run_tmps(root)  # the failed one is removed next time
    assert sorted(os.listdir(os.path.join(root, "cells"))) == sorted([str(dead), str(live)])


def resident_pages(path: str) -> int:
    """How many of the file's pages the page cache holds now (mincore)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    size = os.path.getsize(path)
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    fd = os.open(path, os.O_RDONLY)
    try:
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        vector = (ctypes.c_ubyte * pages)()
        assert libc.mincore(ctypes.c_void_p(address), ctypes.c_size_t(size), vector) == 0, ctypes.get_errno()
        libc.munmap(ctypes.c_void_p(address), ctypes.c_size_t(size))
    finally:
        os.close(fd)
    return sum(page & 1 for page in vector)


@pytest.mark.parametrize("uncache", [True, False])
def test_a_tree_built_by_copying_leaves_no_page_cache_of_what_it_read(place, uncache):
    """A container is charged for the page cache its processes fill: a tree copied onto another filesystem (or
    copied up by overlayfs to be linked) read every byte of hundreds of MB of files that runs mostly never
    read. Built with uncache (TreeStore sets it there: materialized.fills_cache), neither the sources' pages it read nor
    the copies' are left (here: a source on the data directory's filesystem, the tree on /dev/shm's tmpfs)."""
    if materialized.fills_cache("/dev/shm", place) is False:
        pytest.skip("/dev/shm is on the same filesystem as /var/tmp here")
    source = os.path.join(place, "src")
    os.mkdir(source)
    big = os.path.join(source, "big.bin")
    with open(big, "wb") as f:
        f.write(os.urandom(4 << 20))
        f.flush()
        os.fsync(f.fileno())
    with open(big, "rb") as f:
        f.read()  # cached, as an image's files are once the service has started
    assert resident_pages(big) > 0
    root = tempfile.mkdtemp(prefix="sandlot-tree-", dir="/dev/shm")
    try:
        materialized.materialize({"binds": [source], "hidden": [], "devices": [], "placed": {}}, root, uncache=uncache)
        with open(root + big, "rb") as f:
            assert f.read(16)  # the copy is whole
        left = resident_pages(big)
        assert (left == 0) if uncache else (left > 0), left
    finally:
        shutil.rmtree(root, ignore_errors=True)


@needs_root
def test_each_run_of_a_cell_gets_device_nodes_of_its_own(place):
    """utime() with no times needs only write access: a run could set a 0666 node's times to now, which later
    runs would read (every cell's nodes were links of the tree's). Each run's cell gets its nodes made anew."""
    spec, _module = _store_spec(place)
    spec["devices"] = ["/dev/null", "/dev/zero"]
    root = os.path.join(place, "tree")
    os.mkdir(root)
    materialized.materialize(spec, root)
    trees.make_run_tmp(root, RUN_UID)
    cell = root + tree_files.cell(RUN_UID)
    held = os.open(cell + "/dev/null", os.O_RDONLY)  # the node a run had: its number cannot be given again
    try:
        time.sleep(0.05)
        os.utime(held)  # a run's mark: the times set to now
        marked = os.fstat(held)
        untouched = os.stat(cell + "/dev/zero")
        trees.remove_run_tmp(root, RUN_UID)
        trees.make_run_tmp(root, RUN_UID)  # the uid's next run
        fresh = os.stat(cell + "/dev/null")
        assert fresh.st_ino != marked.st_ino and fresh.st_ino != os.stat(root + "/dev/null").st_ino
        assert stat.S_ISCHR(fresh.st_mode) and fresh.st_rdev == marked.st_rdev and stat.S_IMODE(fresh.st_mode) == 0o666
        assert os.stat(cell + "/dev/zero").st_ino == untouched.st_ino  # a node nobody marked is kept: no cost
    finally:
        os.close(held)
    with open(cell + "/dev/zero", "rb") as zero:
        assert zero.read(4) == b"\0\0\0\0"


def test_a_directory_replaced_under_its_name_is_not_taken_for_the_one_found_unlocked(tmp_path, monkeypatch):
    """Clearing dead instances' directories (at a zygote's start) locks what it opened, then renames by name:
    if the directory it opened was removed meanwhile and a live run's new one made under the same name, it must
    leave that one alone (it moved and removed a live run's /tmp, whose run then went on without caps)."""
    path = tmp_path / "tmp"
    path.mkdir()
    real_flock = dirlock.fcntl.flock

    def flock(fd, operation):
        if operation & dirlock.fcntl.LOCK_EX:  # just then, the owner removes its run's and makes the next one
            path.rmdir()
            path.mkdir()
            (path / "live").write_text("the next run's")
        return real_flock(fd, operation)

    monkeypatch.setattr(dirlock.fcntl, "flock", flock)
    assert not dirlock.remove_if_unlocked(path)
    assert (path / "live").read_text() == "the next run's"


def _tree_with_files(place: str) -> str:
    root = os.path.join(place, "tree")
    for directory in ("etc", "usr/lib/deep", "cells", "tmp"):
        os.makedirs(os.path.join(root, directory))
    for name in ("etc/hosts", "usr/lib/deep/lib.so"):
        with open(os.path.join(root, name), "w") as f:
            f.write(name)
    return root


@needs_root
def test_at_rest_only_the_cells_a_child_is_in_stay(place):
    """A busy spell leaves a cell per uid it used, each the tree's directories again and a name per file, charged
    to the container as kernel memory for as long as it is kept. At rest the cells of the caller's uids that hold
    no /tmp (no child, ready or running, is in them) go; one with a /tmp, and another instance's, stay; a retired
    uid's next run gets its cell again, whole."""
    root = _tree_with_files(place)
    own = range(RUN_UID, RUN_UID + 8)
    busy, idle, also_idle, upcoming, theirs = RUN_UID, RUN_UID + 1, RUN_UID + 2, RUN_UID + 3, RUN_UID + 100
    for uid in (busy, idle, also_idle, upcoming, theirs):
        trees.make_run_tmp(root, uid)
    for uid in (idle, also_idle, upcoming, theirs):
        trees.remove_run_tmp(root, uid)  # their runs are over
    cells = os.path.join(root, "cells")
    not_a_cell = os.path.join(cells, str(RUN_UID + 5))
    open(not_a_cell, "w").close()  # a name that is no cell (a file): left as it is

    assert sorted(trees.retire_idle_cells(root, own, kept=frozenset({upcoming}))) == [idle, also_idle]
    assert sorted(os.listdir(cells)) == sorted([str(busy), str(upcoming), str(theirs), str(RUN_UID + 5)])
    os.unlink(not_a_cell)
    assert os.path.isdir(trees.run_tmp(root, busy))

    fresh = trees.make_run_tmp(root, idle)  # its next run
    assert os.listdir(fresh) == []
    cell = os.path.join(cells, str(idle))
    assert os.path.samefile(os.path.join(cell, "usr/lib/deep/lib.so"), os.path.join(root, "usr/lib/deep/lib.so"))
    assert trees.retire_idle_cells(root, own) == [upcoming]  # not kept now; idle is its child's


@needs_root
def test_a_cell_retired_while_its_runs_tmp_is_being_made_is_made_again(place, monkeypatch):
    """A uid given out just as the idle cells are retired: its run's /tmp is made in a whole cell all the same,
    never in one taken away under it."""
    root = _tree_with_files(place)
    own = range(RUN_UID, RUN_UID + 8)
    trees.make_run_tmp(root, RUN_UID)
    trees.remove_run_tmp(root, RUN_UID)
    make_cells = trees.make_cells
    raced = []

    def then_retired(tree_root: str, uids: list[int]) -> None:
        make_cells(tree_root, uids)
        if not raced:  # the retirement lands between finding the cell and making the /tmp in it
            raced.extend(trees.retire_idle_cells(tree_root, own))

    monkeypatch.setattr(trees, "make_cells", then_retired)
    path = trees.make_run_tmp(root, RUN_UID)
    assert raced == [RUN_UID]
    assert os.path.isdir(path) and os.listdir(path) == []
    assert os.path.isfile(os.path.join(root, "cells", str(RUN_UID), "usr/lib/deep/lib.so"))


@needs_root
@pytest.mark.skipif(not os.path.isdir("/usr/share/zoneinfo/right"), reason="no tzdata right/ zones here")
def test_the_leap_second_zones_are_left_out_of_every_tree_and_the_usual_ones_are_there(place):
    """tzdata's right/ is nearly half of zoneinfo's names (and of the Node.js tree's): no run names a zone by it, and
    Python's zoneinfo.available_timezones() leaves it out. Every tree shows it empty; the usual zones are there."""
    for language, spec in runtime_specs(place).items():
        root = os.path.join(place, f"tree-{language}")
        os.mkdir(root)
        materialized.materialize(spec, root)
        assert os.listdir(root + "/usr/share/zoneinfo/right") == [], language
        assert os.path.isfile(root + os.path.realpath("/usr/share/zoneinfo/Europe/Paris")), language


def _image_tree(place: str, slots: int = 2) -> tuple[dict, str, trees.TreeStore]:
    """The Python runtime's tree built as the service image's Dockerfile builds it (`sandlot layers trees`), and a
    store that finds it there."""
    spec = runtime_specs(place)["python3"]
    image_dir = os.path.join(place, "image")
    image_trees.build(spec, image_dir, slots)
    return spec, image_dir, trees.TreeStore(os.path.join(place, "trees"), image_dir=image_dir)


def _restarted(place: str, image_dir: str, monkeypatch, name: str = "trees", beside: bool = False) -> trees.TreeStore:
    """The tree store of another instance (another process: nothing of the last one's image trees remembered). Not
    beside: the last one is gone, and the locks its process held on its slots with it."""
    if not beside:
        _killed(image_trees._slot_locks)
    monkeypatch.setattr(image_trees, "_assigned", {})
    monkeypatch.setattr(image_trees, "_finished", {})
    monkeypatch.setattr(image_trees, "_slot_locks", {})
    return trees.TreeStore(os.path.join(place, name), image_dir=image_dir)


def _killed(slot_locks: dict[str, dict[str, int]]) -> None:
    """What the end of an instance's process does to the locks it held on its slots."""
    for locks in slot_locks.values():
        for fd in locks.values():
            os.close(fd)
        locks.clear()


@needs_root
def test_an_image_tree_serves_runs_from_its_slots_and_nothing_is_built_or_copied_at_start(place):
    spec, image_dir, store = _image_tree(place)
    root = store.ensure(spec)
    try:
        assert os.path.dirname(root) == image_dir and os.listdir(store.root) == []  # no tree of the container's own
        # what an image leaves out is written as this container wants it: the hosts file naming its hostname, devices
        with open(root + "/etc/hosts") as f:
            assert f.read() == spec["generated"]["/etc/hosts"]
        assert sorted(os.listdir(root + "/dev")) == sorted(os.path.basename(d) for d in spec["devices"])
        assert trees.make_run_tmp(root, RUN_UID) == root + f"/cells/{RUN_UID}/tmp"
        assert os.readlink(root + f"/cells/{RUN_UID}") == "../slots/0"  # a slot of the image's, not a cell made now
        python = os.path.realpath(RuntimeConfig().python_path)
        code = CONFINED.format(root=root, uid=RUN_UID, python=python)
        out = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        # its own /tmp is its only writable place; no other uid's cell, no slot, is in sight
        assert out.stdout.splitlines() == ["['/tmp'] ['report.txt'] False", "Europe/Paris OpenSSL"]
        # the run sees what a cell of a tree made at start shows, and every file is the image tree's own inode
        made = os.path.join(place, "made")
        os.mkdir(made)
        materialized.materialize(spec, made)
        made_cell = materialized.make_cell(made, RUN_UID)
        os.mkdir(made_cell + "/tmp")
        with open(made_cell + "/tmp/report.txt", "w") as f:
            f.write("mine")
        slot = root + "/slots/0"
        assert {p: e[:3] for p, e in listing(slot).items()} == {p: e[:3] for p, e in listing(made_cell).items()}
        for dirpath, _dirnames, filenames in os.walk(slot + "/usr"):
            for name in filenames:
                path = os.path.join(dirpath, name)
                assert os.lstat(path).st_ino == os.lstat(root + path[len(slot) :]).st_ino, path
    finally:
        store.release(root)
        store.close()
    assert os.path.isdir(root)  # the image's tree stays after its last user


@needs_root
def test_an_image_trees_slots_go_to_one_uid_each_and_to_another_only_once_no_child_is_in_them(place):
    spec, _image_dir, store = _image_tree(place, slots=2)
    root = store.ensure(spec)
    uids = [RUN_UID + n for n in range(4)]
    try:
        trees.make_run_tmp(root, uids[0])
        trees.make_run_tmp(root, uids[1])
        assert [os.readlink(root + f"/cells/{uid}") for uid in uids[:2]] == ["../slots/0", "../slots/1"]
        # both slots hold a child's /tmp: a third uid gets a cell of its own, made as in a tree made at start
        third = trees.make_run_tmp(root, uids[2])
        assert not os.path.islink(root + f"/cells/{uids[2]}") and os.path.isdir(third)
        # the first uid's run is over (its /tmp gone, no process of it left): its slot may go to another uid
        trees.remove_run_tmp(root, uids[0])
        fourth = trees.make_run_tmp(root, uids[3])
        assert os.readlink(root + f"/cells/{uids[3]}") == "../slots/0" and os.listdir(fourth) == []
        assert not os.path.lexists(root + f"/cells/{uids[0]}")  # the first uid's next run makes its cell again
        # a slot whose uid's child is in it (its /tmp) is never given to another
        assert os.readlink(root + f"/cells/{uids[1]}") == "../slots/1"
        assert os.stat(root + f"/cells/{uids[1]}/tmp").st_uid == uids[1]
    finally:
        store.release(root)
        store.close()


@needs_root
def test_an_image_tree_is_found_whatever_the_hostname_and_shared_only_with_the_same_files(place):
    spec, image_dir, store = _image_tree(place)
    root = store.ensure(spec)
    other = trees.TreeStore(os.path.join(place, "trees"), image_dir=image_dir)  # another instance
    try:
        renamed = {**spec, "generated": {**spec["generated"], "/etc/hosts": tree_files.run_hosts("elsewhere")}}
        assert image_trees.image_key(renamed) == image_trees.image_key(spec)
        # held with other generated files: the other instance builds a tree of its own rather than change them
        own = other.ensure(renamed)
        assert os.path.dirname(own) == other.root
        with open(root + "/etc/hosts") as f:
            assert f.read() == spec["generated"]["/etc/hosts"]
        assert other.ensure(spec) == root  # alike: shared
        other.release(root)
        other.release(own)
        # a later zygote of the instance that holds it, wanting other generated files (its runs' resolvers changed):
        # a tree of its own, the image's left as its first zygotes' runs see it
        later = store.ensure(renamed)
        assert os.path.dirname(later) == store.root
        with open(later + "/etc/hosts") as f:
            assert f.read() == renamed["generated"]["/etc/hosts"]
        store.release(later)
    finally:
        store.release(root)
        store.close()
        other.close()


@needs_root
def test_an_image_trees_slots_a_killed_instance_gave_go_to_the_next_ones_uids(place, monkeypatch):
    spec, image_dir, store = _image_tree(place, slots=2)
    root = store.ensure(spec)
    for uid in (RUN_UID, RUN_UID + 1):
        trees.make_run_tmp(root, uid)
        trees.remove_run_tmp(root, uid)  # its run is over; the instance is then killed, its cells left
    store.close()
    restarted = _restarted(place, image_dir, monkeypatch)
    assert restarted.ensure(spec) == root
    try:
        trees.make_run_tmp(root, RUN_UID + 2)
        assert os.readlink(root + f"/cells/{RUN_UID + 2}") == "../slots/0"
        assert not os.path.lexists(root + f"/cells/{RUN_UID}")
    finally:
        restarted.release(root)
        restarted.close()


@needs_root
def test_an_image_tree_that_cannot_be_written_here_gives_way_to_a_tree_of_the_stores_own(place, monkeypatch):
    spec, _image_dir, store = _image_tree(place)

    def read_only(path: str, text: str) -> None:  # a read-only root filesystem (Kubernetes' readOnlyRootFilesystem)
        raise OSError(30, "Read-only file system", path)

    monkeypatch.setattr(image_trees, "_write", read_only)
    root = store.ensure(spec)
    try:
        assert os.path.dirname(root) == store.root
        with open(root + "/etc/hosts") as f:
            assert f.read() == spec["generated"]["/etc/hosts"]
    finally:
        store.release(root)
        store.close()


@needs_root
def test_a_slot_changing_hands_changes_nothing_a_run_of_any_slot_can_see(place):
    """The generated files of every slot are links to the tree's own: a slot given to another uid must not link
    them again, or their change time and link count (which every run reads) would tell when another uid got a
    slot."""
    spec, _image_dir, store = _image_tree(place, slots=1)
    root = store.ensure(spec)
    try:
        trees.make_run_tmp(root, RUN_UID)
        trees.remove_run_tmp(root, RUN_UID)  # its run is over: its slot may go to another uid
        seen = {target: os.lstat(root + "/slots/0" + target) for target in spec["generated"]}
        time.sleep(0.05)
        trees.make_run_tmp(root, RUN_UID + 1)
        assert os.readlink(root + f"/cells/{RUN_UID + 1}") == "../slots/0"
        for target, before in seen.items():
            after = os.lstat(root + "/slots/0" + target)
            assert (after.st_ino, after.st_nlink, after.st_ctime_ns) == (
                before.st_ino,
                before.st_nlink,
                before.st_ctime_ns,
            ), target
    finally:
        store.release(root)
        store.close()


@needs_root
def test_the_slots_of_an_instance_killed_beside_another_go_to_the_other_ones_uids(place, monkeypatch):
    """Each instance holds a lock on every slot it gave: the slots of one killed while another holds the tree go to
    the other's uids (no cell of the container's own made, every file copied up on overlayfs), those of a live one
    never."""
    spec, image_dir, first = _image_tree(place, slots=2)
    root = first.ensure(spec)
    for uid in (RUN_UID, RUN_UID + 1):
        trees.make_run_tmp(root, uid)
        trees.remove_run_tmp(root, uid)  # its runs are over
    first_locks = image_trees._slot_locks
    other = _restarted(place, image_dir, monkeypatch, "other", beside=True)  # another instance beside it: other uids
    assert other.ensure(spec) == root
    try:
        trees.make_run_tmp(root, RUN_UID + 99)  # every slot the live first instance's: a cell made, none taken
        assert not os.path.islink(root + f"/cells/{RUN_UID + 99}")
        assert {os.readlink(f"{root}/cells/{uid}") for uid in (RUN_UID, RUN_UID + 1)} == {"../slots/0", "../slots/1"}
        trees.remove_run_tmp(root, RUN_UID + 99)
        first.close()
        _killed(first_locks)  # the first instance is killed; the other goes on
        trees.make_run_tmp(root, RUN_UID + 100)
        assert os.path.islink(root + f"/cells/{RUN_UID + 100}")  # a slot of the dead instance's, not a cell made now
    finally:
        other.release(root)
        other.close()


@needs_root
def test_a_slot_is_never_given_away_from_a_uid_of_another_live_instance(place, monkeypatch):
    """An instance that takes the image tree alone must not count the uids a dead instance gave slots as its own: an
    instance started after it may be given the same uids (the dead one's block), and the first would give their slots
    to its uids, unserialised with the other's making a run's /tmp in them (its cell lock is per process)."""
    spec, image_dir, dead = _image_tree(place, slots=2)
    root = dead.ensure(spec)
    for uid in (RUN_UID + 1, RUN_UID):  # two instances' uids (blocks), both killed: as one here
        trees.make_run_tmp(root, uid)
        trees.remove_run_tmp(root, uid)
    dead.close()
    _killed(image_trees._slot_locks)
    first_state = ({}, {}, {})  # the instance that starts first takes the tree alone (its process's state)
    monkeypatch.setattr(image_trees, "_assigned", first_state[0])
    monkeypatch.setattr(image_trees, "_finished", first_state[1])
    monkeypatch.setattr(image_trees, "_slot_locks", first_state[2])
    first = trees.TreeStore(os.path.join(place, "first"), image_dir=image_dir)
    assert first.ensure(spec) == root
    second = _restarted(place, image_dir, monkeypatch, "second", beside=True)  # given the block RUN_UID + 1 was in
    assert second.ensure(spec) == root
    try:
        trees.make_run_tmp(root, RUN_UID + 1)  # its run, in the slot the dead instance gave that uid
        trees.remove_run_tmp(root, RUN_UID + 1)  # over: the next of that uid makes its /tmp there again
        monkeypatch.setattr(image_trees, "_assigned", first_state[0])
        monkeypatch.setattr(image_trees, "_finished", first_state[1])
        monkeypatch.setattr(image_trees, "_slot_locks", first_state[2])
        for uid in (RUN_UID + 50, RUN_UID + 51):  # uids of the first instance's, until every slot is taken
            trees.make_run_tmp(root, uid)
            trees.remove_run_tmp(root, uid)
            assert os.readlink(root + f"/cells/{RUN_UID + 1}") == "../slots/0"  # the second instance's uid keeps it
    finally:
        for store in (first, second):
            store.release(root)
            store.close()


@needs_root
def test_what_a_killed_instances_runs_left_in_the_image_trees_slots_goes_when_the_next_takes_it(place, monkeypatch):
    spec, image_dir, store = _image_tree(place, slots=2)
    root = store.ensure(spec)
    left = trees.make_run_tmp(root, RUN_UID)  # its run is killed with the instance: its /tmp stays
    with open(left + "/secret", "w") as f:
        f.write("x")
    store.close()
    restarted = _restarted(place, image_dir, monkeypatch)
    assert restarted.ensure(spec) == root
    try:
        assert not os.path.lexists(root + "/slots/0/tmp")
    finally:
        restarted.release(root)
        restarted.close()


# ---- an operator's layer added to the image's layer-less tree ---------------------------------------------------


def _layer(place: str, module: str, value: str) -> str:
    """A Python layer (a directory of modules) holding module, whose VALUE is value."""
    layer = tempfile.mkdtemp(prefix="sandlot-layer-", dir=place)
    os.makedirs(os.path.join(layer, module))
    with open(os.path.join(layer, module, "__init__.py"), "w") as f:
        f.write(f"VALUE = {value!r}\n")
    os.chmod(layer, 0o755)
    return layer


def _layered(layer: str) -> tuple[dict, dict]:
    """The Python runtime's tree spec with layer, and its layer-less one (what the image carries besides)."""
    runtime = PythonRuntime(RuntimeConfig(python_layer=layer))
    return runtime.tree().to_dict(), runtime.tree(layer=False).to_dict()


def _layerless_image(place: str, slots: int = 2) -> tuple[str, dict]:
    """An image-tree directory holding only the Python runtime's layer-less tree (the image's default layer is
    another than the operator's: its tree is of no use, and left out here)."""
    image_dir = os.path.join(place, "image")
    _spec, base = _layered(_layer(place, "unused", "x"))
    image_trees.build(base, image_dir, slots)
    return image_dir, base


IMPORTS_LAYER = """
import os, sys
os.chroot({root!r})
os.chdir("/")
os.chroot("/cells/{uid}")
os.chdir("/")
os.setgroups([])
os.setresgid({uid}, {uid}, {uid})
os.setresuid({uid}, {uid}, {uid})
writable = [d for d, _dirs, _files in os.walk("/") if os.access(d, os.W_OK)]
files = [os.path.join(d, f) for d, _dirs, names in os.walk("/opt") for f in names]
writable += [f for f in files if os.access(f, os.W_OK)]
print(writable, flush=True)
os.execv({python!r}, [{python!r}, "-I", "-S", "-c",
         "import sys; sys.path.insert(0, {layer!r}); import {module}; print({module}.VALUE)"])
"""


def _imports(root: str, uid: int, module: str) -> list[str]:
    """What a run of uid in its cell of the tree at root prints importing module from the layer: the places it may
    write, then module's VALUE (or the import's failure)."""
    python = os.path.realpath(RuntimeConfig().python_path)
    code = IMPORTS_LAYER.format(root=root, uid=uid, python=python, layer=tree_files.LAYER_IN_TREE, module=module)
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True)
    return [*out.stdout.splitlines(), *(["FAILED " + out.stderr.strip().splitlines()[-1]] if out.returncode else [])]


@needs_root
def test_the_image_carries_each_runtimes_tree_and_its_layer_less_one(place):
    """`sandlot layers trees`: the tree of the layers in use, and the one an operator's layer is added to."""
    layer = _layer(place, "probe", "1")
    image_dir = os.path.join(place, "image")
    built = PythonRuntime(RuntimeConfig(python_layer=layer)).build_image_tree(image_dir, 1)
    spec, base = _layered(layer)
    assert sorted(path for path, _new in built) == sorted(
        os.path.join(image_dir, image_trees.image_key(s)) for s in (spec, base)
    )
    # the layer-less one: no layer, and none of the libraries only the layer's ELF files load; spec only adds to it
    assert tree_files.LAYER_IN_TREE not in base["placed"] and set(base["binds"]) <= set(spec["binds"])
    assert image_trees.additions(spec, base)["placed"] == {tree_files.LAYER_IN_TREE: os.path.realpath(layer)}
    assert not os.path.lexists(image_trees.find(base, image_dir) + tree_files.LAYER_IN_TREE)
    # without a layer the two are one
    assert len(PythonRuntime(RuntimeConfig(python_layer="")).build_image_tree(image_dir, 1)) == 1
    # Node.js: the layer is all a layer-less tree lacks (node's libraries are node's own)
    node = NodeRuntime(RuntimeConfig(nodejs_path=shutil.which("node") or "/usr/bin/node", nodejs_layer=layer))
    if not node.missing():
        added = image_trees.additions(node.tree().to_dict(), node.tree(layer=False).to_dict())
        assert (added["binds"], added["placed"]) == ([], {tree_files.LAYER_IN_TREE: os.path.realpath(layer)})


@needs_root
def test_a_layer_the_image_has_no_tree_of_is_added_to_its_layer_less_tree_and_its_slots(place):
    image_dir, base = _layerless_image(place, slots=2)
    spec, spec_base = _layered(_layer(place, "probe", "operator's"))
    assert spec_base == base and image_trees.find(spec, image_dir) == ""  # no tree of this layer in the image
    store = trees.TreeStore(os.path.join(place, "trees"), image_dir=image_dir)
    root = store.ensure(spec, base)
    try:
        assert os.path.dirname(root) == image_dir and os.listdir(store.root) == []  # nothing built of its own
        layer_file = tree_files.LAYER_IN_TREE + "/probe/__init__.py"
        info = os.lstat(root + layer_file)
        assert (info.st_uid, stat.S_IMODE(info.st_mode) & 0o022) == (0, 0)  # root's, nobody else may write it
        uids = [RUN_UID + n for n in range(3)]
        for uid in uids:
            trees.make_run_tmp(root, uid)
        assert [os.readlink(root + f"/cells/{uid}") for uid in uids[:2]] == ["../slots/0", "../slots/1"]
        assert not os.path.islink(root + f"/cells/{uids[2]}")  # beyond the slots: a cell made now, the layer in it
        for uid in uids:
            assert os.lstat(root + tree_files.cell(uid) + layer_file).st_ino == info.st_ino  # the tree's own file
            assert _imports(root, uid, "probe") == ["['/tmp']", "operator's"]
        # recorded beside the tree, not in it (every cell clones its root)
        assert os.path.isfile(root + image_trees.ADDED)
        assert not any(name.startswith(".") for name in os.listdir(root))
        # a slot's listing is the tree's: what a cell made at start from a tree of spec shows
        made = os.path.join(place, "made")
        os.mkdir(made)
        materialized.materialize(spec, made)
        made_cell = materialized.make_cell(made, RUN_UID)
        slot = root + "/slots/0"
        assert {p: e[:3] for p, e in listing(slot).items() if not p.startswith("/tmp")} == {
            p: e[:3] for p, e in listing(made_cell).items()
        }
    finally:
        store.release(root)
        store.close()


@needs_root
def test_a_restarted_container_reuses_the_same_layer_and_replaces_another(place, monkeypatch):
    image_dir, base = _layerless_image(place, slots=2)
    first_spec, _base = _layered(_layer(place, "first", "1"))
    store = trees.TreeStore(os.path.join(place, "trees"), image_dir=image_dir)
    root = store.ensure(first_spec, base)
    trees.make_run_tmp(root, RUN_UID)
    for uid in (RUN_UID + 1, RUN_UID + 2, RUN_UID + 3):
        trees.make_run_tmp(root, uid)  # the last one beyond the slots: a cell of its own
    layer_file = root + tree_files.LAYER_IN_TREE + "/first/__init__.py"
    inode = os.lstat(layer_file).st_ino
    store.close()  # killed

    # the same layer again: found as it was, nothing copied
    added = []
    monkeypatch.setattr(image_trees, "_add", lambda *args: added.append(args))
    again = _restarted(place, image_dir, monkeypatch)
    assert again.ensure(first_spec, base) == root and added == []
    assert os.lstat(layer_file).st_ino == inode
    again.close()
    monkeypatch.undo()

    # another layer: the first one's files gone from the tree, every slot and every cell
    second_spec, _base = _layered(_layer(place, "second", "2"))
    restarted = _restarted(place, image_dir, monkeypatch)
    assert restarted.ensure(second_spec, base) == root
    try:
        assert os.listdir(root + tree_files.LAYER_IN_TREE) == ["second"]
        for slot in os.listdir(root + "/slots"):  # the first layer gone from every slot; the second comes as given
            assert not os.path.lexists(f"{root}/slots/{slot}{tree_files.LAYER_IN_TREE}"), slot
        assert not os.path.lexists(root + tree_files.cell(RUN_UID + 3))  # the cell beyond the slots: made again
        for uid in (RUN_UID + 10, RUN_UID + 11, RUN_UID + 12):
            trees.make_run_tmp(root, uid)
            assert _imports(root, uid, "second") == ["['/tmp']", "2"]
            assert _imports(root, uid, "first")[-1].startswith("FAILED ModuleNotFoundError")
        for slot in os.listdir(root + "/slots"):
            assert os.listdir(f"{root}/slots/{slot}{tree_files.LAYER_IN_TREE}") == ["second"], slot
    finally:
        restarted.release(root)
        restarted.close()

    # no layer at all (the layer-less spec itself): the image's tree as it was built
    bare = _restarted(place, image_dir, monkeypatch)
    assert bare.ensure(base, base) == root
    try:
        assert not os.path.lexists(root + tree_files.LAYER_IN_TREE)
        slots = [f"{root}/slots/{slot}" for slot in os.listdir(root + "/slots")]
        assert not any(os.path.lexists(slot + tree_files.LAYER_IN_TREE) for slot in slots)
        assert [name for name in os.listdir(image_dir) if ".added" in name] == [os.path.basename(root) + ".added"]
    finally:
        bare.release(root)
        bare.close()


@needs_root
def test_an_instance_wanting_another_layer_than_the_live_holders_gets_a_tree_of_its_own(place, monkeypatch):
    image_dir, base = _layerless_image(place, slots=2)
    first_spec, _base = _layered(_layer(place, "first", "1"))
    second_spec, _base = _layered(_layer(place, "second", "2"))
    store = trees.TreeStore(os.path.join(place, "trees"), image_dir=image_dir)
    root = store.ensure(first_spec, base)
    other = _restarted(place, image_dir, monkeypatch, "other", beside=True)  # another instance beside it
    try:
        assert other.ensure(first_spec, base) == root  # the same layer: shared
        own = other.ensure(second_spec, base)
        assert os.path.dirname(own) == other.root  # another: a tree of its own, the image's left as the first has it
        assert os.listdir(own + tree_files.LAYER_IN_TREE) == ["second"]
        assert os.listdir(root + tree_files.LAYER_IN_TREE) == ["first"]
        other.release(own)
        # a later zygote of the holder's own on another layer (the package routes rebuilt it): the same
        later = store.ensure(second_spec, base)
        assert os.path.dirname(later) == store.root and os.listdir(root + tree_files.LAYER_IN_TREE) == ["first"]
        store.release(later)
    finally:
        for holder in (store, other):
            holder.release(root)
            holder.close()


@needs_root
def test_what_a_container_killed_while_adding_a_layer_left_goes_at_the_next_take(place, monkeypatch):
    image_dir, base = _layerless_image(place, slots=2)
    spec, _base = _layered(_layer(place, "probe", "1"))
    store = trees.TreeStore(os.path.join(place, "trees"), image_dir=image_dir)

    def killed(scratch: str, tree: str) -> list[str]:
        raise KeyboardInterrupt  # the container dies with the layer copied beside the tree, not yet moved in

    monkeypatch.setattr(image_trees, "_new_entries", killed)
    with pytest.raises(KeyboardInterrupt):
        store.ensure(spec, base)
    root = image_trees.find(base, image_dir)
    assert not os.path.lexists(root + tree_files.LAYER_IN_TREE)
    monkeypatch.undo()
    restarted = _restarted(place, image_dir, monkeypatch)
    assert restarted.ensure(base, base) == root  # no layer now: what the dead one added goes
    try:
        assert not os.path.lexists(root + tree_files.LAYER_IN_TREE)
        assert sorted(os.listdir(image_dir)) == sorted([os.path.basename(root), os.path.basename(root) + ".added"])
    finally:
        restarted.release(root)
        restarted.close()


@needs_root
def test_a_slot_gets_the_added_layer_when_first_given_and_a_fill_killed_halfway_is_done_again(place, monkeypatch):
    """A start links the added layer into the slots its first runs need, not all of them; a slot whose fill a killed
    instance left halfway is emptied of it and filled again when it is next given, and runs in it see all of it."""
    image_dir, base = _layerless_image(place, slots=3)
    spec, _base = _layered(_layer(place, "probe", "1"))
    store = trees.TreeStore(os.path.join(place, "trees"), image_dir=image_dir)
    root = store.ensure(spec, base)
    layer_file = tree_files.LAYER_IN_TREE + "/probe/__init__.py"
    slots = [f"{root}/slots/{n}" for n in range(3)]
    assert not any(os.path.lexists(slot + tree_files.LAYER_IN_TREE) for slot in slots)  # none linked at the take
    trees.make_run_tmp(root, RUN_UID)
    assert os.readlink(root + tree_files.cell(RUN_UID)) == "../slots/0"
    assert os.lstat(slots[0] + layer_file).st_ino == os.lstat(root + layer_file).st_ino
    assert not any(os.path.lexists(slot + tree_files.LAYER_IN_TREE) for slot in slots[1:])  # only the slot given

    def killed(source: int, target: int, skipped: tuple = ()) -> None:
        raise KeyboardInterrupt  # the instance dies with the slot half filled: the layer's directory, empty

    monkeypatch.setattr(image_trees.materialized, "clone", killed)
    with pytest.raises(KeyboardInterrupt):
        trees.make_run_tmp(root, RUN_UID + 1)
    store.close()  # killed
    monkeypatch.undo()
    [entry] = image_trees._read_added(root)["entries"]  # the top-most directory the layer-less tree lacks
    assert os.path.isdir(slots[1] + entry) and not os.path.lexists(slots[1] + layer_file)

    again = _restarted(place, image_dir, monkeypatch)
    assert again.ensure(spec, base) == root
    try:
        for uid in (RUN_UID + 5, RUN_UID + 6):
            trees.make_run_tmp(root, uid)
            assert _imports(root, uid, "probe") == ["['/tmp']", "1"]
        given = {os.readlink(root + tree_files.cell(uid)) for uid in (RUN_UID + 5, RUN_UID + 6)}
        assert given == {"../slots/0", "../slots/1"}
        assert os.lstat(slots[1] + layer_file).st_ino == os.lstat(root + layer_file).st_ino
    finally:
        again.release(root)
        again.close()


@needs_root
@pytest.mark.parametrize(
    "entries", [["/../outside"], ["/slots"], ["relative"], ["/usr/./lib"], "not a list", {"slots": ["../0"]}]
)
def test_a_record_of_additions_naming_anything_but_a_path_in_the_tree_is_refused_and_nothing_removed(place, entries):
    image_dir, base = _layerless_image(place, slots=1)
    spec, _base = _layered(_layer(place, "probe", "1"))
    root = image_trees.find(base, image_dir)
    outside = os.path.join(image_dir, "outside")
    os.mkdir(outside)
    with open(root + image_trees.ADDED, "w") as f:
        record = entries if isinstance(entries, dict) else {"entries": entries}
        json.dump({"key": "added-other", "entries": ["/opt/other"], **record}, f)
    store = trees.TreeStore(os.path.join(place, "trees"), image_dir=image_dir)
    own = store.ensure(spec, base)
    try:
        assert os.path.dirname(own) == store.root  # the image's tree not used: a tree of the store's own
        assert os.path.isdir(outside) and os.path.isdir(root + "/slots/0") and os.path.isdir(root + "/usr/lib")
    finally:
        store.release(own)
        store.close()


@needs_root
def test_a_run_cannot_tell_from_the_added_layers_files_when_another_uids_slot_is_given_once_slots_are_filled(place):
    """A run in one slot reads the added layer's files (its hard links: the same inodes as every slot's). Linking them
    into a slot when it is first given moves their link count and change time, which every run sees: who began when,
    and how many at once. The slots the first runs did not take get the layer once those are served (fill_slots,
    provisions.py); from then on a slot given moves nothing a run can see (as the tree's own files, linked at the
    image's build: a slot changing hands relinks nothing, image_trees._prepare)."""
    image_dir, base = _layerless_image(place, slots=3)
    spec, _base = _layered(_layer(place, "probe", "1"))
    store = trees.TreeStore(os.path.join(place, "trees"), image_dir=image_dir)
    root = store.ensure(spec, base)
    try:
        layer_file = tree_files.LAYER_IN_TREE + "/probe/__init__.py"
        trees.make_run_tmp(root, RUN_UID)  # the start's first run: its slot filled as it is given
        assert trees.fill_slots(root) == 2  # the two others, once the first runs are served
        assert trees.fill_slots(root) == 0
        mine = root + tree_files.cell(RUN_UID) + layer_file  # what a run of RUN_UID stats
        before = os.stat(mine)
        time.sleep(0.05)
        for uid in (RUN_UID + 1, RUN_UID + 2):  # other tenants' runs, in the other slots
            trees.make_run_tmp(root, uid)
            assert _imports(root, uid, "probe") == ["['/tmp']", "1"]
        after = os.stat(mine)
        assert (after.st_nlink, after.st_ctime_ns) == (before.st_nlink, before.st_ctime_ns)
        assert image_trees._read_added(root)["slots"] == ["0", "1", "2"]
    finally:
        store.release(root)
        store.close()


@needs_root
def test_a_replacement_of_the_added_layer_killed_while_removing_the_old_one_leaves_no_slot_without_it(
    place, monkeypatch
):
    """An instance that replaces the added layer removes the old one from the tree and every slot first. Killed
    halfway through that removal, and the operator's additions back as they were at the next start, the record
    beside the tree must not still say the old layer is whole and which slots hold it: a slot given then would be
    one whose copy is gone, and runs in it could not import the operator's packages."""
    image_dir, base = _layerless_image(place, slots=2)
    first_spec, _base = _layered(_layer(place, "first", "1"))
    store = trees.TreeStore(os.path.join(place, "trees"), image_dir=image_dir)
    root = store.ensure(first_spec, base)
    trees.make_run_tmp(root, RUN_UID)  # slot 0, filled
    assert image_trees._read_added(root)["slots"] == ["0"]
    store.close()  # killed

    second_spec, _base = _layered(_layer(place, "second", "2"))
    real = image_trees.removal.remove
    [entry] = image_trees._read_added(root)["entries"]

    def remove(path: str) -> None:
        if path == root + entry:
            raise KeyboardInterrupt  # killed with the slots' copies of the old layer gone, the tree's not yet
        real(path)

    replacing = _restarted(place, image_dir, monkeypatch)
    monkeypatch.setattr(image_trees.removal, "remove", remove)
    with pytest.raises(KeyboardInterrupt):
        replacing.ensure(second_spec, base)
    monkeypatch.setattr(image_trees.removal, "remove", real)
    replacing.close()

    again = _restarted(place, image_dir, monkeypatch)
    assert again.ensure(first_spec, base) == root
    try:
        trees.make_run_tmp(root, RUN_UID + 5)
        assert os.readlink(root + tree_files.cell(RUN_UID + 5)) == "../slots/0"
        assert _imports(root, RUN_UID + 5, "first") == ["['/tmp']", "1"]
    finally:
        again.release(root)
        again.close()
