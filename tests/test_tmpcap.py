"""A run's /tmp as a plain directory (the chroot mode) keeps the tmpfs's caps against hostile code.

Each case forks a process that becomes a run's uid in a directory of its own, with the
RLIMIT_FSIZE a chroot-mode child gets, and does its worst there while the service's watcher
(runtimes/jail/tmp/caps.py) looks on; over a cap the watcher's callback kills it, as the runtime does.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import signal
import sys
import tempfile
import time
import types

import pytest

from runtimes.jail.tmp import caps as tmpcap
from runtimes.jail.trees import tree_store
from runtimes.linux import dirlock, syscalls

MIB = 1024 * 1024
RUN_UID = 1_499_999_001 if os.geteuid() == 0 else os.getuid()


@pytest.fixture
def run_dir():
    """A run's /tmp directory: 0700 and the run uid's, on a disk filesystem (not a tmpfs: none can be mounted)."""
    parent = tempfile.mkdtemp(prefix="sandlot-tmpcap-", dir="/var/tmp")
    os.chmod(parent, 0o711)  # as the tree's /tmp: passable, not listable
    path = os.path.join(parent, "run")
    os.mkdir(path, 0o700)
    os.chown(path, RUN_UID, RUN_UID)
    yield path
    tree_store.remove_tree(parent)  # shutil.rmtree recurses: the deepest cases would defeat it


def hostile(path: str, code: str, file_limit: int, dumpable: bool = False) -> tuple[int, int]:
    """A child that runs code as the run's uid in path, RLIMIT_FSIZE at file_limit: its pid and pidfd.
    dumpable: to its own uid after its last credential change, as a run whose held files are counted."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            if os.geteuid() == 0:  # without root the test's own uid plays the run's
                os.setgroups([])
                os.setresgid(RUN_UID, RUN_UID, RUN_UID)
                os.setresuid(RUN_UID, RUN_UID, RUN_UID)
            syscalls.set_dumpable(dumpable)
            os.chdir(path)
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_limit, file_limit))
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # as the interpreters do: EFBIG, not death
            exec(code, {"os": os, "time": time})
            os._exit(0)
        except BaseException as exc:  # noqa: BLE001
            os.write(2, f"hostile: {type(exc).__name__}: {exc}\n".encode())
            os._exit(3)
    return pid, os.pidfd_open(pid)


def watch_run(
    path: str, code: str, max_bytes: int, max_files: int, limit: float = 20.0, held: bool = False, **watcher
) -> dict:
    """Run code under the watcher; how it ended and what was left in its directory. held: the files the run
    holds after their names went are counted, as the runtime counts them (RunDirectories.confined)."""

    async def main() -> dict:
        watcher_ = tmpcap.TmpWatcher(**watcher)
        pid, pidfd = hostile(path, code, max_bytes, dumpable=held)
        ended: list[str] = []

        def over(reason: str) -> None:
            ended.append(reason)
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)

        cap = watcher_.watch(path, RUN_UID, max_bytes, max_files, over)
        if held:
            watcher_.count_held(cap, pid, RUN_UID)
        loop = asyncio.get_running_loop()
        gone = asyncio.Event()
        loop.add_reader(pidfd, gone.set)
        started = time.monotonic()
        try:
            await asyncio.wait_for(gone.wait(), limit)
        except TimeoutError:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            await gone.wait()
        loop.remove_reader(pidfd)
        status = os.waitid(os.P_PIDFD, pidfd, os.WEXITED)
        os.close(pidfd)
        elapsed = time.monotonic() - started
        left = tmpcap.usage(path, RUN_UID, 10**9)
        watcher_.unwatch(cap)
        watcher_.close()
        return {
            "ended": ended,
            "killed": status.si_code == os.CLD_KILLED,
            "exit": status.si_status,
            "left": left,
            "hidden": cap.hidden,
            "elapsed": elapsed,
            "seen": cap.usage,
        }

    return asyncio.run(main())


MANY_SMALL_FILES = """
n = 0
while True:
    with open(f"f{n}", "w") as f:
        f.write("x")
    n += 1
"""


def test_many_small_files_end_the_run_at_the_file_cap(run_dir):
    result = watch_run(run_dir, MANY_SMALL_FILES, 64 * MIB, 200)
    assert result["ended"] == ["error: /tmp file limit exceeded (200 files)"] and result["killed"]
    assert result["left"].files > 200  # what it managed before the kill: a bounded overshoot
    assert result["left"].files < 200 + 20_000


MANY_BIG_FILES = """
chunk = b"x" * (1 << 20)
n = 0
while True:
    with open(f"big{n}", "wb") as f:
        for _ in range(4):
            f.write(chunk)
    n += 1
"""


def test_many_big_files_end_the_run_at_the_size_cap_within_a_bounded_overshoot(run_dir):
    result = watch_run(run_dir, MANY_BIG_FILES, 16 * MIB, 2048)
    assert result["ended"] == ["error: /tmp size limit exceeded (16 MiB)"] and result["killed"]
    overshoot = result["left"].bytes - 16 * MIB
    assert 0 < overshoot < 256 * MIB, overshoot  # what it wrote between a scan and the kill


