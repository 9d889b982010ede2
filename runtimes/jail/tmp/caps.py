"""Size and file caps on a run's /tmp where it is a plain directory (the chroot mode: no tmpfs can be mounted).

In the other modes a run's /tmp is a tmpfs of its own whose size and inode count the kernel
enforces (SANDLOT_TMP_SIZE_MB, SANDLOT_TMP_FILES). A default container can mount nothing and set
no quota, so a run's /tmp is a directory of the tree's filesystem (jail/trees/tree_store.py), and:

- no single file grows past the size cap: the child's RLIMIT_FSIZE (a write past it fails with
  EFBIG, as a full tmpfs fails with ENOSPC);
- the service watches each run's directory with inotify (inotify_simple) and, on activity,
  counts what the run holds there: every name (files, directories, symlinks, and each hard link:
  tmpfs too charges a link an inode, and a scan that counted a million links to one file as one
  would walk them all) and the blocks really allocated to the run's own inodes, once per inode (a
  sparse file costs what it stores; a link to a file that is not the run's costs nothing). Scans
  are fd-based and never follow a symlink, stop as soon as the file cap is passed, and come at
  most every few milliseconds per run (twice as far apart as the last scan took). They run one
  at a time in a thread of the watcher's own, never on the service's event loop (a scan of a
  deep tree under a busy disk takes hundreds of milliseconds), and all runs' scans together take
  at most SCAN_SHARE of the time: after a scan that took t, no other starts for
  t * (1 / SCAN_SHARE - 1) (runs with many files get their caps checked less often, the service
  is never stalled). When a run ends, what it changed since its last scan is scanned at once,
  ahead of the others, before its result is given (`settle`): a run writing at disk speed could
  otherwise end before its first scan came. Directories get a watch of their own as the scan finds
  them, through the descriptor it opened, so a directory swapped for a symlink is never watched.
  Over a cap, the run is ended with a clear `error: ...` line (`TmpCap.over`). Where inotify
  watches run out (fs.inotify.max_user_watches), the run's directory is scanned on a timer instead.
- a file deleted while still open, or made with O_TMPFILE, holds blocks no directory shows. Once the
  run is confined, every scan also counts what its process holds open or mapped whose last name went,
  from its own /proc entries (tmp/held.py: the run is dumpable to its uid, the scan thread takes its
  filesystem ids to read them; a run whose entries cannot be read is ended). What that cannot see (a
  descriptor in flight in a socketpair's queue) is capped per file by RLIMIT_FSIZE and in number by
  RLIMIT_NOFILE, and any run that has changed anything in its directory counts as one that may hold
  such: while it lives the filesystem's free space is read every DISK_EVERY seconds, and should it fall
  below a floor those runs are ended.
- writes through a mapping raise no inotify event: a run that has changed anything in its directory
  is also scanned again every RESCAN_EVERY seconds while it lives, events or not, and the blocks a
  mapping has dirtied are in st_blocks from the fault on (ext4 and xfs count delayed allocation). A
  run over its cap however it wrote ends within about RESCAN_EVERY plus a scan. fallocate() takes
  mode 0 only (policy/allowlist.py): FALLOC_FL_KEEP_SIZE would allocate past RLIMIT_FSIZE, unseen in the
  size, and punching holes needs it.

What this cannot give that a tmpfs gives: the caps are enforced after the fact, within a scan's
delay (a run writing at disk speed may pass the size cap by what it writes in that time before it
is killed), and files in flight in a socket's queue are bounded per file and by the disk floor, not
by the cap.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import errno
import logging
import os
import signal
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from inotify_simple import INotify
from inotify_simple import flags as ev

from runtimes.jail.policy import tree_files
from runtimes.jail.tmp import held as unnamed
from runtimes.jail.trees import tree_store
from runtimes.linux import dirlock

log = logging.getLogger("sandlot.jail")

MIB = 1024 * 1024
MIN_INTERVAL = 0.005  # seconds between two scans of one run, at least
SCAN_SHARE = 0.25  # of the event loop's time, for every run's scans together
POLL_INTERVAL = 0.05  # where no inotify watch could be had
DISK_FLOOR = 256 * MIB  # free space under which runs holding hidden files are ended
DIRECTORY_BLOCK = 4096  # not charged: an empty directory's size on ext4 and xfs
DISK_EVERY = 0.1  # seconds between two reads of the free space while a run may hold hidden files
RESCAN_EVERY = 0.2  # seconds, at most, between two scans of a run that has changed its directory, events or not
SETTLE_TIMEOUT = 2.0  # seconds a run's result waits, at most, for the scan of its last changes
WATCHED = (
    ev.CREATE | ev.MODIFY | ev.DELETE | ev.MOVED_TO | ev.MOVED_FROM | ev.ATTRIB | ev.CLOSE_WRITE | ev.ONLYDIR
)  # not EXCL_UNLINK: writes to a file deleted while open must still be reported
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass
class Usage:
    bytes: int = 0  # blocks allocated to the run's own inodes, once each (directories: past their first block)
    files: int = 0  # names below the top directory (each hard link one, as on tmpfs)
    unnamed: int = 0  # of bytes, what the run holds open or mapped whose last name went (tmp/held.py)
    over_files: bool = False  # the scan stopped because files passed the cap


class Unlistable(PermissionError):
    """A directory of the run's the service cannot list or search (its owner's r or x taken away, where the run
    shares the service's uid and the service holds no capability): uncounted, so the run is ended."""


