"""The zygotes of a runtime, and the confined children they make: what both schedules take runs from.

A child serves exactly one run. `spawn` asks the current zygote for one and
waits until it is confined; `release` gives back what a dead child held (its uid
and its /tmp directory, and where runs are ended by a sweep of their uid, only
once nothing of that uid is left). Where a run's /tmp is a directory of its
zygote's tree (the chroot mode), `run_dirs` makes it, caps it while the child
lives, and removes it (tmpcap.RunDirectories). After `max_forks` forks, or `max_age`
seconds, a new zygote is started (fresh address-space layout and hash seed) and
the old one leaves once its last child has ended: in the background as soon as
it is worn out (`rotate_in_background`, the server), or when the owner says so
(`replace_zygote`, the serial schedule, between runs).

A runtime may keep more than one kind of zygote, each rotated, restarted and
replaced on its own: a child's variant names its kind (`KIND`), and a variant
that names none is the main zygote's. The first kind listed is started first
and serves every kind of run until the others are up (the runtime's `variant`
decides: python/runtime.py keeps a lean zygote beside the preloaded one).

Which children are kept ready, and when a run may answer, is a schedule's
business (schedule.py, serial.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field

from runtimes.jail.service import sweep
from runtimes.jail.service.execution import kill
from runtimes.jail.service.supervisor import Child, ZygoteHandle
from runtimes.jail.service.thread_cap import ThreadCap
from runtimes.jail.service.uids import UidPool, UidPoolExhausted
from runtimes.jail.tmp.caps import RunDirectories
from runtimes.linux import removal
from runtimes.payload import Unavailable

log = logging.getLogger("sandlot.jail")

READY_TIMEOUT = 30.0

Variant = tuple  # ((name, value), ...): hashable, and dict() of it (less KIND) is what the runner gets
KIND = "zygote"  # a variant's name for the kind of zygote that forks it
SPAWN_ATTEMPTS = 3  # a spawn whose zygote was replaced meanwhile tries the current one (a rotation's race)
MAIN = ""  # the kind of a variant that names none


def kind_of(variant: Variant) -> str:
    for name, value in variant:
        if name == KIND:
            return value
    return MAIN


@dataclass
class _Line:
    """One kind of zygote: the one serving now, since when, and whether its replacement is under way."""

    zygote: ZygoteHandle | None = None
    report: dict = field(default_factory=dict)  # what the last one to take over said when it was ready
    born: float = 0.0  # time.monotonic() when it took over
    rotating: bool = False
    error: str = ""  # why the last start failed ("" once one has started)
    parked: bool = False  # stopped on purpose while idle (park), started again when asked for (unpark)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # held while a zygote of this kind is started


class ChildPool:
    def __init__(
        self,
        start_zygote: Callable[[str], Awaitable[ZygoteHandle]],  # a new zygote of the kind given
        uids: UidPool | None,
        tmp_parent: str | None,
        max_forks: int,
        max_age: float = 0.0,  # seconds a zygote serves before it is replaced (0: no limit)
        sweep_uids: bool = False,  # a run's processes are ended by a sweep of its uid before the uid goes back
        rotate_in_background: bool = True,
        run_dirs: RunDirectories | None = None,  # each run's /tmp, a directory in its zygote's tree (chroot)
        thread_cap: ThreadCap | None = None,  # each run's threads counted by the service (landlock: thread_cap.py)
        kinds: tuple[str, ...] = (MAIN,),  # the kinds of zygote kept, the first started first
    ):
        self._start_zygote = start_zygote
        self._uids = uids
        self._tmp_parent = tmp_parent
        self._max_forks = max_forks
        self._max_age = max_age
        self._sweep_uids = sweep_uids
        self._rotate_in_background = rotate_in_background
        self._run_dirs = run_dirs
        self._thread_cap = thread_cap
        self._lines = {kind: _Line() for kind in kinds}
        self._first = kinds[0]
        self.kinds = tuple(kinds)
        self._owner: dict[int, ZygoteHandle] = {}  # child pid -> the zygote that forked it
        self._retired: list[ZygoteHandle] = []
        self._tasks: set[asyncio.Task] = set()  # zygote restarts and rotations
        self._releases: set[asyncio.Task] = set()  # children being given back once dead
        self._stopping = False
        self.on_retired: list[Callable[[ZygoteHandle], None]] = []  # each retired zygote, once it has exited
        self.on_replaced: list[Callable[[ZygoteHandle], None]] = []  # the zygote that is no longer current
        self.on_running: list[Callable[[], None]] = []  # a zygote is running again after none was
        self.on_idle: list[Callable[[], None]] = []  # a schedule let its surplus ready children go (no runs for long)
        self.generation = 0
        self.last_error = ""
        # ready means a run can be served (runtime.ready): children fully confined so far, and the failures
        # since the last one (a platform refusing a step the probes missed fails every child)
        self.confined = 0
        self.failed_in_a_row = 0
        self.spawn_error = ""

    async def start(self) -> dict:
        """Start the first kind's zygote (the others in the background); if it cannot start, keep trying."""
        try:
            await self._restart(self._first)
        except Unavailable:
            self.background(self._recover(self._first))
            raise
        finally:
            for kind in self._lines:
                if kind != self._first:
                    self.background(self._recover(kind))
        return self.report

    @property
    def running(self) -> bool:
        """The first kind's zygote is serving (it can serve any run)."""
        return self.kind_running(self._first)

    def kind_running(self, kind: str) -> bool:
        line = self._lines.get(kind)
        return line is not None and line.zygote is not None and line.zygote.alive

    @property
    def report(self) -> dict:
        """What the main zygote said when it was ready (the first kind's until a main one has been up)."""
        line = self._lines.get(MAIN)
        return line.report if line is not None and line.report else self._lines[self._first].report

    def report_of(self, kind: str) -> dict:
        line = self._lines.get(kind)
        return line.report if line is not None else {}

    def parked(self, kind: str) -> bool:
        line = self._lines.get(kind)
        return line is not None and line.parked

    def park(self, kind: str) -> None:
        """Stop that kind's zygote while the runtime is idle (never the first kind, which serves every run
        meanwhile): its memory goes back; `unpark` starts a new one."""
        line = self._lines.get(kind)
        if kind == self._first or line is None or line.parked or line.rotating or line.lock.locked():
            return
        if line.zygote is None or not line.zygote.alive:
            return
        line.parked = True
        old, line.zygote = line.zygote, None
        log.info("the %s zygote is parked while idle; the next run that needs it starts it again", kind or "main")
        self._retired.append(old)
        for callback in self.on_replaced:
            callback(old)  # its ready children go: the retired zygote stops once the last has ended
        self.background(self._stop_retired())

    def unpark(self, kind: str) -> None:
        line = self._lines.get(kind)
        if line is not None and line.parked and not self._stopping:
            line.parked = False
            self.background(self._recover(kind))

    def error_of(self, kind: str) -> str:
        """Why a zygote of that kind last failed to start, "" once one has."""
        line = self._lines.get(kind)
        return line.error if line is not None else ""

    def owner(self, child: Child) -> ZygoteHandle | None:
        return self._owner.get(child.pid)

    def current(self, child: Child) -> bool:
        """Whether child was made by a zygote now serving."""
        owner = self._owner.get(child.pid)
        return owner is not None and owner.alive and any(line.zygote is owner for line in self._lines.values())

    async def spawn(self, variant: Variant = ()) -> Child:
        """A new child, confined and waiting for its run."""
        kind = kind_of(variant)
        for attempt in range(SPAWN_ATTEMPTS):
            zygote = await self._current_zygote(kind)
            try:
                child, tmpdir = await self._fork(zygote, variant)
                break
            except Unavailable:
                # replaced while its child's /tmp was made (a rotation stops the old zygote once it has no child,
                # and this one had none yet): not a failure, the current one forks it
                if attempt + 1 < SPAWN_ATTEMPTS and not zygote.alive and self._lines[kind].zygote is not zygote:
                    continue
                raise
        child.tmpdir = tmpdir
        if self._run_dirs is not None:
            self._run_dirs.watch(child)
        self._owner[child.pid] = zygote
        if not await _confined(child):
            reason = _read_available(child.stderr).decode(errors="replace").strip()
            self.discard(child)
            self._spawn_failed(f"could not confine a run: {reason or 'the child exited'}")
            raise Unavailable(f"could not confine a run: {reason or 'the child exited'}")
        if self._run_dirs is not None:
            self._run_dirs.confined(child)
        if self._thread_cap is not None:
            child.on_run = lambda: self._thread_cap.watch(child)  # counted while its run lives (no user code before)
        self.confined += 1
        self.failed_in_a_row, self.spawn_error = 0, ""
        return child

    async def _fork(self, zygote: ZygoteHandle, variant: Variant) -> tuple[Child, str]:
        """A child of that zygote, with its uid and its /tmp (the service's path); what it took goes back if none."""
        try:
            uid = self._uids.acquire() if self._uids is not None else os.getuid()
        except UidPoolExhausted as exc:
            raise Unavailable(str(exc)) from exc
        try:
            if self._run_dirs is not None and self._run_dirs.needs_cell(zygote.tree_root, uid):
                # a uid's first run on a tree makes its cell (tens of ms): off the loop
                tmpdir, inside = await asyncio.to_thread(self._run_dirs.make, zygote.tree_root, uid)
            elif self._run_dirs is not None:
                tmpdir, inside = self._run_dirs.make(zygote.tree_root, uid)  # the service's path, the run's
            else:
                tmpdir = inside = tempfile.mkdtemp(prefix="run-", dir=self._tmp_parent) if self._tmp_parent else ""
        except BaseException as exc:  # no directory for it (a full disk, a cell that cannot be made): the uid goes back
            self._give_back(uid, "")
            if isinstance(exc, Exception):
                self._spawn_failed(f"could not make a run's /tmp: {exc}")
            raise
        try:
            return await zygote.fork(uid, inside, {k: v for k, v in variant if k != KIND}), tmpdir
        except BaseException as exc:
            self._give_back(uid, tmpdir)
            if isinstance(exc, Exception):
                self._spawn_failed(str(exc))
            raise

    def _spawn_failed(self, why: str) -> None:
        self.failed_in_a_row += 1
        self.spawn_error = why

    def discard(self, child: Child) -> None:
        """The run is over or abandoned: kill the child; what it held goes back once it is dead."""
        kill(child)
        task = asyncio.get_running_loop().create_task(self.release(child))
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    async def release(self, child: Child) -> None:
        """Once the child is dead (the zygote has reaped it): its uid and /tmp go back. Idempotent."""
        await child.exited
        if child.pid not in self._owner:
            return  # released already
        owner = self._owner.pop(child.pid)
        if self._thread_cap is not None:
            self._thread_cap.unwatch(child)  # before its pidfd closes: its pid may be another's from then on
            child.on_run = None  # the closure refers to the child: no cycle left for the collector
        child.close()
        if self._sweep_uids and self._uids is not None:
            await sweep.sweep(child.uid)  # nothing of the run's uid may outlive its turn with it
        if self._run_dirs is not None:
            await self._run_dirs.remove(child)  # nothing of the uid is left to write in it meanwhile
        self._give_back(child.uid, child.tmpdir)
        if owner in self._retired:
            await self._stop_retired()

    def background(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- zygotes ---------------------------------------------------------------

    async def _current_zygote(self, kind: str) -> ZygoteHandle:
        line = self._lines[kind]
        if line.zygote is None or not line.zygote.alive:
            await self._restart(kind)
        assert line.zygote is not None
        if self._rotate_in_background and self._worn_out(line) and not line.rotating:
            line.rotating = True
            self.background(self._rotate(kind))
        return line.zygote

    @property
    def due_for_replacement(self) -> bool:
        """A zygote has made its share of children or lived its time."""
        lines = self._lines.values()
        return any(line.zygote is not None and line.zygote.alive and self._worn_out(line) for line in lines)

    def _worn_out(self, line: _Line) -> bool:
        """Forks and age both bound how long runs share the zygote's layout and hash secret."""
        aged = self._max_age > 0 and time.monotonic() - line.born >= self._max_age
        return line.zygote.forks >= self._max_forks or aged

    async def _restart(self, kind: str) -> None:
        line = self._lines[kind]
        async with line.lock:  # one start of a kind at a time (a replacement's too)
            if line.zygote is not None and line.zygote.alive:
                return
            dead, line.zygote = line.zygote, None
            if dead is not None:
                await dead.stop()
                self._retire(dead)
            self._take_over(line, await self._new_zygote(kind))
        for callback in self.on_running:
            callback()

    async def _new_zygote(self, kind: str) -> ZygoteHandle:
        """A started zygote, watched for an unexpected exit, counted as a new generation."""
        line = self._lines[kind]
        try:
            zygote = await self._start_zygote(kind)
        except Unavailable as exc:
            self.last_error = line.error = str(exc)
            raise
        zygote.on_exit.append(self._on_zygote_exit)
        self.generation += 1
        line.error = ""
        self.last_error = next((other.error for other in self._lines.values() if other.error), "")
        return zygote

    @staticmethod
    def _take_over(line: _Line, zygote: ZygoteHandle) -> ZygoteHandle | None:
        """zygote serves its kind from now on; returns the one it replaces."""
        old, line.zygote, line.report, line.born = line.zygote, zygote, zygote.report, time.monotonic()
        line.parked = False  # a replacement (a layer switch) starts a parked kind again
        return old

    def _on_zygote_exit(self, zygote: ZygoteHandle) -> None:
        for callback in self.on_replaced:
            callback(zygote)  # its children are dead with it (or dying): none may be handed out
        for kind, line in self._lines.items():
            if zygote is line.zygote and not self._stopping:
                log.warning("the zygote exited; starting a new one")
                self.background(self._recover(kind))

    async def _recover(self, kind: str) -> None:
        delay = 0.1
        while not self._stopping:
            try:
                await self._restart(kind)
            except Unavailable as exc:
                log.warning("could not restart the zygote: %s", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
                continue
            return

    async def _rotate(self, kind: str) -> None:
        try:
            await self.replace_zygote((kind,))
        except Unavailable as exc:
            log.warning("could not replace the zygote: %s", exc)
        finally:
            self._lines[kind].rotating = False

    async def replace_zygote(self, kinds: tuple[str, ...] = ()) -> dict:
        """Start new zygotes (from what the factory now says) and retire the current ones: of the kinds
        given, or of every kind. Either all of them take over or, if one cannot start, none does."""
        chosen = [kind for kind in self._lines if not kinds or kind in kinds]  # always in the pool's order
        fresh: dict[str, ZygoteHandle] = {}
        async with AsyncExitStack() as held:
            for kind in chosen:  # a restart of a kind waits, and finds the new one
                await held.enter_async_context(self._lines[kind].lock)
            try:
                for kind in chosen:
                    fresh[kind] = await self._new_zygote(kind)
            except BaseException:
                for zygote in fresh.values():
                    await zygote.stop()
                    self._retire(zygote)
                raise
            for kind, zygote in fresh.items():
                old = self._take_over(self._lines[kind], zygote)
                if old is not None:
                    self._retired.append(old)
                    for callback in self.on_replaced:
                        callback(old)  # its ready children are not worth keeping the old zygote alive for
        await self._stop_retired()
        for callback in self.on_running:
            callback()
        return self.report

    @property
    def retiring(self) -> int:
        """Zygotes replaced that have not exited yet (their last children still live)."""
        return len(self._retired)

    def uses_tag(self, tag: str) -> bool:
        return any(z.tag == tag for z in [*self._current(), *self._retired])

    def _current(self) -> list[ZygoteHandle]:
        return [line.zygote for line in self._lines.values() if line.zygote is not None]

    async def _stop_retired(self) -> None:
        for zygote in [z for z in self._retired if z.live_children == 0]:
            if zygote not in self._retired:
                continue  # another release stopped it while this one awaited
            self._retired.remove(zygote)
            await zygote.stop()
            self._retire(zygote)

    def _retire(self, zygote: ZygoteHandle) -> None:
        for callback in self.on_retired:
            callback(zygote)

    def _give_back(self, uid: int, tmpdir: str) -> None:
        if tmpdir and self._run_dirs is not None:
            self._run_dirs.discard(tmpdir)  # removed already, unless the child never came to be
        elif tmpdir:
            removal.remove_quietly(tmpdir)  # never follows a planted link; restores modes a run took away
        if self._uids is not None:
            self._uids.release(uid)

    async def stop(self) -> None:
        self._stopping = True
        for task in list(self._tasks):
            task.cancel()
        zygotes = [*self._current(), *self._retired]
        for line in self._lines.values():
            line.zygote = None
        self._retired = []
        for zygote in zygotes:
            await zygote.stop()  # its children are dead once it has exited: their releases end
        pending = [*self._tasks, *self._releases]
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    def status(self) -> dict:
        return {
            "zygote": "running" if self.running else "down",
            "zygotes": sum(zygote.alive for zygote in self._current()),  # of every kind, retiring ones not counted
            "zygote_generation": self.generation,
            "zygote_forks": sum(zygote.forks for zygote in self._current()),
            "uids_in_use": self._uids.in_use if self._uids is not None else None,
            "uid_range": [self._uids.first, self._uids.first + self._uids.size - 1] if self._uids else None,
            "last_error": self.last_error,
            "parked": [kind or "main" for kind, line in self._lines.items() if line.parked],
        }


async def _confined(child: Child) -> bool:
    """Wait for the child's one byte that says it is confined; EOF means it failed."""
    loop = asyncio.get_running_loop()
    answer: asyncio.Future = loop.create_future()

    def on_ready() -> None:
        try:
            data = os.read(child.ready, 1)
        except OSError:
            data = b""
        if not answer.done():
            answer.set_result(data == b"1")

    loop.add_reader(child.ready, on_ready)
    try:
        return await asyncio.wait_for(answer, READY_TIMEOUT)
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(child.ready)  # the pipe stays open: a runner may report its exit on it


def _read_available(fd: int) -> bytes:
    os.set_blocking(fd, False)
    try:
        return os.read(fd, 65536)
    except OSError:
        return b""
