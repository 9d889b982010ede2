"""What the service leaves behind: nothing, after many runs and after it stops."""

import glob
import os
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import needs_root
from service import (
    IS_ROOT,
    Service,
    descendants,
    expected_processes,
    processes_with_uid_in,
    require_namespaces,
    wait_for,
)

SECCOMP_REFUSED = """
import errno, os, sys, pyseccomp
f = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
f.add_rule(pyseccomp.ERRNO(errno.EPERM), "seccomp")
f.add_rule(pyseccomp.ERRNO(errno.EPERM), "prctl", pyseccomp.Arg(0, pyseccomp.EQ, 22))
f.load()
os.execv(sys.executable, [sys.executable, "-m", "handler.cli", "serve"])
"""


def test_a_thousand_runs_leave_nothing_behind():
    svc = Service(MAX_WORKERS="4").start()
    try:
        codes = ["print(1)", "open('/tmp/f', 'w').write('x' * 1000)", "import os\nos.fork()", "while True: pass"]

        def one(i):
            code = codes[i % 4]
            return svc.run(code, timeout=0.2 if "while" in code else 5)

        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(one, range(1000)))
        assert all(r["code"] == 0 for r in results)
        assert sum(r["data"]["exit_code"] == -1 for r in results) == 250

        def settled() -> bool:  # as many ready as it keeps now (4 or more: it follows the load), nothing else
            python = svc.detail()["runtimes"]["python3"]
            ready = python["ready_children"]
            return ready == python["ready_level"] >= 4 and python["uids_in_use"] in (None, ready)

        assert wait_for(settled)
        python = svc.detail()["runtimes"]["python3"]
        if IS_ROOT:
            uid_range = python["uid_range"]
            alive = processes_with_uid_in(*uid_range)
            assert len(alive) == python["ready_children"], alive  # exactly the ready children
        assert len(descendants(svc.process.pid)) == expected_processes(svc)  # zygotes and ready children
        replaced = python["zygote_generation"] - python["zygotes"]  # zygotes started beyond the first ones
        assert python["zygote_forks"] + 2000 * replaced >= 1000
    finally:
        svc.stop()
    assert descendants(svc.process.pid) == []
    if IS_ROOT:
        assert wait_for(lambda: not processes_with_uid_in(*uid_range))
    assert glob.glob(f"/tmp/sandlot-root-*-{svc.process.pid}-*") == []  # its trees' mount points


def test_zygote_is_replaced_and_runs_go_on():
    svc = Service(SANDLOT_ZYGOTE_MAX_FORKS="20", MAX_WORKERS="2").start()
    try:
        seeds = set()
        for _ in range(60):
            data = svc.run("import sys\nprint(hash('sandlot'))")["data"]
            assert data["exit_code"] == 0
            seeds.add(data["stdout"])
        python = svc.detail()["runtimes"]["python3"]
        assert python["zygote_generation"] > python["zygotes"]  # one replaced at least
        assert len(seeds) >= 2  # a new zygote, a new hash seed
        assert wait_for(lambda: len(descendants(svc.process.pid)) == expected_processes(svc))  # old zygotes left
    finally:
        svc.stop()


def test_stop_leaves_no_process():
    svc = Service().start()
    svc.run("print(1)")
    below = descendants(svc.process.pid)
    assert below
    svc.stop()
    assert svc.process.returncode in (0, -15)  # uvicorn re-raises SIGTERM after a clean shutdown
    assert "Application shutdown complete" in svc.output()
    assert wait_for(lambda: not any(os.path.exists(f"/proc/{pid}") for pid in below))


def test_killed_zygote_is_restarted():
    svc = Service(MAX_WORKERS="2").start()
    try:
        zygote = min(descendants(svc.process.pid))
        os.kill(zygote, 9)
        assert wait_for(lambda: svc.run("print('back')").get("data", {}) or False, 10)
        data = svc.run("print('back')")
        assert data["data"]["stdout"] == "back\n", data
    finally:
        svc.stop()


def test_runs_are_refused_when_seccomp_cannot_be_installed():
    svc = Service()
    svc.process = None
    import subprocess

    svc.log = open(svc.log_path, "wb")  # noqa: SIM115
    svc.process = subprocess.Popen(
        [sys.executable, "-c", SECCOMP_REFUSED], env=svc.env, stdout=svc.log, stderr=subprocess.STDOUT
    )
    try:
        assert wait_for(lambda: _safe_detail(svc) is not None, 60)
        assert wait_for(lambda: "seccomp" in _safe_detail(svc)["runtimes"]["python3"]["error"], 60)
        envelope = svc.run("print(1)")
        assert envelope["code"] == -500 and envelope["data"] is None
        assert "seccomp" in envelope["message"]
        import httpx

        assert httpx.get(svc.url + "/health").status_code == 503
    finally:
        svc.stop()


