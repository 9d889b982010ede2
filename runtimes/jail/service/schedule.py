"""When children are made and when a run may answer: the schedule a runtime takes its children from.

JailedRuntime.run is the one run path; a schedule decides the rest:

- `take(variant)`: a confined child for the run (one made ahead, or a new one);
- `finish(child)`: the run is over; returns once the run may answer;
- `between()`: what is left once the answer has gone out, before the next run;
- `stop()`.

`PooledSchedule` is the server's: children kept ready per variant, as many runs
at once as the service admits, each child killed as its run answers and what it
held given back in the background. `SerialSchedule` (serial.py) is a Lambda
function's and `sandlot run --local`'s: one run at a time, nothing of it left
before the next.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Protocol

from runtimes.jail.service.pool import ChildPool, Variant, kind_of
from runtimes.jail.service.supervisor import Child, ZygoteHandle
from runtimes.linux import syscalls

log = logging.getLogger("sandlot.jail")


class Schedule(Protocol):
    async def start(self) -> None: ...

    async def take(self, variant: Variant) -> Child: ...

    def wake(self, variant: Variant) -> None:
        """A run would have used this variant's parked zygote: start it again (the run is served meanwhile by
        another variant: the runtime's choice), and count from now before it is parked again."""
        self._last_run[variant] = time.monotonic()
        self.pool.unpark(kind_of(variant))

    async def finish(self, child: Child) -> None: ...

    async def between(self) -> None: ...

    async def stop(self) -> None: ...

    def status(self) -> dict: ...


IDLE_SECONDS = 20.0  # no run of a variant for this long: its ready children go down to its idle level
DEEPER = 2  # under load a variant keeps up to DEEPER x its target ready: children are made while runs go on


