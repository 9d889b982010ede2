"""One run of a ready child: feed its stdin, collect its output under the cap, enforce the wall clock."""

from __future__ import annotations

import asyncio
import os
import signal
import time

from runtimes.jail.outcome import Outcome
from runtimes.jail.supervisor import Child

_CHUNK = 1 << 16


class _Collector:
    """Reads both output pipes until EOF; stops the child once the cap is passed."""

    def __init__(self, child: Child, limit: int):
        self.loop = asyncio.get_running_loop()
        self.child = child
        self.limit = limit
        self.total = 0
        self.truncated = False
        self.buffers = {child.stdout: bytearray(), child.stderr: bytearray()}
        self.open = len(self.buffers)
        self.done = self.loop.create_future()
        for fd in self.buffers:
            os.set_blocking(fd, False)
            self.loop.add_reader(fd, self._read, fd)

    def _read(self, fd: int) -> None:
        try:
            data = os.read(fd, _CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.loop.remove_reader(fd)
            self.open -= 1
            if self.open == 0 and not self.done.done():
                self.done.set_result(None)
            return
        if self.truncated:
            return  # drain what is left; the child is being killed
        room = self.limit - self.total
        if len(data) > room:
            data = data[:room]
            self.truncated = True
            kill(self.child)
        self.buffers[fd] += data
        self.total += len(data)

    def close(self) -> None:
        for fd in (self.child.stdout, self.child.stderr):
            self.loop.remove_reader(fd)


def kill(child: Child) -> None:
    try:
        signal.pidfd_send_signal(child.pidfd, signal.SIGKILL)
    except ProcessLookupError:
        pass


class _Feeder:
    """Writes the run request and the user's stdin without blocking the loop."""

    def __init__(self, child: Child, data: bytes):
        self.loop = asyncio.get_running_loop()
        self.fd = child.stdin
        self.view = memoryview(data)
        os.set_blocking(self.fd, False)
        self._write()
        if self.fd >= 0:
            self.loop.add_writer(self.fd, self._write)

    def _write(self) -> None:
        try:
            while self.view:
                written = os.write(self.fd, self.view[:_CHUNK])
                self.view = self.view[written:]
        except BlockingIOError:
            return
        except OSError:
            pass  # the child is gone or stopped reading: nothing more to give it
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            self.loop.remove_writer(self.fd)
            os.close(self.fd)
            self.fd = -1


async def execute(child: Child, data: bytes, timeout: float, output_limit: int) -> Outcome:
    """Send data to a ready child and wait until it has ended, whatever it does."""
    started = time.monotonic()
    collector = _Collector(child, output_limit)
    feeder = _Feeder(child, data)
    child.stdin = -1  # the feeder owns it now
    timed_out = False
    try:
        try:
            signaled, status = await asyncio.wait_for(asyncio.shield(child.exited), timeout)
        except TimeoutError:
            timed_out = True
            kill(child)
            signaled, status = await child.exited
        duration = time.monotonic() - started
        try:  # a dead process holds no pipe open: EOF comes at once
            await asyncio.wait_for(collector.done, 5)
        except TimeoutError:
            pass
    except BaseException:
        kill(child)
        raise
    finally:
        feeder.close()
        collector.close()
    return Outcome(
        stdout=bytes(collector.buffers[child.stdout]),
        stderr=bytes(collector.buffers[child.stderr]),
        signaled=signaled,
        status=status,
        timed_out=timed_out and not collector.truncated,
        truncated=collector.truncated,
        duration=duration,
    )