ONE_BIG_FILE = """
chunk = b"x" * (1 << 20)
with open("one", "wb", buffering=0) as f:
    try:
        while True:
            f.write(chunk)
    except OSError as exc:
        os.write(1, f"stopped: {exc.errno}".encode())
time.sleep(0.5)
"""


def test_one_file_stops_at_the_size_cap_by_rlimit(run_dir):
    """No single file passes the cap: the write fails with EFBIG, as a full tmpfs fails with ENOSPC."""
    result = watch_run(run_dir, ONE_BIG_FILE, 8 * MIB, 2048)
    assert os.path.getsize(os.path.join(run_dir, "one")) == 8 * MIB
    assert result["ended"] == [] and not result["killed"] and result["exit"] == 0
    assert result["seen"].bytes == 8 * MIB


# each writes 1 MiB files without end, from a directory far below the run's /tmp
FAR_BELOW = {
    "deep below new directories": 'os.makedirs("d/" * 60)\nos.chdir("d/" * 60)\n',
    # 40 names of 250 bytes: 10000 bytes of path, more than PATH_MAX
    "below a path longer than PATH_MAX": 'for _ in range(40):\n    os.mkdir("n" * 250)\n    os.chdir("n" * 250)\n',
}
FILL = """
chunk = b"x" * (1 << 20)
n = 0
while True:
    with open(f"file{n}", "wb") as f:
        f.write(chunk)
    n += 1
"""


@pytest.mark.parametrize("place", FAR_BELOW)
def test_writes_far_below_the_runs_tmp_are_seen(run_dir, place):
    result = watch_run(run_dir, FAR_BELOW[place] + FILL, 8 * MIB, 2048)
    assert result["ended"] == ["error: /tmp size limit exceeded (8 MiB)"] and result["killed"]


DEEPER_THAN_ANY_STACK = """
while True:
    os.mkdir("d")
    os.chdir("d")
"""


def test_directories_nested_past_any_recursion_limit_count_as_files(run_dir):
    result = watch_run(run_dir, DEEPER_THAN_ANY_STACK, 64 * MIB, 1200)
    assert result["ended"] == ["error: /tmp file limit exceeded (1200 files)"] and result["killed"]
    assert result["left"].files > 1200  # deeper than Python's recursion limit


HARD_LINKS = """
with open("target", "wb") as f:
    f.write(b"x" * (1 << 20))
for n in range(20):
    os.link("target", f"link{n}")
time.sleep(0.5)
"""


def test_hard_links_count_as_files_and_their_blocks_once_as_on_tmpfs(run_dir):
    """tmpfs charges every link an inode: 20 links and their file are 21 files, 1 MiB."""
    result = watch_run(run_dir, HARD_LINKS, 8 * MIB, 50)
    assert result["ended"] == [] and result["exit"] == 0
    assert result["seen"].files == 21
    assert MIB <= result["seen"].bytes < 2 * MIB  # the file once, and the directory's entries


LINKS_WITHOUT_END = """
open("target", "w").close()
n = 0
while True:
    os.link("target", f"link{n}")
    n += 1
"""


def test_links_to_one_file_end_the_run_at_the_file_cap(run_dir):
    """A run linking one file without end (a scan that counted them as one file walked millions of names on
    the service's event loop, stalling every other request for seconds)."""
    result = watch_run(run_dir, LINKS_WITHOUT_END, 64 * MIB, 200)
    assert result["ended"] == ["error: /tmp file limit exceeded (200 files)"] and result["killed"]


def test_a_scan_stops_at_the_file_cap_whatever_the_directory_holds(run_dir):
    os.mkdir(os.path.join(run_dir, "d"))
    target = os.path.join(run_dir, "d", "target")
    open(target, "w").close()
    for n in range(5000):
        os.link(target, os.path.join(run_dir, "d", f"link{n}"))
    seen: list[tuple] = []
    found = tmpcap.usage(run_dir, RUN_UID, 100, lambda _fd, key: seen.append(key))
    assert found.over_files and found.files == 101
    assert len(seen) == 2  # the top and d: no more directories were opened


