"""The chroot jail served from the service image's trees (runtimes/jail/trees/image_trees.py), attacked through
the HTTP API: a run in an image tree's slot must see this instance's generated files, and nothing of what an
earlier instance or an earlier uid of the slot left."""

from __future__ import annotations

import ast
import os
import shutil
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import needs_root
from service import Service

LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "image_tree_service.py")


@pytest.fixture
def dirs():
    """A data directory and an image-tree directory (the image's /opt/sandlot/image-trees), both off /tmp."""
    made = []
    for prefix in ("sandlot-slots-data-", "sandlot-slots-image-"):
        path = tempfile.mkdtemp(prefix=prefix, dir="/var/tmp")
        os.chmod(path, 0o755)
        made.append(path)
    yield made
    for path in made:
        shutil.rmtree(path, ignore_errors=True)


def serving(data: str, image: str, hostname: str = "", slots: int = 16, **env: str) -> Service:
    """A chroot-jail service (as root) whose Python trees are the image's, in image (built there on first use as
    the Dockerfile builds them); in a UTS namespace of its own named hostname, where given."""
    svc = Service(
        launcher=[],
        SANDLOT_JAIL="chroot",
        SANDLOT_DATA_DIR=data,
        NODEJS_PATH="/nonexistent/node",
        MAX_WORKERS="2",
        SANDLOT_TEST_IMAGE_TREES=image,
        SANDLOT_TEST_IMAGE_SLOTS=str(slots),
        SANDLOT_TEST_HOSTNAME=hostname,
        **env,
    )
    svc.launcher = [*(["unshare", "--uts"] if hostname else []), sys.executable, LAUNCHER]
    return svc.start()


def stdout(svc: Service, code: str) -> str:
    data = svc.run(code)["data"]
    assert data["error"] == "", data
    return data["stdout"]


HOSTS = "import os\nprint(os.getuid(), open('/etc/hosts').read().split()[2])"


@needs_root
@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare(1) for a hostname of the service's own")
def test_a_later_instance_with_another_hostname_is_not_served_the_earlier_ones_hosts_file(dirs):
    """An instance that takes the image's tree alone writes its own generated files; every slot, the ones an
    earlier instance (stopped, or killed) gave its uids included, must show them, not the earlier instance's."""
    data, image = dirs
    first = serving(data, image, hostname="first-host")
    try:
        seen = {stdout(first, HOSTS) for _ in range(4)}
        assert {line.split()[1] for line in seen} == {"first-host"}, seen
    finally:
        first.stop()
    second = serving(data, image, hostname="second-host")
    try:
        seen = {stdout(second, HOSTS) for _ in range(4)}
        assert {line.split()[1] for line in seen} == {"second-host"}, seen
    finally:
        second.stop()


CHANGE_SHARED = r"""
import os, sys
shared = [os.path.realpath(sys.executable), "/etc/hosts", "/etc/resolv.conf", "/dev/null", os.__file__]
for path in shared:
    for name, change in (
        ("link", lambda p: os.link(p, "/tmp/linked")),
        ("utime", lambda p: os.utime(p)),
        ("chmod", lambda p: os.chmod(p, 0o777)),
        ("xattr", lambda p: os.setxattr(p, "user.sandlot", b"x")),
        ("write", lambda p: open(p, "ab").close()),
    ):
        if path == "/dev/null" and name in ("utime", "write"):
            continue  # the slot's own node, made anew for each run: every run may write it
        try:
            change(path)
        except OSError:
            continue
        print("CHANGED", name, path)
"""


@needs_root
def test_a_run_in_a_slot_cannot_change_the_image_trees_files(dirs):
    """Every slot's files are the image tree's inodes (on the image's filesystem, the image layer's): no run may
    link, touch, chmod, tag or write one, and the tree's files are as they were after it."""
    data, image = dirs
    svc = serving(data, image)  # 16 slots: no cell of the container's own is made (it would link the files too)
    try:
        [root] = [os.path.join(image, name) for name in os.listdir(image)]
        cells = os.listdir(root + "/cells")
        assert all(os.path.islink(f"{root}/cells/{name}") for name in cells), cells
        before = {path: os.lstat(root + path) for path in ("/etc/hosts", "/etc/resolv.conf")}
        for _ in range(3):
            assert stdout(svc, CHANGE_SHARED) == ""
        for path, info in before.items():
            after = os.lstat(root + path)
            assert (after.st_ino, after.st_nlink, after.st_ctime_ns) == (info.st_ino, info.st_nlink, info.st_ctime_ns)
    finally:
        svc.stop()