ANCHOR_AFTER = 1024  # a relative path longer than this gets a descriptor of its own to start from (PATH_MAX)


@dataclass(eq=False)
class _Anchor:
    """An open directory that pending relative paths start from; closed when none is left (the top stays)."""

    fd: int
    users: int = 0


def usage(path: str, uid: int, max_files: int, on_directory: Callable[[int, tuple], None] | None = None) -> Usage:
    """What the run of uid holds in the directory at path (see the module's description). Never follows a
    symlink; stops once more than max_files names are found. Directories are opened by their path relative
    to an open ancestor, a new ancestor every ANCHOR_AFTER bytes of path: however deep or wide the
    directory is, few descriptors are open at once and no path passes PATH_MAX. on_directory(fd, key) is
    called for each directory, the top one too, with a descriptor open on it (valid during the call only)."""
    found = Usage()
    seen: set[tuple[int, int]] = set()
    top = _Anchor(os.open(path, _DIR_FLAGS), users=1)
    anchors = [top]
    try:
        info = os.fstat(top.fd)
        found.bytes += max(0, info.st_blocks * 512 - DIRECTORY_BLOCK)
        seen.add((info.st_dev, info.st_ino))
        pending: list[tuple[_Anchor, str]] = [(top, "")]  # directories still to list
        while pending:
            anchor, relative = pending.pop()
            try:
                fd = _open_beneath(anchor.fd, relative) if relative else os.dup(anchor.fd)
            except PermissionError as exc:  # a directory the service cannot list: what it holds is unknown
                raise Unlistable(exc.errno, "a directory in it cannot be listed", relative) from exc
            except OSError:
                _release(anchor, top)
                continue  # removed, or swapped for a symlink, since it was listed
            own = _Anchor(fd) if len(relative) > ANCHOR_AFTER else None
            if own is not None:
                anchors.append(own)
            try:
                if on_directory is not None:
                    info = os.fstat(fd)
                    on_directory(fd, (info.st_dev, info.st_ino))
                with os.scandir(fd) as entries:
                    for entry in entries:
                        try:
                            info = entry.stat(follow_symlinks=False)
                        except FileNotFoundError:
                            continue  # gone since it was listed
                        except PermissionError as exc:  # a directory that can be listed but not searched
                            raise Unlistable(exc.errno, "a directory in it cannot be searched", relative) from exc
                        found.files += 1
                        if found.files > max_files:
                            found.over_files = True
                            return found
                        key = (info.st_dev, info.st_ino)
                        if key in seen:
                            continue  # another name of a file already counted (never a directory's)
                        seen.add(key)
                        if info.st_uid == uid:
                            allocated = info.st_blocks * 512
                            # a directory's first block is what any directory has (tmpfs charges none)
                            is_dir = stat.S_ISDIR(info.st_mode)
                            found.bytes += max(0, allocated - DIRECTORY_BLOCK) if is_dir else allocated
                        if stat.S_ISDIR(info.st_mode):
                            if own is not None:
                                own.users += 1
                                pending.append((own, entry.name))
                            else:
                                anchor.users += 1
                                pending.append((anchor, f"{relative}/{entry.name}" if relative else entry.name))
            finally:
                if own is None:
                    os.close(fd)
                elif own.users == 0:
                    os.close(own.fd)
                    own.fd = -1
                _release(anchor, top)  # after its children took their share of it
    finally:
        for anchor in anchors:
            if anchor.fd >= 0:
                os.close(anchor.fd)
                anchor.fd = -1
    return found