def test_all_runs_scans_together_keep_to_their_share_of_the_event_loop(run_dir, monkeypatch):
    """Four runs whose every scan is slow (each directory 1,500 subdirectories, touched without pause): the
    scans take about SCAN_SHARE of the loop's time, whatever the number of runs, and a coroutine beside them
    keeps running. (Each run alone paced to a third of the loop, so three or more stalled the service.)"""
    dirs = []
    for n in range(4):
        path = os.path.join(run_dir, f"run{n}")
        os.mkdir(path)
        for m in range(1500):
            os.mkdir(os.path.join(path, f"d{m}"))
        dirs.append(path)
    busy = [0.0]
    real_usage = tmpcap.usage

    def timed_usage(*args, **kwargs):
        started = time.monotonic()
        try:
            return real_usage(*args, **kwargs)
        finally:
            busy[0] += time.monotonic() - started

    monkeypatch.setattr(tmpcap, "usage", timed_usage)

    async def main() -> tuple[float, int]:
        watcher = tmpcap.TmpWatcher()
        caps = [watcher.watch(path, os.getuid(), 64 * MIB, 10_000, lambda _reason: None) for path in dirs]
        stop = time.monotonic() + 2.0
        beats = 0
        busy[0] = 0.0
        started = time.monotonic()
        while time.monotonic() < stop:
            for path in dirs:  # every run's directory changes all the time: each wants a scan at once
                open(os.path.join(path, "f"), "w").close()
            await asyncio.sleep(0.002)
            beats += 1
        share = busy[0] / (time.monotonic() - started)
        for cap in caps:
            assert not cap.ended
            watcher.unwatch(cap)
        watcher.close()
        return share, beats

    share, beats = asyncio.run(main())
    assert share < 2 * tmpcap.SCAN_SHARE, share
    assert beats > 100  # the loop served the coroutine in between (a 2 ms sleep, 2 s long)


SPARSE = """
with open("sparse", "wb") as f:
    try:
        f.truncate(1 << 40)
    except OSError as exc:
        os.write(1, f"refused: {exc.errno}".encode())
    f.truncate((8 << 20) - 1)
    for offset in range(0, 8 << 20, 1 << 20):
        f.seek(offset)
        f.write(b"y")
time.sleep(0.5)
"""


def test_a_sparse_file_costs_what_it_stores(run_dir):
    result = watch_run(run_dir, SPARSE, 8 * MIB, 2048)
    assert result["ended"] == [] and result["exit"] == 0
    assert os.path.getsize(os.path.join(run_dir, "sparse")) == 8 * MIB - 1  # 1 TiB: refused by RLIMIT_FSIZE
    assert result["seen"].bytes <= 8 * 4096 * 2


HIDDEN = """
time.sleep(0.2)  # the runtime watches a run's directory before the run begins
chunk = b"x" * (1 << 20)
held = []
while True:
    fd = os.open("h", os.O_CREAT | os.O_RDWR, 0o600)
    os.unlink("h")
    for _ in range(4):
        os.write(fd, chunk)
    held.append(fd)
    if len(held) > 30:
        time.sleep(0.1)
"""


def test_files_deleted_while_open_are_noticed_and_end_the_run_when_the_disk_runs_low(run_dir):
    free = os.statvfs(run_dir)
    floor = free.f_bavail * free.f_frsize + 1024 * MIB  # the disk counts as nearly full from the start
    result = watch_run(run_dir, HIDDEN, 8 * MIB, 2048, disk_floor=floor)
    assert result["hidden"] and result["killed"]
    assert result["ended"] == ["error: /tmp size limit exceeded (the disk is nearly full)"]


def test_files_deleted_while_open_are_allowed_while_the_disk_has_room(run_dir):
    result = watch_run(run_dir, HIDDEN.replace("while True:", "for _ in range(3):"), 8 * MIB, 2048)
    assert result["hidden"] and result["ended"] == [] and result["exit"] == 0


MAPPED_AFTER_UNLINK = """
import mmap
time.sleep(0.2)  # the runtime watches a run's directory before the run begins
fd = os.open("m", os.O_CREAT | os.O_RDWR, 0o600)
os.ftruncate(fd, 8 << 20)
os.unlink("m")
mem = mmap.mmap(fd, 8 << 20)
mem[:] = b"x" * (8 << 20)  # writes through a mapping: inotify reports none of them
time.sleep(5)
"""
IN_A_REMOVED_DIRECTORY = """
time.sleep(0.2)
os.mkdir("d")
fd = os.open("d/f", os.O_CREAT | os.O_RDWR, 0o600)
os.unlink("d/f")
os.rmdir("d")  # its watch (if the watcher had one yet) goes with it: writes to f report nothing
for _ in range(8):
    os.write(fd, b"x" * (1 << 20))
time.sleep(5)
"""


@pytest.mark.parametrize("code", [MAPPED_AFTER_UNLINK, IN_A_REMOVED_DIRECTORY], ids=["mapped", "removed-directory"])
def test_files_hidden_without_a_write_event_end_the_run_when_the_disk_runs_low(run_dir, code):
    """Written through a mapping, or in a directory removed since: no MODIFY event ever tells; the name that
    went does, and the free space is then read while the run lives."""
    free = os.statvfs(run_dir)
    floor = free.f_bavail * free.f_frsize + 1024 * MIB  # the disk counts as nearly full from the start
    result = watch_run(run_dir, code, 64 * MIB, 2048, disk_floor=floor)
    assert result["hidden"] and result["killed"]
    assert result["ended"] == ["error: /tmp size limit exceeded (the disk is nearly full)"]