LEAVE_AND_LOOK = r"""
import os, threading, time
mine = os.stat("/tmp")
print(repr((os.getuid(), os.stat("/").st_ino, os.listdir("/tmp"), os.stat("/dev/null").st_ctime >= mine.st_ctime - 1,
            sorted(os.listdir("/")))), flush=True)
open("/tmp/left", "w").write("x")
os.chmod("/tmp/left", 0o6777)
os.utime("/dev/null")
def spin():
    while True:
        open(f"/tmp/spin{threading.get_ident()}", "w").close()
for _ in range(4):
    threading.Thread(target=spin, daemon=True).start()
time.sleep(30)
"""


@needs_root
def test_a_slot_given_to_another_uid_after_a_run_that_timed_out_shows_nothing_of_it(dirs):
    """Runs that leave files (a setuid-moded one among them), touch their slot's device node and are still writing
    when their timeout ends them: a later run of another uid in the same slot finds an empty /tmp, a device node
    made anew, and nothing else in its root."""
    data, image = dirs
    svc = serving(data, image, slots=2, WORKER_TIMEOUT="1")
    try:
        with ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(lambda _: svc.run(LEAVE_AND_LOOK)["data"], range(16)))
    finally:
        svc.stop()
    [root] = [os.path.join(image, name) for name in os.listdir(image)]
    shown = sorted(name for name in os.listdir(root) if name not in ("cells", "slots"))  # as a cell shows the tree
    uids_by_slot: dict[int, set[int]] = {}
    for answer in answers:
        assert answer["outcome"] == "timeout", answer
        uid, slot, tmp, fresh_null, listing = ast.literal_eval(answer["stdout"].splitlines()[0])
        assert (tmp, fresh_null) == ([], True), answer
        assert listing == shown, answer
        uids_by_slot.setdefault(slot, set()).add(uid)
    assert any(len(uids) > 1 for uids in uids_by_slot.values()), uids_by_slot  # a slot did change hands


@pytest.fixture
def wheelhouse():
    """Two pure-Python wheels (an operator's packages), off /tmp and world-readable: a layer build's uid reads them."""
    from test_layers import make_wheel, reachable_place, readable

    places = reachable_place("sandlot-slots-wheels-")
    house = next(places)
    make_wheel(house, "sandlot-probe", "1.0", {"sandlot_probe.py": "VALUE = 'probe-ok'\n"})
    make_wheel(house, "sandlot-other", "1.0", {"sandlot_other.py": "VALUE = 'other-ok'\n"})
    readable(house)
    yield house
    next(places, None)  # removed


IMPORT = """
try:
    import {module}
    print({module}.VALUE)
except ImportError as exc:
    print(type(exc).__name__)
"""


@needs_root
def test_an_operators_layer_is_served_from_the_images_layer_less_tree(dirs, wheelhouse):
    """The image has a tree of its default layer and one without a layer; an operator's layer (dify-sandbox's
    dependencies file) is added to the layer-less one and its slots: runs import its packages, and no tree is built
    in the container. A restart with another layer is served that one, and nothing of the first."""
    data, image = dirs
    layers = (("sandlot-probe", "sandlot_probe", ""), ("sandlot-other", "sandlot_other", "sandlot_probe"))
    for package, module, gone in layers:
        requirements = os.path.join(str(wheelhouse), f"{package}.txt")
        with open(requirements, "w") as f:
            f.write(f"{package}\n")
        os.chmod(requirements, 0o644)
        svc = serving(
            data,
            image,
            SANDLOT_TEST_IMAGE_LAYERLESS="1",
            SANDLOT_PYTHON_REQUIREMENTS=requirements,
            SANDLOT_PIP_FIND_LINKS=str(wheelhouse),
        )
        try:
            answers = {stdout(svc, IMPORT.format(module=module)).strip() for _ in range(4)}
            assert answers == {module.replace("sandlot_", "") + "-ok"}, answers
            if gone:
                assert stdout(svc, IMPORT.format(module=gone)).strip() == "ModuleNotFoundError"
        finally:
            svc.stop()
        [tree] = [name for name in os.listdir(image) if not name.endswith(".added")]
        assert sorted(os.listdir(image)) == [tree, tree + ".added"]
        own = os.path.join(data, "trees")
        assert not os.path.isdir(own) or os.listdir(own) == [], os.listdir(own)  # no tree of the container's own