def _release(anchor: _Anchor, top: _Anchor) -> None:
    anchor.users -= 1
    if anchor.users == 0 and anchor is not top and anchor.fd >= 0:
        os.close(anchor.fd)
        anchor.fd = -1


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
SYS_OPENAT2 = 437  # the same number on every architecture
# below the directory, no symlink, no /proc magic link, no other mount on the way
RESOLVE = 0x08 | 0x04 | 0x02 | 0x01
_openat2_works = True


def _open_beneath(top: int, relative: str) -> int:
    """A directory below top by its relative path, no symlink followed anywhere on the way: openat2 with
    RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS, or (older kernels, filters that refuse it) one O_NOFOLLOW open
    per component."""
    global _openat2_works
    if _openat2_works:
        how = _OpenHow(_DIR_FLAGS, 0, RESOLVE)
        fd = _libc.syscall(SYS_OPENAT2, top, os.fsencode(relative), ctypes.byref(how), ctypes.sizeof(how))
        if fd >= 0:
            return fd
        err = ctypes.get_errno()
        if err not in (errno.ENOSYS, errno.EPERM):
            raise OSError(err, os.strerror(err), relative)
        _openat2_works = False
    fd = os.dup(top)
    try:
        for part in relative.split("/"):
            following = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = following
    except BaseException:
        os.close(fd)
        raise
    return fd


@dataclass(eq=False)
class TmpCap:
    """One run's /tmp directory under watch."""

    path: str
    uid: int
    max_bytes: int
    max_files: int
    over: Callable[[str], None]  # called once, with the `error: ...` line, when the run must end
    usage: Usage = field(default_factory=Usage)
    # the run's process, once confined and dumpable to its uid (counted): its pid, start time and gid
    pid: int = 0
    started: int = 0
    gid: int = 0
    real: str = ""  # its directory as the kernel names the files in it (/proc/<pid>/maps): no symbolic link
    hidden: bool = False  # the run may hold files no directory shows: it has changed something in its directory
    ended: str = ""
    _interval: float = MIN_INTERVAL
    _last_scan: float = 0.0
    _scan: asyncio.TimerHandle | None = None
    _polling: bool = False
    _watches: dict[tuple, int] = field(default_factory=dict)  # directory (dev, ino) -> watch descriptor
    _disk: asyncio.TimerHandle | None = None  # the next read of the free space, while hidden
    _dirty: bool = False  # changed since its last scan began
    _urgent: bool = False  # its run has ended: its last scan goes first, whatever the share says
    _settled: list[asyncio.Future] = field(default_factory=list)  # settle()'s waiters for that scan