def test_a_slow_scan_does_not_hold_up_the_event_loop(run_dir, monkeypatch):
    """A deep tree on a busy disk made one scan take hundreds of milliseconds, all of them on the service's
    event loop: every request waited. Scans now run in a thread of the watcher's own."""
    real_usage = tmpcap.usage

    def slow_usage(*args, **kwargs):
        time.sleep(0.3)
        return real_usage(*args, **kwargs)

    monkeypatch.setattr(tmpcap, "usage", slow_usage)

    async def main() -> float:
        watcher = tmpcap.TmpWatcher()
        # (its first scan is on the loop, before the run begins: the directory holds only what the runner put)
        cap = watcher.watch(run_dir, RUN_UID, 64 * MIB, 2048, lambda _reason: None)
        gaps = []
        for n in range(60):
            if n % 10 == 0:
                open(os.path.join(run_dir, f"f{n}"), "w").close()  # a change: another scan
            before = time.monotonic()
            await asyncio.sleep(0.01)
            gaps.append(time.monotonic() - before)
        watcher.unwatch(cap)
        watcher.close()
        return max(gaps)

    assert asyncio.run(main()) < 0.15


TMPFILE = """
time.sleep(0.2)  # the runtime watches a run's directory before the run begins
fd = os.open(".", os.O_TMPFILE | os.O_RDWR, 0o600)
os.write(fd, b"z" * (1 << 20))
time.sleep(0.5)
"""


def test_an_unnamed_o_tmpfile_file_is_noticed(run_dir):
    result = watch_run(run_dir, TMPFILE, 8 * MIB, 2048)
    assert result["hidden"] and result["ended"] == []


SYMLINK_SWAP = """
os.mkdir("sub")
for n in range(2000):
    os.rename("sub", "old")
    os.symlink("/", "sub")
    os.unlink("sub")
    os.rename("old", "sub")
"""


def test_a_directory_swapped_for_a_symlink_is_never_followed(run_dir):
    """The scan runs as root: were it to follow a symlink to /, it would count the host's files."""
    result = watch_run(run_dir, SYMLINK_SWAP, 64 * MIB, 100)
    assert result["ended"] == [] and result["exit"] == 0


def test_the_scan_holds_few_descriptors_however_deep(run_dir):
    path = run_dir
    for _ in range(300):
        path = os.path.join(path, "d")
        os.mkdir(path)
    opened = []

    def directory(fd: int, key: tuple) -> None:
        opened.append(len(os.listdir("/proc/self/fd")))

    counted = tmpcap.usage(run_dir, os.geteuid(), 10_000, directory)
    assert counted.files == 300
    assert max(opened) - min(opened) <= 1


def test_without_inotify_watches_the_directory_is_scanned_on_a_timer(run_dir, monkeypatch):
    def refused(self, path, mask):
        raise OSError(28, "No space left on device")  # fs.inotify.max_user_watches reached

    monkeypatch.setattr(tmpcap.INotify, "add_watch", refused)
    result = watch_run(run_dir, MANY_BIG_FILES, 8 * MIB, 2048)
    assert result["ended"] == ["error: /tmp size limit exceeded (8 MiB)"] and result["killed"]


def test_a_run_directory_being_removed_is_not_taken_for_a_dead_instances(tmp_path, monkeypatch):
    """Another instance clearing dead instances' run directories (at a zygote's start) while this one removes
    its run's: it must leave the directory alone. (It took it, renamed it to a trash name and walked it at the
    same time: each remover failed on what the other had removed, and the directory stayed, the old run's
    files in it, while its uid went to the next run.)"""
    tree_root = str(tmp_path)
    os.mkdir(os.path.join(tree_root, "cells"), 0o711)
    directories = tmpcap.RunDirectories(tmpcap.TmpWatcher(), 64 * MIB, 2048)
    path, inside = directories.make(tree_root, RUN_UID)
    assert inside == "/tmp" and path == os.path.join(tree_root, "cells", str(RUN_UID), "tmp")
    for n in range(50):
        with open(os.path.join(path, f"f{n}"), "w") as f:
            f.write("secret")
    taken: list[list[str]] = []
    started: list[str] = []
    real_remove_tree = tree_store.remove_tree

    def remove_tree(target: str) -> None:
        if not started:  # the other instance clears stale directories just as this removal starts
            started.append(target)
            taken.append(tree_store.clear_stale_run_tmps(tree_root))
        real_remove_tree(target)

    monkeypatch.setattr(tree_store, "remove_tree", remove_tree)
    asyncio.run(directories.remove(types.SimpleNamespace(pid=1, tmpdir=path)))
    assert taken == [[]]
    assert os.listdir(os.path.dirname(path)) == []  # the cell stays, for the uid's next run


def test_a_removed_directorys_trash_name_cannot_be_guessed(tmp_path):
    """Should a removal fail, the trash stays where a later run of the same uid could look for it by name."""
    names = []
    for n in range(2):
        path = tmp_path / f"{RUN_UID}-{n}"
        path.mkdir()
        assert dirlock.remove_if_unlocked(path, remove=names.append)
    suffixes = [name.rsplit(dirlock.TRASH, 1)[1] for name in names]
    assert all(len(suffix) == 32 and int(suffix, 16) >= 0 for suffix in suffixes)
    assert suffixes[0] != suffixes[1]