def test_operator_may_opt_out_of_seccomp_explicitly():
    svc = Service(SANDLOT_REQUIRE_SECCOMP="false")
    import subprocess

    svc.log = open(svc.log_path, "wb")  # noqa: SIM115
    svc.process = subprocess.Popen(
        [sys.executable, "-c", SECCOMP_REFUSED], env=svc.env, stdout=svc.log, stderr=subprocess.STDOUT
    )
    try:
        svc.wait_healthy()
        assert svc.run("print('unfiltered')")["data"]["stdout"] == "unfiltered\n"
        assert svc.detail()["runtimes"]["python3"]["protections"]["seccomp"] is False
    finally:
        svc.stop()


def _safe_detail(svc):
    try:
        return svc.detail()
    except Exception:  # noqa: BLE001 - not up yet
        return None


@pytest.fixture(scope="module")
def reduced():
    require_namespaces()
    svc = Service(SANDLOT_JAIL="reduced").start()
    yield svc
    svc.stop()


def test_reduced_jail_still_confines(reduced):
    # reduced is the userns jail: the tree, a tmpfs /tmp and namespaces of the run's own, no root needed
    protections = reduced.detail()["runtimes"]["python3"]["protections"]
    assert protections == {
        **protections,
        "mode": "userns",
        "chroot": True,
        "own_uid": False,
        "user_namespace": True,
        "pid_namespace": True,
        "seccomp": True,
        "private_tmp": "tmpfs",
    }
    data = reduced.run(
        "import os\nprint(sorted(os.environ))\nprint(os.getcwd())\nopen('mine', 'w').write('x')\nprint(os.listdir())"
    )["data"]
    assert data["stdout"] == "['HOME', 'LANG', 'TMPDIR']\n/tmp\n['mine']\n"
    assert reduced.run("import os\nprint(os.listdir('/tmp'))")["data"]["stdout"] == "[]\n"
    forked = reduced.run("import os\nos.fork()")["data"]
    assert "operation not permitted" in forked["error"].lower()
    assert "MemoryError" in reduced.run("x = bytearray(8 * 1024**3)")["data"]["error"]
    assert "error: timeout" in reduced.run("while True: pass", timeout=0.5)["data"]["error"]


def test_reduced_jail_keeps_signals_and_limits_to_the_run_itself(reduced):
    # signal 0 and a read of limits: harmless even if the jail were missing
    service = reduced.process.pid
    code = (
        "import os, resource\n"
        f"for target in ({service}, -{service}, -1):\n"
        "    try:\n        os.kill(target, 0)\n        print('signalled', target)\n"
        "    except (PermissionError, ProcessLookupError):\n        print('refused')\n"
        "os.kill(os.getpid(), 0)\n"
        f"try:\n    resource.prlimit({service}, resource.RLIMIT_NOFILE)\n    print('read its limits')\n"
        "except (PermissionError, ProcessLookupError):\n    print('refused')\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, resource.getrlimit(resource.RLIMIT_NOFILE))\n"
        "print('own limits ok')\n"
    )
    assert reduced.run(code)["data"]["stdout"] == "refused\n" * 4 + "own limits ok\n"
    node = f"try {{ process.kill({service}, 0); console.log('signalled') }} catch (e) {{ console.log(e.code) }}"
    assert reduced.run(node, language="nodejs")["data"]["stdout"] == "EPERM\n"  # the signal fence


def test_reduced_jail_cannot_read_the_service(reduced):
    code = f"print(open('/proc/{reduced.process.pid}/environ').read())"
    data = reduced.run(code)["data"]
    assert "API_KEY" not in data["stdout"] and "FileNotFoundError" in data["error"]  # no /proc at all


@needs_root
def test_other_instances_get_other_uids(service):
    other = Service().start()
    try:
        mine = service.run("import os, time\nprint(os.getuid())")["data"]["stdout"]
        theirs = other.run("import os\nprint(os.getuid())")["data"]["stdout"]
        assert int(mine) // 1024 != int(theirs) // 1024
    finally:
        other.stop()