class TmpWatcher:
    """Watches the /tmp directories of a runtime's runs (one inotify instance for all); see the module."""

    def __init__(self, disk_floor: int = DISK_FLOOR):
        self.disk_floor = disk_floor
        self._inotify: INotify | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._by_watch: dict[int, TmpCap] = {}
        self._caps: set[TmpCap] = set()
        self._free_at = 0.0  # no scan of any run starts before (SCAN_SHARE)
        self._scanning: TmpCap | None = None  # the run whose directory the scan thread walks now
        self._waiting: dict[TmpCap, None] = {}  # runs whose scan waits for its turn, in order
        self._turn: asyncio.TimerHandle | None = None  # when the next waiting scan may start
        self._thread: concurrent.futures.ThreadPoolExecutor | None = None
        self._watch_lock = threading.Lock()  # caps' _watches and _by_watch: the scan thread adds to them

    def watch(self, path: str, uid: int, max_bytes: int, max_files: int, over: Callable[[str], None]) -> TmpCap:
        """Start capping path (a run's /tmp directory, owned by uid). Call from the event loop."""
        if self._inotify is None:
            self._loop = asyncio.get_running_loop()
            self._inotify = INotify()
            self._loop.add_reader(self._inotify.fileno(), self._on_events)
            self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sandlot-tmp-scan")
        cap = TmpCap(path, uid, max_bytes, max_files, over)
        # The first scan here, on the loop, before the run can begin: its directory holds only what its runner
        # put there (node's snapshot copy), and from now on every change is seen. Later scans, of what user
        # code made, run in the scan thread.
        cap.usage = self._walk(cap)
        self._caps.add(cap)
        self._judge(cap)
        if cap._polling and not cap.ended:
            self._schedule_poll(cap)
        return cap

    def unwatch(self, cap: TmpCap) -> None:
        """The run is over (or its directory about to be removed): no more scans or watches for it."""
        self._caps.discard(cap)
        self._waiting.pop(cap, None)
        cap.ended = cap.ended or "unwatched"
        _release_settled(cap)
        if cap._scan is not None:
            cap._scan.cancel()
            cap._scan = None
        if cap._disk is not None:
            cap._disk.cancel()
            cap._disk = None
        self._drop_watches(cap)

    def _drop_watches(self, cap: TmpCap) -> None:
        with self._watch_lock:
            dropped = list(cap._watches.values())
            cap._watches.clear()
            for wd in dropped:
                self._by_watch.pop(wd, None)
        for wd in dropped:
            if self._inotify is not None:
                with contextlib.suppress(OSError):
                    self._inotify.rm_watch(wd)

    def close(self) -> None:
        for cap in list(self._caps):
            self.unwatch(cap)
        if self._turn is not None:
            self._turn.cancel()
            self._turn = None
        if self._thread is not None:
            self._thread.shutdown(wait=True)  # a scan under way ends first: it uses the inotify instance
            self._thread = None
        if self._inotify is not None:
            self._loop.remove_reader(self._inotify.fileno())
            self._inotify.close()
            self._inotify = None

    # ---- events and scans -------------------------------------------------------------------------

    def _on_events(self) -> None:
        try:
            events = self._inotify.read(timeout=0)
        except OSError:
            return
        touched: set[TmpCap] = set()
        for event in events:
            if event.mask & ev.Q_OVERFLOW:
                touched.update(self._caps)  # events were lost: every run is scanned again, and may hide files
                for cap in self._caps:
                    cap.hidden = cap._dirty = True
                continue
            with self._watch_lock:
                cap = self._by_watch.get(event.wd)
                if cap is not None and event.mask & ev.IGNORED:  # its directory is gone
                    del self._by_watch[event.wd]
                    for key in [k for k, w in cap._watches.items() if w == event.wd]:
                        del cap._watches[key]
                    continue
            if cap is None:
                cap = self._scanning  # a watch the scan thread has just added, not yet recorded
                if cap is None:
                    continue
            cap.hidden = True  # any change: it may leave a file no directory shows (the module's description)
            cap._dirty = True
            touched.add(cap)
        for cap in touched:
            if cap.ended:
                continue
            self._watch_disk(cap)
            self._schedule(cap)

    def _schedule(self, cap: TmpCap) -> None:
        if cap.ended or cap._scan is not None:
            return
        delay = max(0.0, cap._last_scan + cap._interval - time.monotonic())  # the share: _next_turn
        cap._scan = self._loop.call_later(delay, self._scan_now, cap)

    def _scan_now(self, cap: TmpCap) -> None:
        """The run's scan is due: it takes its place in the queue (one scan at a time, in order)."""
        cap._scan = None
        if cap.ended:
            return
        self._waiting[cap] = None  # a run already waiting keeps its place
        self._next_turn()

    async def settle(self, cap: TmpCap, timeout: float = SETTLE_TIMEOUT) -> None:
        """The run has ended: scan what it changed since its last scan, ahead of every other run's (its result
        waits for it; a run writing at disk speed could otherwise end before its first scan came)."""
        if self._inotify is not None:
            self._on_events()  # its last changes may still wait in the queue
        if cap.ended or (not cap._dirty and not cap._polling and self._scanning is not cap):
            return
        done = self._loop.create_future()
        cap._settled.append(done)
        if cap._dirty or cap._polling:  # a scan that begins now; else the one under way saw every change
            self._hurry(cap)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(done), timeout)

    def _hurry(self, cap: TmpCap) -> None:
        if cap._scan is not None:
            cap._scan.cancel()
            cap._scan = None
        cap._urgent = True
        self._waiting.pop(cap, None)
        self._waiting = {cap: None, **self._waiting}
        if self._turn is not None:
            self._turn.cancel()
            self._turn = None
        self._next_turn()

    def _start(self, cap: TmpCap) -> None:
        self._scanning = cap
        cap._dirty = cap._urgent = False
        started = time.monotonic()
        walk = self._loop.run_in_executor(self._thread, self._walk, cap)
        walk.add_done_callback(lambda done: self._scanned(cap, started, done))

    def count_held(self, cap: TmpCap, pid: int, gid: int) -> None:
        """From now on the files pid holds whose last name went count too (the run is confined and dumpable
        to its uid). Call from the event loop, while pid is the run's live, unreaped child."""
        cap.started = unnamed.start_time(pid)
        cap.pid, cap.gid = pid, gid
        cap.real = os.path.realpath(cap.path)  # a data directory reached through a link is named without it

    def _walk(self, cap: TmpCap) -> Usage:
        """In the scan thread (and, for a run's first scan, in watch())."""
        found = usage(cap.path, cap.uid, cap.max_files, lambda fd, key: self._add_watch(cap, fd, key))
        if cap.started and not found.over_files:
            with unnamed.as_fs_user(cap.uid, cap.gid):
                found.unnamed = unnamed.held_bytes(cap.pid, cap.started, cap.real, cap.uid, cap.max_bytes)
            found.bytes += found.unnamed
        return found

    def _scanned(self, cap: TmpCap, started: float, walk: asyncio.Future) -> None:
        elapsed = time.monotonic() - started
        self._scanning = None
        self._free_at = started + elapsed / SCAN_SHARE
        cap._last_scan = started + elapsed
        cap._interval = max(MIN_INTERVAL, 2 * elapsed)
        failure = walk.exception()
        self._next_turn()
        if cap.ended:  # unwatched meanwhile: what the walk watched goes too
            self._drop_watches(cap)
            return
        if isinstance(failure, FileNotFoundError):
            return  # the directory is being removed
        if failure is not None:  # an unchecked /tmp is an uncapped one: the run ends (an unlistable directory too)
            self._end(cap, f"error: /tmp could not be checked: {getattr(failure, 'strerror', None) or failure}")
            return
        cap.usage = walk.result()
        self._judge(cap)
        if cap._settled and not cap.ended:
            if cap._dirty:  # changed during this scan: settle() waits for the next one, ahead of the rest
                self._hurry(cap)
            else:
                _release_settled(cap)
        if cap._polling and not cap.ended:
            self._schedule_poll(cap)

    def _judge(self, cap: TmpCap) -> None:
        """End the run if its last scan found it over a cap."""
        if cap.usage.over_files:
            self._end(cap, f"error: /tmp file limit exceeded ({cap.max_files} files)")
        elif cap.usage.bytes > cap.max_bytes:
            self._end(cap, f"error: /tmp size limit exceeded ({_size(cap.max_bytes)})")

    def _next_turn(self) -> None:
        """Start the first waiting scan once no scan is under way and the share allows it."""
        if self._scanning is not None or self._turn is not None:
            return
        while self._waiting:
            cap = next(iter(self._waiting))
            delay = 0.0 if cap._urgent else self._free_at - time.monotonic()
            if delay > 0:
                self._turn = self._loop.call_later(delay, self._take_turn)
                return
            del self._waiting[cap]
            if not cap.ended:
                self._start(cap)
                return

    def _take_turn(self) -> None:
        self._turn = None
        self._next_turn()

    def _schedule_poll(self, cap: TmpCap) -> None:
        if cap._scan is None:
            cap._scan = self._loop.call_later(max(POLL_INTERVAL, cap._interval), self._scan_now, cap)

    def _add_watch(self, cap: TmpCap, fd: int, key: tuple) -> None:
        """In the scan thread (and for the top directory, in watch())."""
        with self._watch_lock:  # unwatch() cannot drop the cap's watches between the check and the record
            if key in cap._watches or cap._polling or cap.ended or self._inotify is None:
                return
            try:
                # through the descriptor the scan opened: exactly that directory, whatever its name leads to now
                wd = self._inotify.add_watch(f"/proc/self/fd/{fd}", WATCHED)
            except OSError as exc:
                if exc.errno not in (errno.ENOSPC, errno.ENOMEM):
                    raise
                log.warning("no inotify watch for %s (%s): it is scanned on a timer", cap.path, exc)
                cap._polling = True
                return
            cap._watches[key] = wd
            self._by_watch[wd] = cap

    def _watch_disk(self, cap: TmpCap) -> None:
        """While the run may hold hidden files: the free space now, and every DISK_EVERY seconds."""
        if cap._disk is not None or cap.ended:
            return
        self._check_disk(cap)
        if not cap.ended:
            cap._disk = self._loop.call_later(DISK_EVERY, self._check_again, cap)

    def _check_again(self, cap: TmpCap) -> None:
        cap._disk = None
        self._watch_disk(cap)
        # Writes through a mapping raise no event, nor does a file filled in a directory removed since: a run
        # that has changed its directory is scanned again every RESCAN_EVERY while it lives, whatever it says.
        if not cap.ended and time.monotonic() - cap._last_scan >= RESCAN_EVERY:
            cap._dirty = True
            self._schedule(cap)

    def _check_disk(self, cap: TmpCap) -> None:
        try:
            free = os.statvfs(cap.path)
        except OSError:
            return
        if free.f_bavail * free.f_frsize < self.disk_floor:
            self._end(cap, "error: /tmp size limit exceeded (the disk is nearly full)")

    def _end(self, cap: TmpCap, reason: str) -> None:
        if cap.ended:
            return
        cap.ended = reason
        self._waiting.pop(cap, None)
        _release_settled(cap)
        if cap._scan is not None:
            cap._scan.cancel()
            cap._scan = None
        if cap._disk is not None:
            cap._disk.cancel()
            cap._disk = None
        try:
            cap.over(reason)
        except Exception:  # noqa: BLE001 - the watcher serves every run; one callback's failure stays its own
            log.exception("ending the run over its /tmp caps failed")


