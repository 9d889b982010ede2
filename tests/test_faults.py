"""Faults: whatever dies (a zygote, a run, a ready child, the service), nothing of any run outlives it.

After each fault: no process of the instance's uid block is left but the ready
children, no uid is held by a dead run, no mount or egress rule is left once the
service has stopped, and the next run is served.
"""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from conftest import needs_root

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
import load  # noqa: E402
from service import Service, descendants, parent_of, processes_with_uid_in, wait_for

pytestmark = needs_root  # runs get uids of their own only as root: that is how their processes are found here

BUSY_PYTHON = "import os\nprint(os.getuid(), flush=True)\nwhile True: pass"
BUSY_NODE = "console.log(process.getuid()); while (true) {}"


class InFlight(threading.Thread):
    """One run, posted in the background; .envelope once it has answered."""

    def __init__(self, svc: Service, code: str, language: str = "python3", timeout: float = 30):
        super().__init__(daemon=True)
        self.svc, self.code, self.language, self.timeout = svc, code, language, timeout
        self.envelope: dict | None = None
        self.error: Exception | None = None
        self.start()

    def run(self) -> None:
        try:
            self.envelope = self.svc.run(self.code, language=self.language, timeout=self.timeout)
        except Exception as exc:  # noqa: BLE001 - the service may be gone: that is the point of some tests
            self.error = exc