class PooledSchedule:
    """Children forked and confined ahead of demand, per variant (what a runner must know before the run
    arrives, e.g. Node's network filter); other variants are forked on demand.

    How many are kept ready follows the load. A variant starts at its target (a burst right after start is
    served at once); a run that finds none ready raises its level by one, up to DEEPER x the target (under
    load, children are made while runs go on, and a deeper supply lets the runs outpace the making); after
    IDLE_SECONDS without a run the level falls to the variant's idle level and the surplus is killed, so
    that an idle service holds few processes; the next run brings it back to the target.
    """

    def __init__(
        self,
        pool: ChildPool,
        targets: dict[Variant, int],
        idle: dict[Variant, int] | None = None,
        park: dict[Variant, float] | None = None,
    ):
        self.pool = pool
        self.targets = targets
        self.idle = {v: min(n, (idle or {}).get(v, 0)) for v, n in targets.items()}
        # a variant without a run for this long: its zygote is parked (stopped) until a run asks for it (wake)
        self.park = {v: seconds for v, seconds in (park or {}).items() if v in targets}
        self.level = dict(targets)  # how many of each to keep ready now
        self._last_run: dict[Variant, float] = {}
        self._ready: dict[Variant, deque[Child]] = {v: deque() for v in targets}
        self._filling: dict[Variant, int] = dict.fromkeys(targets, 0)
        self._stopping = False
        self._idle_check: asyncio.TimerHandle | None = None
        self.taken_ready = 0  # runs served by a child made ahead
        self.made_on_demand = 0  # runs that found none ready and waited for one to be made
        pool.on_replaced.append(self._drop_ready_of)
        pool.on_running.append(self._refill)

    async def start(self) -> None:
        now = time.monotonic()
        self._last_run = dict.fromkeys(self.targets, now)  # a variant never asked for goes idle too
        self._refill()
        self._watch_idle()

    async def take(self, variant: Variant) -> Child:
        if variant in self.level:
            self._last_run[variant] = time.monotonic()
            self.level[variant] = max(self.level[variant], self.targets[variant])
        ready = self._ready.get(variant)
        while ready:
            child = ready.popleft()
            if not child.exited.done():
                self.taken_ready += 1
                return child
            self.pool.discard(child)
        self.made_on_demand += 1
        if variant in self.level:
            self.level[variant] = min(self.level[variant] + 1, DEEPER * self.targets[variant])
        return await self.pool.spawn(variant)

    def wake(self, variant: Variant) -> None:
        """A run would have used this variant's parked zygote: start it again (the run is served meanwhile by
        another variant: the runtime's choice), and count from now before it is parked again."""
        self._last_run[variant] = time.monotonic()
        self.pool.unpark(kind_of(variant))

    async def finish(self, child: Child) -> None:
        """The run has answered (its exit report, or its end): the child is killed, and given back once dead."""
        self.pool.discard(child)
        self._refill()  # after the run, so that the zygote's forks do not compete with it

    async def between(self) -> None:
        pass  # the server answers and goes on: what a run held goes back in the background

    async def stop(self) -> None:
        self._stopping = True
        if self._idle_check is not None:
            self._idle_check.cancel()
        for ready in self._ready.values():
            while ready:
                self.pool.discard(ready.popleft())

    def status(self) -> dict:
        return {
            "ready_children": sum(len(r) for r in self._ready.values()),
            "ready_level": sum(self.level.values()),  # how many it keeps ready now (follows the load)
            "runs_on_ready_children": self.taken_ready,
            "runs_on_children_made_on_demand": self.made_on_demand,
        }

    # ---- internals -----------------------------------------------------------

    def _watch_idle(self) -> None:
        """Every few seconds: a variant without a run for IDLE_SECONDS goes down to its idle level."""
        if self._stopping:
            return
        now = time.monotonic()
        went_idle = False
        for variant, ready in self._ready.items():
            if now - self._last_run.get(variant, now) >= IDLE_SECONDS and self.level[variant] > self.idle[variant]:
                self.level[variant] = self.idle[variant]
                went_idle = True
                while len(ready) > self.level[variant]:
                    self.pool.discard(ready.popleft())
        for variant, seconds in self.park.items():
            kind = kind_of(variant)
            if now - self._last_run.get(variant, now) >= seconds and self.pool.kind_running(kind):
                self.pool.park(kind)
                went_idle = True
        if went_idle:  # the service's own heap too: what the busy spell freed goes back to the kernel (~1 ms)
            syscalls.malloc_trim()
            for callback in self.pool.on_idle:  # and what the pool's provisions keep at rest (trees' pages)
                callback()
        self._idle_check = asyncio.get_running_loop().call_later(IDLE_SECONDS / 4, self._watch_idle)

    def _refill(self) -> None:
        if self._stopping:
            return
        for variant, target in self.level.items():
            if not self.pool.kind_running(kind_of(variant)):
                continue  # its zygote is down: the pool restarts it (with a backoff), and refills then
            while len(self._ready[variant]) + self._filling[variant] < target:
                self._filling[variant] += 1
                self.pool.background(self._fill_one(variant))

    async def _fill_one(self, variant: Variant) -> None:
        try:
            child = await self.pool.spawn(variant)
        except Exception as exc:  # noqa: BLE001 - seen by health and by the next take()
            self.pool.last_error = str(exc)
            log.warning("could not prepare a child: %s", exc)
            return
        finally:
            self._filling[variant] -= 1
        if self._stopping or not self.pool.current(child) or len(self._ready[variant]) >= self.level[variant]:
            self.pool.discard(child)  # the zygote was replaced, the runtime stopped or went idle while it was made
            return
        self._ready[variant].append(child)
        child.exited.add_done_callback(lambda _: self._died_ready(variant, child))

    def _died_ready(self, variant: Variant, child: Child) -> None:
        """A ready child ended before any run had it (killed from outside): replace it."""
        if child in self._ready[variant]:
            self._ready[variant].remove(child)
            self.pool.discard(child)
            self._refill()

    def _drop_ready_of(self, zygote: ZygoteHandle) -> None:
        for ready in self._ready.values():
            for child in [c for c in ready if self.pool.owner(c) is zygote]:
                ready.remove(child)
                self.pool.discard(child)