NEW_DIRECTORY_DELETED_BEFORE_ITS_WATCH = """
time.sleep(0.2)
os.mkdir("d")
fd = os.open("d/f", os.O_CREAT | os.O_RDWR, 0o600)
os.unlink("d/f")  # before any scan found d: no watch of d ever saw the name go
for _ in range(8):
    os.write(fd, b"x" * (1 << 20))
time.sleep(5)
"""


def test_a_file_deleted_in_a_directory_not_yet_watched_ends_the_run_when_the_disk_runs_low(run_dir):
    free = os.statvfs(run_dir)
    floor = free.f_bavail * free.f_frsize + 1024 * MIB
    result = watch_run(run_dir, NEW_DIRECTORY_DELETED_BEFORE_ITS_WATCH, 64 * MIB, 2048, disk_floor=floor)
    assert result["hidden"] and result["killed"]
    assert result["ended"] == ["error: /tmp size limit exceeded (the disk is nearly full)"]


KEEPS_CHANGING = """
for n in range(1900):
    os.mkdir(f"d{n}")
end = time.monotonic() + 6
while time.monotonic() < end:
    for n in range(0, 1900, 50):
        open(f"d{n}/x", "w").close()
        os.unlink(f"d{n}/x")
"""
GOES_OVER_LATER = """
time.sleep(1.5)
for n in range(3):
    with open(f"f{n}", "wb") as f:
        f.write(b"x" * (3 << 19))
time.sleep(8)
"""


def test_a_run_that_keeps_changing_its_directory_does_not_hold_off_anothers_scan(run_dir):
    """Scans take turns: a run whose directory changes without pause (its own scan always due) once took
    every turn, and another run's 4.5 MiB against a 2 MiB cap went unseen until the first one stopped."""
    dirs = []
    for name in ("busy", "over"):
        path = os.path.join(run_dir, name)
        os.mkdir(path, 0o700)
        os.chown(path, RUN_UID, RUN_UID)
        dirs.append(path)

    async def main() -> tuple[float, bool]:
        watcher = tmpcap.TmpWatcher()
        _, busy = hostile(dirs[0], KEEPS_CHANGING, 64 * MIB)
        _, over = hostile(dirs[1], GOES_OVER_LATER, 64 * MIB)
        started = time.monotonic()
        ended_at: list[float] = []

        def end_over(_reason: str) -> None:
            ended_at.append(time.monotonic() - started)
            signal.pidfd_send_signal(over, signal.SIGKILL)

        caps = [
            watcher.watch(dirs[0], RUN_UID, 64 * MIB, 4096, lambda _reason: None),
            watcher.watch(dirs[1], RUN_UID, 2 * MIB, 4096, end_over),
        ]
        while not ended_at and time.monotonic() - started < 5:
            await asyncio.sleep(0.05)
        busy_alive = os.waitid(os.P_PIDFD, busy, os.WEXITED | os.WNOHANG) is None
        for pidfd in (busy, over):
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            os.waitid(os.P_PIDFD, pidfd, os.WEXITED)
            os.close(pidfd)
        for cap in caps:
            watcher.unwatch(cap)
        watcher.close()
        return (ended_at[0] if ended_at else float("inf")), busy_alive

    ended, busy_alive = asyncio.run(main())
    assert busy_alive  # the busy run was still changing its directory when the other was ended
    assert ended < 4.0, ended  # it went over at about 1.6 s


def test_a_run_ended_while_its_scan_waits_does_not_stop_the_others_scans(run_dir, monkeypatch):
    """A run ended while queued for another scan once left the queue stalled: a run behind it over its cap
    was never scanned."""
    real_usage = tmpcap.usage

    def slow_usage(*args, **kwargs):
        time.sleep(0.2)
        return real_usage(*args, **kwargs)

    monkeypatch.setattr(tmpcap, "usage", slow_usage)
    first, second = os.path.join(run_dir, "a"), os.path.join(run_dir, "b")
    os.mkdir(first)
    os.mkdir(second)
    for n in range(10):
        open(os.path.join(first, f"f{n}"), "w").close()
    with open(os.path.join(second, "big"), "wb") as f:
        f.write(b"x" * (4 * MIB))

    async def main() -> list[str]:
        watcher = tmpcap.TmpWatcher()
        ended: list[str] = []
        caps = [watcher.watch(first, os.getuid(), 64 * MIB, 5, lambda reason: ended.append("a: " + reason))]
        await asyncio.sleep(0.05)  # a's scan is under way
        open(os.path.join(first, "g"), "w").close()  # a is due again: it waits behind its own scan
        await asyncio.sleep(0.02)  # (the loop takes the event: a is queued first)
        caps.append(watcher.watch(second, os.getuid(), MIB, 2048, lambda reason: ended.append("b: " + reason)))
        deadline = time.monotonic() + 3
        while len(ended) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for cap in caps:
            watcher.unwatch(cap)
        watcher.close()
        return ended

    assert asyncio.run(main()) == [
        "a: error: /tmp file limit exceeded (5 files)",
        "b: error: /tmp size limit exceeded (1 MiB)",
    ]


