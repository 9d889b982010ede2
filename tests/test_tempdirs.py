"""Temp dirs of a service or runtime function: removed at stop, and a killed one's at the next start."""

import fcntl
import os
import subprocess
import sys

from runtimes.linux import tempdirs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def test_a_killed_makers_directories_are_collected_by_the_next_and_a_live_ones_kept(tmp_path):
    dead = tmp_path / f"sandlot-data-{_dead_pid()}-abc"
    dead.mkdir()
    (dead / "snapshots").mkdir()
    alive = tmp_path / f"sandlot-data-{os.getppid()}-abc"  # the test runner's parent lives
    alive.mkdir()
    older = tmp_path / "sandlot-data-abcdefgh"  # an older release's name: no pid, left alone
    older.mkdir()
    made = tempdirs.make("data", str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([alive.name, older.name, os.path.basename(made)])
    assert os.path.basename(made).startswith(f"sandlot-data-{os.getpid()}-")
    tempdirs.remove_own()
    assert not os.path.exists(made)


def test_a_directory_someone_holds_a_lock_on_is_kept(tmp_path):
    held = tmp_path / f"sandlot-pasta-{_dead_pid()}-abc"
    held.mkdir()
    fd = os.open(held, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        assert tempdirs.collect("pasta", str(tmp_path)) == []
    finally:
        os.close(fd)
    assert tempdirs.collect("pasta", str(tmp_path)) == [str(held)]


def test_a_process_that_exits_removes_what_it_made(tmp_path):
    code = f"from runtimes.linux import tempdirs; print(tempdirs.make('data', {str(tmp_path)!r}))"
    made = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert made.stdout.strip().startswith(str(tmp_path))
    assert list(tmp_path.iterdir()) == []
