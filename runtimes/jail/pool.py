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

Which children are kept ready, and when a run may answer, is a schedule's
business (schedule.py, serial.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable

from runtimes.jail import sweep
from runtimes.jail.execution import kill
from runtimes.jail.supervisor import Child, Zygote
from runtimes.jail.tmpcap import RunDirectories
from runtimes.jail.uids import UidPool, UidPoolExhausted
from runtimes.payload import Unavailable

log = logging.getLogger("sandlot.jail")

READY_TIMEOUT = 30.0

Variant = tuple  # ((name, value), ...): hashable, and dict() of it is what the runner gets


class ChildPool:
    def __init__(
        self,
        start_zygote: Callable[[], Awaitable[Zygote]],
        uids: UidPool | None,
        tmp_parent: str | None,
        max_forks: int,
        max_age: float = 0.0,  # seconds a zygote serves before it is replaced (0: no limit)
        sweep_uids: bool = False,  # a run's processes are ended by a sweep of its uid before the uid goes back
        rotate_in_background: bool = True,
        run_dirs: RunDirectories | None = None,  # each run's /tmp, a directory in its zygote's tree (chroot)
    ):
        self._start_zygote = start_zygote
        self._uids = uids
        self._tmp_parent = tmp_parent
        self._max_forks = max_forks
        self._max_age = max_age
        self._sweep_uids = sweep_uids
        self._rotate_in_background = rotate_in_background
        self._run_dirs = run_dirs
        self._zygote_born = 0.0  # time.monotonic() when the current zygote took over
        self._zygote: Zygote | None = None
        self._owner: dict[int, Zygote] = {}  # child pid -> the zygote that forked it
        self._retired: list[Zygote] = []
        self._tasks: set[asyncio.Task] = set()  # zygote restarts and rotations
        self._releases: set[asyncio.Task] = set()  # children being given back once dead
        self._restart_lock = asyncio.Lock()
        self._rotating = False
        self._stopping = False
        self.on_retired: list[Callable[[Zygote], None]] = []  # each retired zygote, once it has exited
        self.on_replaced: list[Callable[[Zygote], None]] = []  # the zygote that is no longer current
        self.on_running: list[Callable[[], None]] = []  # a zygote is running again after none was
        self.generation = 0
        self.last_error = ""

    async def start(self) -> dict:
        """Start the first zygote; if it cannot start, keep trying in the background."""
        try:
            await self._restart()
        except Unavailable:
            self.background(self._recover())
            raise
        return self._zygote.report if self._zygote else {}

    @property
    def running(self) -> bool:
        return self._zygote is not None and self._zygote.alive

    @property
    def report(self) -> dict:
        return self._zygote.report if self._zygote else {}

    def owner(self, child: Child) -> Zygote | None:
        return self._owner.get(child.pid)

    def current(self, child: Child) -> bool:
        """Whether child was made by the zygote now serving."""
        return self._owner.get(child.pid) is self._zygote and self.running

    async def spawn(self, variant: Variant = ()) -> Child:
        """A new child, confined and waiting for its run."""
        zygote = await self._current_zygote()
        try:
            uid = self._uids.acquire() if self._uids is not None else os.getuid()
        except UidPoolExhausted as exc:
            raise Unavailable(str(exc)) from exc
        if self._run_dirs is not None:
            tmpdir, inside = self._run_dirs.make(zygote.tree_root, uid)  # the service's path, the run's
        else:
            tmpdir = inside = tempfile.mkdtemp(prefix="run-", dir=self._tmp_parent) if self._tmp_parent else ""
        try:
            child = await zygote.fork(uid, inside, dict(variant))
        except BaseException:
            self._give_back(uid, tmpdir)
            raise
        child.tmpdir = tmpdir
        if self._run_dirs is not None:
            self._run_dirs.watch(child)
        self._owner[child.pid] = zygote
        if not await _confined(child):
            reason = _read_available(child.stderr).decode(errors="replace").strip()
            self.discard(child)
            raise Unavailable(f"could not confine a run: {reason or 'the child exited'}")
        return child

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

    async def _current_zygote(self) -> Zygote:
        if self._zygote is None or not self._zygote.alive:
            await self._restart()
        assert self._zygote is not None
        if self._rotate_in_background and self._zygote_worn_out() and not self._rotating:
            self._rotating = True
            self.background(self._rotate())
        return self._zygote

    @property
    def due_for_replacement(self) -> bool:
        """The current zygote has made its share of children or lived its time."""
        return self._zygote is not None and self._zygote.alive and self._zygote_worn_out()

    def _zygote_worn_out(self) -> bool:
        """Forks and age both bound how long runs share the zygote's layout and hash secret."""
        aged = self._max_age > 0 and time.monotonic() - self._zygote_born >= self._max_age
        return self._zygote.forks >= self._max_forks or aged

    async def _restart(self) -> None:
        async with self._restart_lock:
            if self._zygote is not None and self._zygote.alive:
                return
            dead, self._zygote = self._zygote, None
            if dead is not None:
                await dead.stop()
                self._retire(dead)
            self._zygote = await self._new_zygote()
        for callback in self.on_running:
            callback()

    async def _new_zygote(self) -> Zygote:
        """A started zygote, watched for an unexpected exit, counted as a new generation."""
        try:
            zygote = await self._start_zygote()
        except Unavailable as exc:
            self.last_error = str(exc)
            raise
        zygote.on_exit.append(self._on_zygote_exit)
        self._zygote_born = time.monotonic()
        self.generation += 1
        self.last_error = ""
        return zygote

    def _on_zygote_exit(self, zygote: Zygote) -> None:
        for callback in self.on_replaced:
            callback(zygote)  # its children are dead with it (or dying): none may be handed out
        if zygote is self._zygote and not self._stopping:
            log.warning("the zygote exited; starting a new one")
            self.background(self._recover())

    async def _recover(self) -> None:
        delay = 0.1
        while not self._stopping:
            try:
                await self._restart()
            except Unavailable as exc:
                log.warning("could not restart the zygote: %s", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
                continue
            return

    async def _rotate(self) -> None:
        try:
            await self.replace_zygote()
        except Unavailable as exc:
            log.warning("could not replace the zygote: %s", exc)
        finally:
            self._rotating = False

    async def replace_zygote(self) -> dict:
        """Start a new zygote (from what the factory now says) and retire the current one."""
        fresh = await self._new_zygote()
        old, self._zygote = self._zygote, fresh
        if old is not None:
            self._retired.append(old)
            for callback in self.on_replaced:
                callback(old)  # its ready children are not worth keeping the old zygote alive for
            await self._stop_retired()
        for callback in self.on_running:
            callback()
        return fresh.report

    @property
    def retiring(self) -> int:
        """Zygotes replaced that have not exited yet (their last children still live)."""
        return len(self._retired)

    def uses_tag(self, tag: str) -> bool:
        return any(z.tag == tag for z in [self._zygote, *self._retired] if z is not None)

    async def _stop_retired(self) -> None:
        for zygote in [z for z in self._retired if z.live_children == 0]:
            self._retired.remove(zygote)
            await zygote.stop()
            self._retire(zygote)

    def _retire(self, zygote: Zygote) -> None:
        for callback in self.on_retired:
            callback(zygote)

    def _give_back(self, uid: int, tmpdir: str) -> None:
        if tmpdir and self._run_dirs is not None:
            self._run_dirs.discard(tmpdir)  # removed already, unless the child never came to be
        elif tmpdir:
            shutil.rmtree(tmpdir, ignore_errors=True)  # fd-based: never follows a planted link
        if self._uids is not None:
            self._uids.release(uid)

    async def stop(self) -> None:
        self._stopping = True
        for task in list(self._tasks):
            task.cancel()
        zygotes = [z for z in [self._zygote, *self._retired] if z is not None]
        self._zygote, self._retired = None, []
        for zygote in zygotes:
            await zygote.stop()  # its children are dead once it has exited: their releases end
        pending = [*self._tasks, *self._releases]
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    def status(self) -> dict:
        return {
            "zygote": "running" if self.running else "down",
            "zygote_generation": self.generation,
            "zygote_forks": self._zygote.forks if self._zygote else 0,
            "uids_in_use": self._uids.in_use if self._uids is not None else None,
            "uid_range": [self._uids.first, self._uids.first + self._uids.size - 1] if self._uids else None,
            "last_error": self.last_error,
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
