"""What a one-shot run leaves is found and removed: the sweep of a uid's processes and of the writable places.

These are the pieces the serial schedule (runtimes/jail/service/serial.py) runs after every run that shares the
runtime's uid (runtimes/jail/service/sweep.py, runtimes/jail/tmp/scratch.py); the
runtime functions' tests (test_lambda_runtime.py, test_lambda_simulated.py) show them at work end to end.
"""

import os
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))

from service import IS_ROOT  # noqa: E402
from simulated import SYSTEM_PYTHON, live_processes_of  # noqa: E402

from runtimes.jail.service import sweep  # noqa: E402
from runtimes.jail.service.sweep import kill_range, kill_strays, strays_of  # noqa: E402
from runtimes.jail.tmp.scratch import Scratch  # noqa: E402

pytestmark = pytest.mark.skipif(not IS_ROOT, reason="needs root: plays the run's uid and another uid")

RUN_UID = 61059  # a uid no other test uses: sweeping it touches nobody else's processes


def owned(path, uid: int, directory: bool = False) -> str:
    if directory:
        os.mkdir(path)
    else:
        with open(path, "w") as f:
            f.write("x")
    os.chown(path, uid, uid)
    return str(path)


def test_a_runs_leftovers_go_from_a_shared_place_and_other_uids_entries_stay(tmp_path):
    place = tmp_path / "tmp"
    place.mkdir()
    os.chmod(place, 0o1777)  # like /tmp: root's, sticky
    kept = owned(place / "the-runtimes-own", RUN_UID)
    others = [owned(place / f"someone-elses-{i}", 0) for i in range(50)]
    scratch = Scratch([str(place)], RUN_UID, own=[], runs_parent="")

    left = [owned(place / "left-file", RUN_UID), owned(place / "left-dir", RUN_UID, directory=True)]
    owned(place / "left-dir" / "inside", RUN_UID)
    others.append(owned(place / "someone-elses-later", 0))
    assert sorted(scratch.clean()) == sorted(left)
    assert sorted(os.listdir(place)) == sorted(os.path.basename(p) for p in [kept, *others])

    # the other uids' entries, once seen, are not looked at again; a new entry of the run's uid still is
    again = owned(place / "left-next-time", RUN_UID)
    assert scratch.clean() == [again]
    assert scratch.clean() == []


def test_in_a_place_the_run_may_rewrite_every_entry_is_looked_at_each_time(tmp_path):
    place = tmp_path / "own-tmpdir"
    place.mkdir()
    os.chown(place, RUN_UID, RUN_UID)  # like the function's TMPDIR: the run's uid may remove anything here
    foreign = owned(place / "roots", 0)
    scratch = Scratch([str(place)], RUN_UID, own=[], runs_parent="")
    assert scratch.clean() == []
    os.unlink(foreign)
    replaced = owned(place / "roots", RUN_UID)  # same name, now the run's
    assert scratch.clean() == [replaced]


def test_the_runtimes_own_files_are_watched(tmp_path):
    own = tmp_path / "data"
    own.mkdir()
    (own / "snapshot").write_text("x")
    scratch = Scratch([], RUN_UID, own=[str(own)], runs_parent="")
    assert scratch.tampered() is None
    (own / "snapshot").write_text("y")
    assert scratch.tampered() == []  # changed: the serial schedule replaces the zygote
    scratch.rebase()
    (own / "planted").mkdir()
    (own / "planted" / "inside").write_text("x")
    (own / "also").write_text("x")
    assert scratch.tampered() == sorted([str(own / "also"), str(own / "planted")], key=len)  # and removes them
    assert sorted(os.listdir(own)) == ["snapshot"]


def processes_of(uid: int) -> list[int]:
    return [pid for pid, _parent, _command in live_processes_of(uid)]


def as_run_uid(command: str) -> subprocess.Popen:
    return subprocess.Popen(
        ["setpriv", f"--reuid={RUN_UID}", f"--regid={RUN_UID}", "--clear-groups", "sh", "-c", command],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


@pytest.mark.skipif(not os.access(SYSTEM_PYTHON, os.X_OK), reason=f"needs {SYSTEM_PYTHON} (any uid can run it)")
def test_the_sweep_kills_every_process_of_the_uid_but_the_runtimes_own_children():
    kill_strays(RUN_UID)  # whatever an interrupted run of this test left
    ours = as_run_uid("exec sleep 60")  # a direct child of this process: what the runtime started itself
    try:
        # orphans of the uid, one of them non-dumpable (/proc shows it as root's)
        as_run_uid("sleep 60 & exit 0").wait()
        hidden = "import ctypes, time; ctypes.CDLL(None).prctl(4, 0, 0, 0, 0); time.sleep(60)"
        as_run_uid(f"{SYSTEM_PYTHON} -c '{hidden}' & exit 0")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # until both are there, the second one non-dumpable already
            strays = strays_of(RUN_UID)
            if len(strays) == 2 and any(os.stat(f"/proc/{pid}/status").st_uid == 0 for pid in strays):
                break
            time.sleep(0.05)
        else:
            pytest.fail(f"the sweep does not see both: {strays_of(RUN_UID)} of {processes_of(RUN_UID)}")
        assert ours.pid not in strays
        assert len(kill_strays(RUN_UID)) == 2
        assert strays_of(RUN_UID) == []
        assert processes_of(RUN_UID) == [ours.pid]
    finally:
        ours.kill()
        ours.wait()
        kill_strays(RUN_UID)


@pytest.fixture
def bystander():
    """A process of another uid (root's): what took a stray's pid between the scan and the kill."""
    process = subprocess.Popen(["sleep", "60"])
    yield process
    process.kill()
    process.wait()


def _seen_once_as(uid: int, pid: int, monkeypatch) -> None:
    """The scan's first read of pid's status says uid (the stray that held it); later reads are true."""
    real, seen = sweep._status, []

    def status(of: int):
        if of == pid and not seen:
            seen.append(of)
            return uid, 1, False
        return real(of)

    monkeypatch.setattr(sweep, "_status", status)


def test_the_sweep_spares_the_process_that_took_a_strays_pid(bystander, monkeypatch):
    """As root nothing refuses the signal: the uid is read again once a pidfd fixes which process is meant."""
    scans = iter([[bystander.pid]])  # the scan saw the pid as the uid's
    monkeypatch.setattr(sweep, "strays_of", lambda uid: next(scans, []))
    assert kill_strays(RUN_UID) == []
    assert bystander.poll() is None


def test_the_sweep_of_a_dead_instances_block_spares_what_took_one_of_its_pids(bystander, monkeypatch):
    """The same at start, for the uid block a killed instance left (the bystander, root's, passes the scan's
    first filter: a non-dumpable process shows as root's)."""
    _seen_once_as(RUN_UID, bystander.pid, monkeypatch)
    assert bystander.pid not in kill_range(RUN_UID, RUN_UID)
    assert bystander.poll() is None


def test_the_sweep_spares_its_own_child_that_took_a_strays_pid(monkeypatch):
    """Sharing the runs' uid (a Lambda function), the runtime's own new child may take a stray's pid."""
    ours = as_run_uid("exec sleep 60")
    try:
        scans = iter([[ours.pid]])  # the scan saw the pid as a stray's
        monkeypatch.setattr(sweep, "strays_of", lambda uid: next(scans, []))
        assert kill_strays(RUN_UID) == []
        assert ours.poll() is None
    finally:
        ours.kill()
        ours.wait()
