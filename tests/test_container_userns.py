"""The service in a container with a user namespace of its own (rootless podman or Docker, userns-remap,
Kubernetes' `hostUsers: false`, `podman run --uidmap 0:100000:65536`).

Stand-in: tests/userns_map.py starts the service as root of a new user namespace whose maps hold 65,536
ids (root, and 65,535 more far from the host's), and in it tests/outer_filter.py gives it a PID namespace
of its own, as a container runtime does. SANDLOT_UID_BASE (1.5e9) and the uid below it are not
mapped there: setresuid and chown refuse them with EINVAL, and the service used to exit at start with a
traceback from the layer build's `os.chown(workdir, uid, uid)`. The uid block and the build uid now come
from the namespace's own map (runtimes/jail/service/uids.py).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

import pytest
from conftest import needs_root
from service import Service, standin

from runtimes.jail.service import uids

HERE = os.path.dirname(os.path.abspath(__file__))
MAP = "0:0:1,1:100001:65535"  # 65,536 ids, as `--uidmap 0:100000:65536` gives, root kept for the host's files


def userns(spec: str = MAP) -> list[str]:
    """The user namespace, then as in any container a PID namespace (and /proc) of its own, owned by it."""
    return [sys.executable, os.path.join(HERE, "userns_map.py"), spec, "--", *standin(["--pid-namespace"])]


def serving(spec: str = MAP) -> Service:
    """A service in the stand-in, its data dir a fresh one as a container's volume would be (not under /tmp):
    its layers are built there, as the build uid."""
    data = tempfile.mkdtemp(prefix="sandlot-userns-", dir="/var/tmp")
    os.chmod(data, 0o755)
    return Service(launcher=userns(spec), SANDLOT_DATA_DIR=data, MAX_WORKERS="2")


def write_map(path, lines: str) -> str:
    path.write_text(lines)
    return str(path)


def test_ids_come_from_the_map_and_avoid_the_images_users(tmp_path):
    """Blocks and the build uid lie inside both maps, clear of every user and group, and of each other."""
    uid_map = write_map(tmp_path / "uid_map", "         0     100000      65536\n")
    gid_map = write_map(tmp_path / "gid_map", "         0     100000      65536\n")
    ids = uids.IdMap.here(uid_map, gid_map)
    build = uids.build_uid(1_500_000_000, ids)
    first = uids.UidPool(1_500_000_000, 1024, str(tmp_path / "locks"), ids=ids)
    second = uids.UidPool(1_500_000_000, 1024, str(tmp_path / "locks"), ids=ids)
    blocks = [range(p.first, p.first + p.size) for p in (first, second)]
    assert all(b.stop <= 65536 and b.start > 0 and len(b) == 1024 for b in blocks)
    assert not set(blocks[0]) & set(blocks[1]) and build not in blocks[0] and build not in blocks[1]
    assert 0 < build < 65536
    for taken in uids.image_ids() | {65534, 65535}:
        assert taken != build and all(taken not in b for b in blocks), taken
    assert first.note == ""
    first.close()
    second.close()


def test_a_gid_map_narrower_than_the_uid_map_bounds_the_ids(tmp_path):
    uid_map = write_map(tmp_path / "uid_map", "0 100000 65536\n")
    gid_map = write_map(tmp_path / "gid_map", "0 100000 3000\n")
    ids = uids.IdMap.here(uid_map, gid_map)
    pool = uids.UidPool(1_500_000_000, 1024, str(tmp_path / "locks"), ids=ids)
    assert pool.first + pool.size <= 3000 and uids.build_uid(1_500_000_000, ids) < 3000
    pool.close()


def test_a_small_map_gives_a_smaller_block_and_says_so_and_a_tiny_one_refuses(tmp_path):
    small = uids.IdMap([(0, 600)], frozenset({0, 1, 2}))
    pool = uids.UidPool(1_500_000_000, 1024, str(tmp_path / "locks"), ids=small)
    assert 16 <= pool.size < 1024 and pool.first + pool.size <= 599
    assert f"uid blocks of {pool.size} ids, not 1024" in pool.note and "0-599" in pool.note
    pool.close()
    with pytest.raises(uids.UidPoolExhausted, match=r"SANDLOT_UID_BASE \(1500000000\) is not mapped.*0-19"):
        uids.UidPool(1_500_000_000, 1024, str(tmp_path / "locks"), ids=uids.IdMap([(0, 20)], frozenset({0})))


def test_on_a_host_the_blocks_start_at_the_base_as_always(tmp_path):
    ids = uids.IdMap([(0, 2**32 - 1)], frozenset({0, 1000}))
    assert uids.build_uid(1_500_000_000, ids) == 1_499_999_999
    pool = uids.UidPool(1_500_000_000, 1024, str(tmp_path / "locks"), ids=ids)
    assert (pool.first, pool.size, pool.note) == (1_500_000_000, 1024, "")
    pool.close()


def test_the_uids_said_to_come_next_are_the_ones_given(tmp_path):
    """The chroot jail makes the next runs' cells ahead for the uids upcoming() names (runtime._make_cells)."""
    pool = uids.UidPool(1_500_000_000, 64, str(tmp_path / "locks"), ids=uids.IdMap([(0, 2**32 - 1)], frozenset()))
    given = pool.acquire()
    pool.release(given)  # given back: the next one out again
    ahead = pool.upcoming(5)
    assert ahead[0] == given and [pool.acquire() for _ in range(5)] == ahead
    pool.close()


@needs_root
def test_a_user_namespaced_container_starts_serves_both_languages_and_builds_its_layers(tmp_path):
    """What `podman run --uidmap 0:100000:65536` met: a traceback at start. Now healthy, runs served as ids of
    the map, the layer built as one of them."""
    service = serving()
    try:
        service.start()
        assert service.run("print(6 * 7)")["data"]["stdout"] == "42\n", service.output()
        assert service.run("console.log(6 * 7)", language="nodejs")["data"]["stdout"] == "42\n"
        uid = service.run("import os; print(os.getuid())")["data"]["stdout"]
        assert 0 < int(uid) < 65536
        detail = service.detail()["runtimes"]["python3"]
        block = detail["uids"]
        assert block["first"] + block["size"] <= 65536 and detail["ready"]
        assert "Traceback" not in service.output()
    finally:
        service.stop()
        shutil.rmtree(service.env["SANDLOT_DATA_DIR"], ignore_errors=True)


@needs_root
def test_a_map_too_small_for_any_block_refuses_runs_with_the_reason_and_stays_up(tmp_path):
    service = serving("0:0:1,1:100001:20")
    try:
        service.start(wait=False)
        import time

        import httpx

        deadline = time.monotonic() + 120
        status = 0
        while time.monotonic() < deadline:
            assert service.process.poll() is None, service.output()
            try:
                status = httpx.get(service.url + "/health", timeout=2).status_code
                detail = service.detail()["runtimes"]["python3"]
                if detail["error"] and detail["error"] != "starting":
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        assert status == 503
        assert "is not mapped in this user namespace" in detail["error"]
        envelope = service.run("print(1)")
        assert envelope["code"] == -500 and "is not mapped" in envelope["message"]
        assert "Traceback" not in service.output()
    finally:
        service.stop()
        shutil.rmtree(service.env["SANDLOT_DATA_DIR"], ignore_errors=True)
