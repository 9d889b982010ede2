"""How many requests may be in flight, and how many runs execute at once.

Over MAX_REQUESTS in flight a request is refused at once. Up to MAX_WORKERS
runs execute; the rest wait their turn, which does not count against their
run timeout. A waiter whose client has gone away is dropped, and a wait longer
than the queue timeout is refused like an overload.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from contextvars import ContextVar

# Seconds the current task's run waited for its worker slot (read by the metrics and the run's log line).
queue_wait: ContextVar[float | None] = ContextVar("sandlot_queue_wait", default=None)


class Refused(Exception):
    """No slot: the caller answers with the 503 envelope."""


class ClientWentAway(Exception):
    """The client went away while waiting: nobody to answer."""


class Admission:
    def __init__(self, max_requests: int, max_workers: int, queue_timeout: float):
        self.max_requests = max_requests
        self.max_workers = max_workers
        self.queue_timeout = queue_timeout
        self.in_flight = 0
        self.running = 0
        self.waiting = 0
        self._slots = asyncio.Semaphore(max_workers)

    @asynccontextmanager
    async def request(self):
        if self.in_flight >= self.max_requests:
            raise Refused()
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1

    @asynccontextmanager
    async def worker(self, disconnected: Callable[[], Awaitable[object]]):
        started = time.monotonic()
        if self._slots.locked():
            await self._wait(disconnected)
        else:
            await self._slots.acquire()
        queue_wait.set(time.monotonic() - started)
        self.running += 1
        try:
            yield
        finally:
            self.running -= 1
            self._slots.release()

    async def _wait(self, disconnected: Callable[[], Awaitable[object]]) -> None:
        self.waiting += 1
        acquire = asyncio.ensure_future(self._slots.acquire())
        gone = asyncio.ensure_future(disconnected())
        try:
            done, _ = await asyncio.wait(
                {acquire, gone}, timeout=self.queue_timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            self.waiting -= 1
            gone.cancel()
        if acquire in done:
            return
        acquire.cancel()
        try:
            await acquire  # it may have won the race after all
        except asyncio.CancelledError:
            pass
        else:
            self._slots.release()
        if gone in done:
            raise ClientWentAway()
        raise Refused()

    def status(self) -> dict:
        return {
            "max_requests": self.max_requests,
            "max_workers": self.max_workers,
            "in_flight": self.in_flight,
            "running": self.running,
            "waiting": self.waiting,
        }
