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


def _locked_tree(top) -> None:
    """What a run of the remover's uid may leave: directories their owner cannot list, search or write, deep, a
    symlink to somewhere else that must not be followed."""
    deep = top / "a" / "b" / "c"
    deep.mkdir(parents=True)
    (deep / "f").write_bytes(b"x" * 4096)
    (top / "a" / "link").symlink_to("/etc")
    (top / "z").mkdir()
    (top / "z" / "g").write_bytes(b"y")
    for path, mode in ((deep, 0), (top / "a" / "b", 0o300), (top / "a", 0o500), (top / "z", 0o100)):
        os.chmod(path, mode)


def test_removal_gives_directories_their_owners_bits_back_first():
    """As the runs' uid without capabilities (the landlock jail, Lambda): a 0300 directory, one made 0, one made
    read-only go with the rest (issue 41: shutil.rmtree left them, past the run, a SIGTERM and the next start)."""
    from runtimes.linux import removal
    from runtimes.linux.protections import in_child

    if os.geteuid() != 0:
        import pytest

        pytest.skip("needs root to act as another uid (nobody) whose directories root can read anyway")
    import pathlib
    import shutil
    import tempfile

    nobody = 65534
    base = tempfile.mkdtemp(prefix="sandlot-removal-", dir="/var/tmp")  # a place nobody can reach
    os.chmod(base, 0o755)
    os.chown(base, nobody, nobody)  # the runs' parent is the remover's own
    top = pathlib.Path(base) / "run-x"
    top.mkdir()
    os.chown(top, nobody, nobody)

    def as_nobody():
        os.setgroups([])
        os.setresgid(nobody, nobody, nobody)
        os.setresuid(nobody, nobody, nobody)
        _locked_tree(top)
        removal.remove_tree(str(top))
        return os.path.lexists(top)

    try:
        left, error = in_child(as_nobody)
        assert not error and left is False, (error, left)
        assert os.path.isdir("/etc")
    finally:
        shutil.rmtree(base)  # root's: whatever is left
