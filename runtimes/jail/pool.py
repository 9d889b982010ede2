"""Children forked and confined ahead of demand, from a zygote that is replaced now and then.

A child serves exactly one run. Children come in variants (what a runner must
know before the run arrives, e.g. Node's network filter): each variant has its
own number of children kept ready; others are forked on demand. A child's uid
and private /tmp go back only once the zygote has reaped it. After `max_forks`
forks, or `max_age` seconds, a new zygote is started (fresh address-space layout
and hash seed) and the old one leaves once its last child has ended.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
import time
from collections import deque
from collections.abc import Awaitable, Callable

from runtimes.jail.execution import kill
from runtimes.jail.supervisor import Child, SandboxUnavailable, Zygote
from runtimes.jail.uids import UidPool, UidPoolExhausted

log = logging.getLogger("sandlot.jail")

READY_TIMEOUT = 30.0

Variant = tuple  # ((name, value), ...): hashable, and dict() of it is what the runner gets


class ChildPool:
    def __init__(
        self,
        start_zygote: Callable[[], Awaitable[Zygote]],
        uids: UidPool | None,
        tmp_parent: str | None,
        targets: dict[Variant, int],
        max_forks: int,
        max_age: float = 0.0,  # seconds a zygote serves before it is replaced (0: no limit)
    ):
        self._start_zygote = start_zygote
        self._uids = uids
        self._tmp_parent = tmp_parent
        self.targets = targets
        self._max_forks = max_forks
        self._max_age = max_age
        self._zygote_born = 0.0  # time.monotonic() when the current zygote took over
        self._zygote: Zygote | None = None
        self._owner: dict[int, Zygote] = {}  # child pid -> the zygote that forked it
        self._retired: list[Zygote] = []
        self._ready: dict[Variant, deque[Child]] = {v: deque() for v in targets}
        self._filling: dict[Variant, int] = dict.fromkeys(targets, 0)
        self._tasks: set[asyncio.Task] = set()
        self._restart_lock = asyncio.Lock()
        self._rotating = False
        self._stopping = False
        self.on_retired: list = []  # called with each retired zygote once it has exited
        self.generation = 0
        self.last_error = ""

    async def start(self) -> dict:
        """Start the first zygote; if it cannot start, keep trying in the background."""
        try:
            await self._restart()
        except SandboxUnavailable:
            self._background(self._recover())
            raise
        self._refill()
        return self._zygote.report if self._zygote else {}

    @property
    def running(self) -> bool:
        return self._zygote is not None and self._zygote.alive

    async def take(self, variant: Variant = ()) -> Child:
        """A confined child for one run: a ready one if any, else a new one."""
        ready = self._ready.get(variant)
        while ready:
            child = ready.popleft()
            if not child.exited.done():
                return child
            self.finish(child)
        return await self._spawn(variant)

    def finish(self, child: Child) -> None:
        """The run is over (or abandoned): give back what the child held once it is dead."""
        if not child.exited.done():
            kill(child)
        self._background(self._release(child))
        self._refill()  # after the run, so that the zygote's forks do not compete with it

    # ---- internals -----------------------------------------------------------

    def _background(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _refill(self) -> None:
        for variant, target in self.targets.items():
            while len(self._ready[variant]) + self._filling[variant] < target:
                self._filling[variant] += 1
                self._background(self._fill_one(variant))

    async def _fill_one(self, variant: Variant) -> None:
        try:
            child = await self._spawn(variant)
        except Exception as exc:  # noqa: BLE001 - seen by health and by the next take()
            self.last_error = str(exc)
            log.warning("could not prepare a child: %s", exc)
            return
        finally:
            self._filling[variant] -= 1
        self._ready[variant].append(child)
        child.exited.add_done_callback(lambda _: self._died_ready(variant, child))

    def _died_ready(self, variant: Variant, child: Child) -> None:
        """A ready child ended before any run had it (killed from outside): replace it."""
        if child in self._ready[variant]:
            self._ready[variant].remove(child)
            self.finish(child)

    async def _current_zygote(self) -> Zygote:
        if self._zygote is None or not self._zygote.alive:
            await self._restart()
        assert self._zygote is not None
        if self._zygote_worn_out() and not self._rotating:
            self._rotating = True
            self._background(self._rotate())
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

    async def _new_zygote(self) -> Zygote:
        """A started zygote, watched for an unexpected exit, counted as a new generation."""
        try:
            zygote = await self._start_zygote()
        except SandboxUnavailable as exc:
            self.last_error = str(exc)
            raise
        zygote.on_exit.append(self._on_zygote_exit)
        self._zygote_born = time.monotonic()
        self.generation += 1
        self.last_error = ""
        return zygote

    def _on_zygote_exit(self, zygote: Zygote) -> None:
        self._drop_ready_of(zygote)  # dead with it (or dying): neither counted as ready nor handed out
        if zygote is self._zygote and not self._stopping:
            log.warning("the zygote exited; starting a new one")
            self._background(self._recover())

    async def _recover(self) -> None:
        delay = 0.1
        while not self._stopping:
            try:
                await self._restart()
            except SandboxUnavailable as exc:
                log.warning("could not restart the zygote: %s", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
                continue
            self._refill()
            return

    async def _rotate(self) -> None:
        try:
            await self.replace_zygote()
        except SandboxUnavailable as exc:
            log.warning("could not replace the zygote: %s", exc)
        finally:
            self._rotating = False

    async def replace_zygote(self) -> dict:
        """Start a new zygote (from what the factory now says) and retire the current one."""
        fresh = await self._new_zygote()
        old, self._zygote = self._zygote, fresh
        if old is not None:
            self._retired.append(old)
            self._drop_ready_of(old)  # not worth keeping the old zygote alive for
            await self._stop_retired()
        self._refill()
        return fresh.report

    def _drop_ready_of(self, zygote: Zygote) -> None:
        for ready in self._ready.values():
            for child in [c for c in ready if self._owner.get(c.pid) is zygote]:
                ready.remove(child)
                self.finish(child)

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

    async def _spawn(self, variant: Variant) -> Child:
        zygote = await self._current_zygote()
        try:
            uid = self._uids.acquire() if self._uids is not None else os.getuid()
        except UidPoolExhausted as exc:
            raise SandboxUnavailable(str(exc)) from exc
        tmpdir = tempfile.mkdtemp(prefix="run-", dir=self._tmp_parent) if self._tmp_parent else ""
        try:
            child = await zygote.fork(uid, tmpdir, dict(variant))
        except BaseException:
            self._give_back(uid, tmpdir)
            raise
        self._owner[child.pid] = zygote
        if not await _confined(child):
            reason = _read_available(child.stderr).decode(errors="replace").strip()
            self.finish(child)
            raise SandboxUnavailable(f"could not confine a run: {reason or 'the child exited'}")
        return child

    async def _release(self, child: Child) -> None:
        await child.exited
        child.close()
        self._give_back(child.uid, child.tmpdir)
        owner = self._owner.pop(child.pid, None)
        if owner in self._retired:
            await self._stop_retired()

    def _give_back(self, uid: int, tmpdir: str) -> None:
        if self._uids is not None:
            self._uids.release(uid)
        if tmpdir:
            shutil.rmtree(tmpdir, ignore_errors=True)  # fd-based: never follows a planted link

    async def stop(self) -> None:
        self._stopping = True
        for task in list(self._tasks):
            task.cancel()
        for ready in self._ready.values():
            while ready:
                child = ready.popleft()
                kill(child)
                self.finish(child)
        zygotes = [z for z in [self._zygote, *self._retired] if z is not None]
        self._zygote, self._retired = None, []
        for zygote in zygotes:
            await zygote.stop()  # its children are dead once it has exited
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def status(self) -> dict:
        return {
            "zygote": "running" if self.running else "down",
            "zygote_generation": self.generation,
            "zygote_forks": self._zygote.forks if self._zygote else 0,
            "ready_children": sum(len(r) for r in self._ready.values()),
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
