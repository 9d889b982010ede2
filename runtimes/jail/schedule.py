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

import logging
from collections import deque
from typing import Protocol

from runtimes.jail.pool import ChildPool, Variant
from runtimes.jail.supervisor import Child, Zygote

log = logging.getLogger("sandlot.jail")


class Schedule(Protocol):
    async def start(self) -> None: ...

    async def take(self, variant: Variant) -> Child: ...

    async def finish(self, child: Child) -> None: ...

    async def between(self) -> None: ...

    async def stop(self) -> None: ...

    def status(self) -> dict: ...


class PooledSchedule:
    """Children forked and confined ahead of demand, per variant (what a runner must know before the run
    arrives, e.g. Node's network filter); other variants are forked on demand."""

    def __init__(self, pool: ChildPool, targets: dict[Variant, int]):
        self.pool = pool
        self.targets = targets
        self._ready: dict[Variant, deque[Child]] = {v: deque() for v in targets}
        self._filling: dict[Variant, int] = dict.fromkeys(targets, 0)
        self._stopping = False
        pool.on_replaced.append(self._drop_ready_of)
        pool.on_running.append(self._refill)

    async def start(self) -> None:
        self._refill()

    async def take(self, variant: Variant) -> Child:
        ready = self._ready.get(variant)
        while ready:
            child = ready.popleft()
            if not child.exited.done():
                return child
            self.pool.discard(child)
        return await self.pool.spawn(variant)

    async def finish(self, child: Child) -> None:
        """The run has answered (its exit report, or its end): the child is killed, and given back once dead."""
        self.pool.discard(child)
        self._refill()  # after the run, so that the zygote's forks do not compete with it

    async def between(self) -> None:
        pass  # the server answers and goes on: what a run held goes back in the background

    async def stop(self) -> None:
        self._stopping = True
        for ready in self._ready.values():
            while ready:
                self.pool.discard(ready.popleft())

    def status(self) -> dict:
        return {"ready_children": sum(len(r) for r in self._ready.values())}

    # ---- internals -----------------------------------------------------------

    def _refill(self) -> None:
        if self._stopping:
            return
        for variant, target in self.targets.items():
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
        if self._stopping or not self.pool.current(child):
            self.pool.discard(child)  # the zygote was replaced or the runtime stopped while it was made
            return
        self._ready[variant].append(child)
        child.exited.add_done_callback(lambda _: self._died_ready(variant, child))

    def _died_ready(self, variant: Variant, child: Child) -> None:
        """A ready child ended before any run had it (killed from outside): replace it."""
        if child in self._ready[variant]:
            self._ready[variant].remove(child)
            self.pool.discard(child)
            self._refill()

    def _drop_ready_of(self, zygote: Zygote) -> None:
        for ready in self._ready.values():
            for child in [c for c in ready if self.pool.owner(c) is zygote]:
                ready.remove(child)
                self.pool.discard(child)
