"""The chroot jail served from the service image's trees (runtimes/jail/trees/image_trees.py), attacked through
the HTTP API: a run in an image tree's slot must see this instance's generated files, and nothing of what an
earlier instance or an earlier uid of the slot left."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

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
