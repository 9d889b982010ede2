"""One run at a time, and nothing of it left before the next: the schedule of a Lambda function.

A platform without a uid or namespaces per run (Lambda) gives every run the uid
of the runtime itself, and a process of the same uid is reachable through
/proc/<pid>/fd and /proc/<pid>/mem; the Runtime API on 127.0.0.1:9001 hands the
next invocation to whoever asks. So:

- a run may answer once nothing of it can execute again (`finish`): its
  process, and where no filter stops process creation every process of its uid
  the runtime did not start, has been sent SIGKILL, and every one of their
  threads has entered exit, as read from /proc (sweep.inert). The run's own exit
  report is never enough: kill first, then check;
- the rest happens after the answer, before the next run (`between`, which the
  Lambda function calls once awslambdaric has posted the result and before it
  asks for the next invocation): the run's process reaped, the sweep confirmed,
  its directory and what it left in the writable places removed, the runtime's
  own files checked untouched (else the zygote is replaced), a worn-out zygote
  replaced, and the child for the next run prepared. Only then: no process
  prepared for a later run exists while any thread of a run can execute, and
  nothing of a run exists when the next event is fetched. An owner that never
  calls `between` gets it done at the start of the next `take`;
- the first run (`first_run`, set by a runtime that starts on a zygote for it):
  a fresh Lambda environment often serves one run only (tenancy per run, a new
  tenant's first run), so the runtime may start it on a leaner zygote, with no
  work done ahead for later runs (Python: nothing of the layer preloaded; the
  run imports what it uses). Once that run is over and cleaned up, `between`
  calls `first_run()` (the runtime switches to its usual zygote) and replaces
  the zygote, as a worn-out one is replaced: between runs, never during one.
  The zygote, its mode and its children's confinement are the same either way.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable

from runtimes.jail.service import sweep
from runtimes.jail.service.execution import kill
from runtimes.jail.service.pool import ChildPool, Variant
from runtimes.jail.service.supervisor import Child
from runtimes.jail.tmp.scratch import Scratch
from runtimes.payload import Unavailable

log = logging.getLogger("sandlot.serial")


class SerialSchedule:
    def __init__(
        self,
        pool: ChildPool,
        default_variant: Variant,
        sweep_uid: bool,  # a run's strays are found by its uid (no PID namespace) and no filter stops them
        wait_for_namespace: bool,  # no filter, and the run's PID namespace ends only once the zygote reaped it
        scratch: Scratch | None = None,  # runs share the runtime's uid: what they leave in shared places
        first_run: Callable[[], None] | None = None,  # the runtime's switch to its usual zygote, once
    ):
        self.pool = pool
        self.default_variant = default_variant
        self.sweep_uid = sweep_uid
        self.wait_for_namespace = wait_for_namespace
        self.scratch = scratch
        self.prepared: deque[Child] = deque()  # at most one, made in between()
        self._ended: Child | None = None  # the last run's child, until between() has cleaned up after it
        self._sweeper: asyncio.Task | None = None  # kills the running run's strays once its process is gone
        self._running = False
        self._lock = asyncio.Lock()  # between() and take() never overlap
        self._stopped = False
        self.runs = 0
        self.first_run = first_run

    async def start(self) -> None:
        await self.between()

    async def take(self, variant: Variant) -> Child:
        if self._running:
            raise Unavailable("one run at a time: another run is in progress")
        self._running = True
        try:
            await self.between()  # the owner did not call it after the last run: done now, before this one
            child = await self._child_for(variant)
        except BaseException:
            self._running = False
            raise
        self.runs += 1
        if self.sweep_uid:
            # a run may leave processes holding its output pipes open: they are killed as soon as the run's
            # process is gone, so that its output is complete without waiting for them
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_when_gone(child))
        return child

    async def finish(self, child: Child) -> None:
        """Kill the run, then wait until none of its threads can run user code again: then it may answer."""
        self._ended = child
        try:
            kill(child)
            if self.sweep_uid:
                await asyncio.to_thread(sweep.kill_strays, child.uid, False)
            if self.wait_for_namespace:
                await child.exited  # the zygote reports it once it is reaped: the namespace's pid 1, all of it gone
            await sweep.inert(child.pid, child.pidfd)
        finally:
            self._running = False

    async def between(self) -> None:
        """After the answer: clean up after the last run, then prepare the child for the next one."""
        async with self._lock:
            ended, self._ended = self._ended, None
            if ended is not None:
                await self._clean_up(ended)
            if self._stopped:
                return
            if self.first_run is not None and self.runs:
                switch, self.first_run = self.first_run, None
                switch()
                await self._replace_zygote("the first run is over", logging.INFO)
            if self.pool.due_for_replacement:
                await self._replace_zygote("worn out")
            if not self.prepared and self.pool.running:
                try:
                    self.prepared.append(await self.pool.spawn(self.default_variant))
                except Unavailable as exc:
                    log.warning("could not prepare a child for the next run: %s", exc)

    async def stop(self) -> None:
        self._stopped = True
        await self.between()
        while self.prepared:
            await self._clean_up(self.prepared.popleft(), kill_first=True)

    def status(self) -> dict:
        return {"ready_children": len(self.prepared), "runs": self.runs}

    # ---- internals -----------------------------------------------------------

    async def _child_for(self, variant: Variant) -> Child:
        while self.prepared:
            child = self.prepared.popleft()
            if child.exited.done() or dict(variant) != dict(self.default_variant):
                await self._clean_up(child, kill_first=True)  # killed while it waited, or of another kind
                continue
            return child
        return await self.pool.spawn(variant)

    async def _sweep_when_gone(self, child: Child) -> None:
        await _gone(child)
        await asyncio.to_thread(sweep.kill_strays, child.uid, False)

    async def _clean_up(self, child: Child, kill_first: bool = False) -> None:
        """The child reaped and given back; its strays, its directory, what it left: gone."""
        if kill_first:
            kill(child)
        await child.exited
        await self.pool.release(child)  # its uid and directory go back
        sweeper, self._sweeper = self._sweeper, None
        if sweeper is not None:
            await asyncio.gather(sweeper, return_exceptions=True)  # done before anything new of the uid exists
        if self.sweep_uid:
            await sweep.sweep(child.uid)  # confirmed: nothing of the uid appeared since the answer
        if self.scratch is not None:
            removed = self.scratch.clean()
            if removed:
                log.info("removed what a run left behind: %s", removed)
            planted = self.scratch.tampered()
            if planted is not None:
                if planted:
                    log.info("removed what a run planted among the runtime's own files: %s", planted)
                await self._replace_zygote("a run touched the runtime's own files")

    async def _replace_zygote(self, why: str, level: int = logging.WARNING) -> None:
        """Here, between runs, and never during one: what the new zygote brings among the runtime's own files
        (node: its startup snapshot) is then the runtime's own doing, and the new normal."""
        log.log(level, "%s: replacing the zygote", why)
        for child in self.prepared:
            kill(child)
        while self.prepared:
            await self._clean_up(self.prepared.popleft())
        try:
            await self.pool.replace_zygote()
        except Unavailable as exc:
            log.warning("could not replace the zygote: %s", exc)
            return
        if self.scratch is not None:
            self.scratch.rebase()


def _gone(child: Child) -> asyncio.Future:
    """Done once the child has exited: its pidfd turns readable when the process is dead (for a namespace's
    init, once everything else in the namespace is dead too), without waiting for the zygote's report."""
    if child.pidfd < 0:
        return child.exited
    loop = asyncio.get_running_loop()
    gone = loop.create_future()

    def on_exit() -> None:
        loop.remove_reader(child.pidfd)
        if not gone.done():
            gone.set_result(None)

    loop.add_reader(child.pidfd, on_exit)
    child.exited.add_done_callback(lambda _: on_exit() if not gone.done() else None)
    return gone