def test_directories_coming_and_going_during_scans_lose_no_events(run_dir):
    """The scan thread records new watches while the loop drops those of removed directories: without a lock
    between them, the loop's handler failed ("dictionary changed size during iteration") and the rest of
    its batch of events was lost."""
    for n in range(1500):
        os.mkdir(os.path.join(run_dir, f"d{n}"))
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # hand the interpreter over often: the race shows in seconds, not minutes

    async def main() -> list:
        loop = asyncio.get_running_loop()
        failures: list = []
        loop.set_exception_handler(lambda _loop, context: failures.append(context.get("exception")))
        watcher = tmpcap.TmpWatcher()
        cap = watcher.watch(run_dir, RUN_UID, 64 * MIB, 4096, lambda _reason: None)
        end = time.monotonic() + 3
        while time.monotonic() < end:
            for n in range(0, 1500, 7):
                os.rmdir(os.path.join(run_dir, f"d{n}"))
                os.mkdir(os.path.join(run_dir, f"d{n}"))
            await asyncio.sleep(0.001)
        watcher.unwatch(cap)
        watcher.close()
        return failures

    try:
        assert asyncio.run(main()) == []
    finally:
        sys.setswitchinterval(switch)


def test_what_a_run_left_is_checked_before_its_result_however_busy_the_scans(run_dir, monkeypatch):
    """A run that writes past its cap at disk speed and ends at once, while another run's slow scan holds the
    turn (and the share after it): settle() scans it ahead of the rest, and the run ends over its cap."""
    real_usage = tmpcap.usage
    busy, quick = os.path.join(run_dir, "busy"), os.path.join(run_dir, "quick")
    os.mkdir(busy)
    os.mkdir(quick)

    def slow_for_busy(path, *args, **kwargs):
        if path == busy:
            time.sleep(0.5)
        return real_usage(path, *args, **kwargs)

    monkeypatch.setattr(tmpcap, "usage", slow_for_busy)

    async def main() -> tuple[list[str], float]:
        watcher = tmpcap.TmpWatcher()
        ended: list[str] = []
        caps = [watcher.watch(busy, os.getuid(), 64 * MIB, 2048, lambda _reason: None)]
        caps.append(watcher.watch(quick, os.getuid(), MIB, 2048, ended.append))
        await asyncio.sleep(0.05)  # the quick run's first scan waits behind the busy one's
        with open(os.path.join(quick, "big"), "wb") as f:
            f.write(b"x" * (4 * MIB))
        started = time.monotonic()
        await watcher.settle(caps[1])
        waited = time.monotonic() - started
        for cap in caps:
            watcher.unwatch(cap)
        watcher.close()
        return ended, waited

    ended, waited = asyncio.run(main())
    assert ended == ["error: /tmp size limit exceeded (1 MiB)"]
    assert waited < 1.5  # the busy scan under way, then this one: not the share's 2 s after it


# ---- issue 32: every way of writing (mapped, sparse and re-filled, preallocated) -------------------------------------

MAPPED_IN_VISIBLE_FILES = """
import mmap
time.sleep(0.2)  # the runtime watches a run's directory before the run begins
maps = []
for n in range(4):  # each file within RLIMIT_FSIZE (the cap), four of them past it
    fd = os.open(f"m{n}", os.O_CREAT | os.O_RDWR, 0o600)
    os.ftruncate(fd, 6 << 20)  # its last event: the size, with no block yet
    maps.append(mmap.mmap(fd, 6 << 20))
time.sleep(0.5)  # every scan the events asked for is done: 0 bytes
began = time.monotonic()
for mem in maps:
    mem[:] = b"x" * (6 << 20)  # writes through a mapping: inotify reports none of them
os.write(1, f"written {time.monotonic() - began:.3f}\\n".encode())
time.sleep(5)
"""


def test_writes_through_mappings_end_the_run_within_half_a_second(run_dir):
    """24 MiB written through mappings of four 6 MiB files against a 16 MiB cap: no event tells, the scans
    that come while the run lives do (its dirtied pages are in st_blocks from the fault on)."""
    result = watch_run(run_dir, MAPPED_IN_VISIBLE_FILES, 16 * MIB, 2048)
    assert result["ended"] == ["error: /tmp size limit exceeded (16 MiB)"] and result["killed"], result
    # 0.2 + 0.5 of sleeps and the writes before it passed the cap, then at most RESCAN_EVERY and a scan
    assert result["elapsed"] < 0.7 + 0.5 + 0.5, result["elapsed"]


SPARSE_REFILLED = """
time.sleep(0.2)
fds = []
for n in range(4):
    fd = os.open(f"s{n}", os.O_CREAT | os.O_RDWR, 0o600)
    os.ftruncate(fd, 6 << 20)  # all holes
    fds.append(fd)
time.sleep(0.3)
for fd in fds:
    for offset in range(0, 6 << 20, 1 << 20):  # the holes filled in, a MiB at a time, without growing the file
        os.pwrite(fd, b"y" * (1 << 20), offset)
time.sleep(5)
"""