def cpu_ticks(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return 0


def forked_by(zygote: int, pids) -> set[int]:
    """Those of pids the zygote forked (a run, or a ready child, is its zygote's own child)."""
    found = set()
    for pid in pids:
        try:
            if parent_of(pid) == zygote:
                found.add(pid)
        except OSError:
            continue
    return found


def busy_run_processes(uid_range: list[int]) -> list[int]:
    """Processes of the block that are burning CPU: the run's, not the ready children's."""
    return [p for p in processes_with_uid_in(*uid_range) if cpu_ticks(p) > 20]


def uid_range(svc: Service, language: str) -> list[int]:
    return svc.detail()["runtimes"][language]["uid_range"]


def settled(svc: Service, language: str) -> bool:
    """Nothing of a finished run left: every live process of the block is a ready child, and the uids in
    use are exactly theirs."""
    status = svc.detail()["runtimes"][language]
    alive = processes_with_uid_in(*status["uid_range"])
    ready = status["ready_children"]
    return status["zygote"] == "running" and status["uids_in_use"] == ready and len(alive) == ready


def serves(svc: Service) -> bool:
    python = svc.run("print('next')")
    node = svc.run("console.log('next')", language="nodejs")
    return python.get("data", {}).get("stdout") == "next\n" and node.get("data", {}).get("stdout") == "next\n"


@pytest.fixture(scope="module")
def svc():
    """One service for the faults it survives; each test waits until the previous one's fault has settled."""
    service = Service(MAX_WORKERS="2").start()
    yield service
    service.stop()


@pytest.fixture(autouse=True)
def _settled_before(request):
    if "svc" in request.fixturenames:
        service = request.getfixturevalue("svc")
        assert wait_for(lambda: settled(service, "python3") and settled(service, "nodejs"), 30)


def _wait_busy(uids: list[int], count: int = 1) -> list[int]:
    assert wait_for(lambda: len(busy_run_processes(uids)) >= count, 15)
    return busy_run_processes(uids)


@pytest.mark.parametrize("language", ["python3", "nodejs"])
def test_kill_9_of_the_zygote_takes_its_runs_and_ready_children_with_it(svc, language):
    uids = uid_range(svc, language)
    flight = InFlight(svc, BUSY_PYTHON if language == "python3" else BUSY_NODE, language)
    (busy,) = _wait_busy(uids)
    zygote = parent_of(busy)  # Python's lean zygote: the run imports nothing
    ready_before = forked_by(zygote, processes_with_uid_in(*uids)) - {busy}
    assert ready_before  # the runtime keeps children ready
    os.kill(zygote, signal.SIGKILL)
    flight.join(10)
    assert flight.envelope is not None and flight.envelope["code"] == 0, flight.envelope
    assert flight.envelope["data"]["exit_code"] == 137  # ended by the zygote's death, not by its timeout
    assert wait_for(lambda: not os.path.exists(f"/proc/{busy}"))
    assert wait_for(lambda: not (ready_before & set(processes_with_uid_in(*uids))))  # its ready children too
    assert wait_for(lambda: settled(svc, language), 20)
    assert serves(svc)


def test_a_zygote_killed_while_the_service_cannot_act_still_takes_its_runs(svc):
    """The kernel does it (parent-death signal armed after the uid change), not the service."""
    uids = uid_range(svc, "python3")
    flight = InFlight(svc, BUSY_PYTHON)
    (busy,) = _wait_busy(uids)
    zygote = parent_of(busy)
    ready = forked_by(zygote, processes_with_uid_in(*uids)) - {busy}
    assert ready
    os.kill(svc.process.pid, signal.SIGSTOP)
    try:
        os.kill(zygote, signal.SIGKILL)
        assert wait_for(lambda: not os.path.exists(f"/proc/{busy}"), 5)
        assert wait_for(lambda: not (ready & set(processes_with_uid_in(*uids))), 5)  # its ready children too
    finally:
        os.kill(svc.process.pid, signal.SIGCONT)
    flight.join(10)
    assert flight.envelope["data"]["exit_code"] == 137
    assert wait_for(lambda: settled(svc, "python3"), 20)
    assert serves(svc)


@pytest.mark.namespaces
@pytest.mark.parametrize("language", ["python3", "nodejs"])
def test_kill_9_of_a_running_child(svc, language):
    uids = uid_range(svc, language)
    flight = InFlight(svc, BUSY_PYTHON if language == "python3" else BUSY_NODE, language)
    (busy,) = _wait_busy(uids)
    assert nspid(busy)[-1] == "1"  # the run is the first process of its PID namespace
    os.kill(busy, signal.SIGKILL)
    flight.join(10)
    assert flight.envelope["data"]["exit_code"] == 137
    assert wait_for(lambda: not os.path.exists(f"/proc/{busy}"))
    assert wait_for(lambda: settled(svc, language), 20)
    assert serves(svc)


def nspid(pid: int) -> list[str]:
    """pid in each PID namespace it is in, outermost first."""
    with open(f"/proc/{pid}/status") as f:
        return next(line.split()[1:] for line in f if line.startswith("NSpid:"))


def test_kill_9_of_a_ready_child_mid_run(svc):
    uids = uid_range(svc, "python3")
    flight = InFlight(svc, "import time\ntime.sleep(1.5)\nprint('finished')")
    time.sleep(0.5)
    idle = [p for p in processes_with_uid_in(*uids) if cpu_ticks(p) < 5]
    assert idle
    for pid in idle[:2]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    flight.join(10)
    # the run in flight is not among them, or it was (then it says it was killed): never a wrong answer
    assert flight.envelope["data"]["stdout"] in ("finished\n", ""), flight.envelope
    assert wait_for(lambda: settled(svc, "python3"), 20)
    assert serves(svc)


def _leftovers(uids: list[list[int]]) -> list[int]:
    return [p for first, last in uids for p in processes_with_uid_in(first, last)]


def _mounts() -> str:
    with open("/proc/self/mountinfo") as f:
        return "".join(line for line in f if "sandlot" in line)


def _rules(uids: list[list[int]]) -> str:
    """Our blocks' nft tables, unless another live instance has claimed the block since."""
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    ours = [first for first, _ in uids if not load.block_claimed(first)]
    return "".join(line for line in tables.splitlines() if any(f"sandlot_{first}" in line for first in ours))


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_the_service_stopping_with_runs_in_flight_leaves_nothing(signum):
    svc = Service(MAX_WORKERS="2").start()
    mounts_before = _mounts()
    try:
        uids = [uid_range(svc, "python3"), uid_range(svc, "nodejs")]
        flights = [InFlight(svc, BUSY_PYTHON), InFlight(svc, BUSY_NODE, "nodejs")]
        assert wait_for(lambda: len(busy_run_processes(uids[0])) + len(busy_run_processes(uids[1])) == 2, 15)
        below = set(descendants(svc.process.pid)) | set(_leftovers(uids))
        svc.process.send_signal(signum)
        svc.process.wait(30)
        for flight in flights:
            flight.join(10)
        # (not "no process of the block": once the service is gone another instance may claim the block)
        assert wait_for(lambda: not any(os.path.exists(f"/proc/{p}") for p in below), 10)
        assert _mounts() == mounts_before
        roots = glob.glob(f"/tmp/sandlot-root-*-{svc.process.pid}-*")  # its trees' mount points (empty dirs)
        if signum == signal.SIGTERM:  # a killed service cannot remove its rules; the next one on the block does
            assert _rules(uids) == ""
            assert roots == []
    finally:
        svc.stop()
    again = Service(MAX_WORKERS="2").start()
    try:
        assert serves(again)
        assert not any(os.path.exists(root) for root in roots)  # a killed instance's: the next one removes them
    finally:
        again.stop()