def _release_settled(cap: TmpCap) -> None:
    """settle()'s waiters: the scan they waited for is done, or the run needs none any more."""
    for done in cap._settled:
        if not done.done():
            done.set_result(None)
    cap._settled.clear()


def _size(value: int) -> str:
    return f"{value // MIB} MiB" if value % MIB == 0 else f"{value} bytes"


class RunDirectories:
    """Each run's /tmp where it is a directory of its zygote's tree (the chroot mode): the /tmp of the run
    uid's cell, `<tree>/cells/<uid>/tmp`, 0700 and the uid's (jail/trees/tree_store.py), capped while its child
    lives, removed once nothing of the uid is left. The child, chrooted into its cell, sees it as /tmp (its
    HOME, TMPDIR and working directory)."""

    def __init__(self, watcher: TmpWatcher, max_bytes: int, max_files: int, counts_held: bool = True):
        self.watcher = watcher
        self.counts_held = counts_held  # runs are dumpable to their uid (Confinement.watched): tmp/held.py reads them
        self.max_bytes = max_bytes
        self.max_files = max_files
        self._caps: dict[int, TmpCap] = {}  # child pid -> its directory's cap
        self._held: dict[str, int] = {}  # directory -> a descriptor holding a shared flock on it (ours, in use)

    def make(self, tree_root: str, uid: int) -> tuple[str, str]:
        """A fresh directory for uid's next run: (the service's path to it, the run's). This instance holds a
        lock on it until remove(): what no live instance holds is a dead one's, for anyone to remove
        (tree_store.clear_stale_run_tmps). The uid's first run on a tree makes its cell (a few tens of ms: call it
        off the event loop)."""
        for _ in range(3):
            path = tree_store.make_run_tmp(tree_root, uid)
            try:
                self._held[path] = dirlock.lock_shared(path)
                return path, "/tmp"
            except FileNotFoundError:  # another instance took it for a dead one's before it was locked
                continue
        raise OSError(f"could not make a /tmp directory for uid {uid} in {tree_root}")

    def needs_cell(self, tree_root: str, uid: int) -> bool:
        """Whether make() would make uid's cell first (tree_store.make_cells)."""
        return not os.path.isdir(tree_root + tree_files.cell(uid))

    def watch(self, child) -> None:
        """Cap the child's directory until remove(); over a cap the child is killed, its run ending with the
        watcher's error line."""

        def over(reason: str) -> None:
            child.ended_by = reason
            if child.pidfd >= 0:  # -1 once the child is reaped and closed: its number may be another's now
                with contextlib.suppress(ProcessLookupError, OSError):
                    signal.pidfd_send_signal(child.pidfd, signal.SIGKILL)

        cap = self.watcher.watch(child.tmpdir, child.uid, self.max_bytes, self.max_files, over)
        self._caps[child.pid] = cap
        child.settle = lambda: self.watcher.settle(cap)  # execution.execute: before the run's result is given

    def confined(self, child) -> None:
        """The child is confined (and, where counts_held, dumpable to its uid): what it holds open or mapped
        after the names went counts from now on."""
        cap = self._caps.get(child.pid)
        if cap is not None and self.counts_held:
            gid = child.uid if child.uid != os.geteuid() else os.getegid()  # own uids' gid is the uid (confine.py)
            try:
                self.watcher.count_held(cap, child.pid, gid)
            except OSError as exc:  # gone already: its end is reported as it ended
                log.debug("no held files counted for %s: %s", child.pid, exc)

    async def remove(self, child) -> None:
        """The child is dead and its uid swept: stop watching, remove the directory (off the event loop:
        a run may leave thousands of directories). The lock is held until it is gone: another instance
        clearing dead ones' directories (tree_store.clear_stale_run_tmps) would otherwise take it for one and
        walk it at the same time, each failing on what the other removed."""
        cap = self._caps.pop(child.pid, None)
        if cap is not None:
            self.watcher.unwatch(cap)
        path = child.tmpdir
        child.tmpdir = ""
        if path:
            try:
                await asyncio.to_thread(_remove_quietly, path)
            finally:
                self._unlock(path)

    def discard(self, path: str) -> None:
        """A directory whose child never came to be."""
        try:
            _remove_quietly(path)
        finally:
            self._unlock(path)

    def _unlock(self, path: str) -> None:
        fd = self._held.pop(path, -1)
        if fd >= 0:
            os.close(fd)


def _remove_quietly(path: str) -> None:
    try:
        if os.path.lexists(path):
            tree_store.remove_tree(path)
    except OSError as exc:
        log.warning("could not remove a run's /tmp %s: %s", path, exc)