def test_holes_filled_in_count_as_they_are_filled(run_dir):
    result = watch_run(run_dir, SPARSE_REFILLED, 16 * MIB, 2048)
    assert result["ended"] == ["error: /tmp size limit exceeded (16 MiB)"] and result["killed"], result
    assert result["elapsed"] < 0.5 + 0.5 + 0.5, result["elapsed"]


PREALLOCATED = """
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
time.sleep(0.2)
fd = os.open("p", os.O_CREAT | os.O_RDWR, 0o600)
answer = libc.fallocate(fd, 1, ctypes.c_long(0), ctypes.c_long(64 << 20))  # FALLOC_FL_KEEP_SIZE
os.write(1, f"keep size: {errno.errorcode.get(ctypes.get_errno()) if answer else 'allocated'}\\n".encode())
time.sleep(5)
"""


def test_space_preallocated_past_the_size_is_counted(run_dir):
    """fallocate(KEEP_SIZE) passes RLIMIT_FSIZE (runs refuse it: policy/allowlist.py); here, without the filter, the
    blocks it allocated are counted all the same (st_blocks, not the size), with no write event after."""
    result = watch_run(run_dir, PREALLOCATED, 16 * MIB, 2048)
    assert result["ended"] == ["error: /tmp size limit exceeded (16 MiB)"] and result["killed"], result
    assert result["elapsed"] < 0.2 + 0.5 + 0.5, result["elapsed"]


# ---- files held after their names went, counted from the run's own /proc entries (tmp/held.py) --------------

HELD_PAST_THE_CAP = """
time.sleep(0.2)  # the runtime watches a run's directory before the run begins
held = []
for n in range(4):  # each within RLIMIT_FSIZE (the cap), four of them twice past it
    fd = os.open(f"h{n}", os.O_CREAT | os.O_RDWR, 0o600)
    os.unlink(f"h{n}")
    os.write(fd, b"x" * (4 << 20))
    held.append(fd)
    os.write(1, f"held {n + 1} at {time.monotonic():.3f}\\n".encode())
time.sleep(5)
"""
TMPFILES_PAST_THE_CAP = """
time.sleep(0.2)
held = []
for n in range(4):  # never named at all
    fd = os.open(".", os.O_TMPFILE | os.O_RDWR, 0o600)
    os.write(fd, b"x" * (4 << 20))
    held.append(fd)
time.sleep(5)
"""
MAPPED_THEN_CLOSED = """
import mmap
time.sleep(0.2)
fd = os.open("m", os.O_CREAT | os.O_RDWR, 0o600)
os.write(fd, b"x" * (1 << 20))
mem = mmap.mmap(fd, 4096)  # (Python's mmap keeps a descriptor of its own: closed by hand below)
os.close(fd)
os.unlink("m")
for n in os.listdir("/proc/self/fd"):  # the mapping's own descriptor: then only the mapping holds m
    try:
        if os.readlink(f"/proc/self/fd/{n}").endswith("/m (deleted)"):
            os.close(int(n))
    except OSError:
        pass  # the listing's own descriptor, closed since
with open("visible", "wb") as f:
    f.write(b"y" * 8192)
time.sleep(5)
"""


@pytest.mark.parametrize("code", [HELD_PAST_THE_CAP, TMPFILES_PAST_THE_CAP], ids=["deleted while open", "O_TMPFILE"])
def test_files_held_after_their_names_went_count_against_the_cap(run_dir, code):
    """16 MiB in files no directory shows against an 8 MiB cap, the disk far from full: before, only the disk
    floor stood behind them."""
    result = watch_run(run_dir, code, 8 * MIB, 2048, held=True)
    assert result["ended"] == ["error: /tmp size limit exceeded (8 MiB)"] and result["killed"], result
    assert result["seen"].unnamed > 8 * MIB
    assert result["elapsed"] < 0.2 + 2.0, result["elapsed"]  # not the 5 s sleep: ended as it passed


HELD_AND_VISIBLE = """
time.sleep(0.2)
fd = os.open("h", os.O_CREAT | os.O_RDWR, 0o600)
os.unlink("h")
os.write(fd, b"x" * (4 << 20))
with open("visible", "wb") as f:
    f.write(b"y" * (VISIBLE << 20))
time.sleep(1)
"""


@pytest.mark.parametrize(("visible", "over"), [(3, False), (5, True)])
def test_what_a_run_holds_unnamed_and_named_counts_together(run_dir, visible, over):
    """4 MiB held after its name went and a visible file, against an 8 MiB cap: 3 MiB more fits, 5 does not."""
    code = HELD_AND_VISIBLE.replace("VISIBLE", str(visible))
    result = watch_run(run_dir, code, 8 * MIB, 2048, held=True)
    if over:
        assert result["ended"] == ["error: /tmp size limit exceeded (8 MiB)"] and result["killed"], result
    else:
        assert result["ended"] == [] and result["exit"] == 0, result


def test_a_file_held_only_by_a_mapping_counts_as_the_whole_cap(run_dir):
    """Its size cannot be read (no descriptor, /proc/<pid>/map_files needs CAP_CHECKPOINT_RESTORE): it counts as
    the most one file may hold, so the run is over as soon as it has anything else."""
    result = watch_run(run_dir, MAPPED_THEN_CLOSED, 8 * MIB, 2048, held=True)
    assert result["ended"] == ["error: /tmp size limit exceeded (8 MiB)"] and result["killed"], result


NON_DUMPABLE = """
import ctypes
time.sleep(0.2)
ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # as an exec of a file it cannot read would make it (a run's seccomp
fd = os.open("h", os.O_CREAT | os.O_RDWR, 0o600)  # refuses prctl; a Node run may exec what it wrote)
os.unlink("h")
os.write(fd, b"x" * 4096)
time.sleep(5)
"""


def test_a_run_whose_held_files_cannot_be_read_is_ended(run_dir):
    result = watch_run(run_dir, NON_DUMPABLE, 8 * MIB, 2048, held=True)
    assert result["killed"] and result["ended"] and result["ended"][0].startswith("error: /tmp could not be checked")


LEADER_ENDS_ALONE = """
import ctypes, threading
time.sleep(0.2)
def hold():
    time.sleep(0.3)  # the leader gone first
    held = []
    for n in range(4):  # as HELD_PAST_THE_CAP, from a thread
        fd = os.open(f"h{n}", os.O_CREAT | os.O_RDWR, 0o600)
        os.unlink(f"h{n}")
        os.write(fd, b"x" * (4 << 20))
        held.append(fd)
    time.sleep(5)
    os._exit(0)
threading.Thread(target=hold).start()
ctypes.CDLL(None).syscall({"x86_64": 60, "aarch64": 93}[os.uname().machine], 0)  # exit: the leader alone
"""


def test_files_held_by_a_group_whose_leader_ended_alone_count(run_dir):
    """The exit system call (not exit_group) ends the calling thread only, which the filter must admit for
    threads: the group lives on with all it holds, while the leader's /proc entries show no descriptor and no
    mapping (its table and memory went, its entries are root's). Another thread's entries show them."""
    result = watch_run(run_dir, LEADER_ENDS_ALONE, 8 * MIB, 2048, held=True)
    assert result["ended"] == ["error: /tmp size limit exceeded (8 MiB)"] and result["killed"], result
    assert result["elapsed"] < 0.5 + 2.0, result["elapsed"]


def test_a_mapping_counts_where_the_directory_is_reached_through_a_link(run_dir):
    """The kernel names a mapped file by its path without links (/proc/<pid>/maps), as a data directory or
    TMPDIR reached through a symbolic link is not: such a run's directory is compared as the kernel names it."""
    parent = os.path.dirname(run_dir)
    link = parent + "-link"
    os.symlink(parent, link)
    try:
        result = watch_run(os.path.join(link, "run"), MAPPED_THEN_CLOSED, 8 * MIB, 2048, held=True)
    finally:
        os.unlink(link)
    assert result["ended"] == ["error: /tmp size limit exceeded (8 MiB)"] and result["killed"], result


THREADS_HOLD_AS_THE_RUN_ENDS = """
import threading
time.sleep(0.2)
fd = os.open("h", os.O_CREAT | os.O_RDWR, 0o600)
os.unlink("h")
os.write(fd, b"x" * (4 << 20))
def spin():
    while True:
        os.fstat(fd)
for _ in range(8):
    threading.Thread(target=spin, daemon=True).start()
time.sleep(0.6)  # scanned a few times, threads running
os._exit(0)  # exit_group: every thread on its way out as a scan may be reading
"""


@pytest.mark.parametrize("attempt", range(5))
def test_a_run_that_ends_with_its_threads_holding_files_is_not_ended(run_dir, attempt):
    """Within the cap, many threads, ended by exit_group as a scan may be reading its entries: never "could not
    be checked", never a size it did not hold."""
    result = watch_run(run_dir, THREADS_HOLD_AS_THE_RUN_ENDS, 8 * MIB, 2048, held=True)
    assert result["ended"] == [] and result["exit"] == 0 and not result["killed"], result


def test_a_run_reaped_while_its_entries_are_read_holds_nothing(run_dir):
    """A scan may open a run's /proc/<pid> just before the run ends and is reaped: every read then answers
    ESRCH, which is its end (what it held went with it), never "could not be checked"."""
    from runtimes.jail.tmp import held as unnamed

    pid, pidfd = hostile(run_dir, "time.sleep(0.2)", 8 * MIB, dumpable=True)
    started = unnamed.start_time(pid)
    proc = os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.waitid(os.P_PIDFD, pidfd, os.WEXITED)  # reaped: the directory's entries are gone
        with unnamed.as_fs_user(RUN_UID, RUN_UID):
            assert unnamed._held_by_the_group(proc, str(pid), run_dir, RUN_UID, 8 * MIB) == 0
            assert unnamed.held_bytes(pid, started, run_dir, RUN_UID, 8 * MIB) == 0
    finally:
        os.close(proc)
        os.close(pidfd)
