"""One run of a ready child: feed its stdin, collect its output under the cap, enforce the wall clock."""

from __future__ import annotations

import asyncio
import os
import signal
import time

from runtimes.jail import protocol
from runtimes.jail.service.outcome import Outcome
from runtimes.jail.service.supervisor import Child

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
        self.open = set(self.buffers)
        self.done = self.loop.create_future()
        for fd in self.buffers:
            os.set_blocking(fd, False)
            self.loop.add_reader(fd, self._read, fd)

    def _read(self, fd: int) -> bool:
        """Read one chunk; False when there is nothing to read now (or any more)."""
        try:
            data = os.read(fd, _CHUNK)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if not data:
            self.loop.remove_reader(fd)
            self.open.discard(fd)
            if not self.open and not self.done.done():
                self.done.set_result(None)
            return False
        if self.truncated:
            return True  # drain what is left; the child is being killed
        room = self.limit - self.total
        if len(data) > room:
            data = data[:room]
            self.truncated = True
            kill(self.child)
        self.buffers[fd] += data
        self.total += len(data)
        return True

    def drain(self) -> None:
        """Take what the pipes hold now (the writer is done: nothing more is owed)."""
        for fd in list(self.open):
            while self._read(fd) and not self.truncated:
                pass

    def close(self) -> None:
        for fd in (self.child.stdout, self.child.stderr):
            self.loop.remove_reader(fd)


class _ExitReport:
    """How a runner says its run ends, on the ready pipe just before it exits (protocol.py): one byte,
    the exit status, or KILLED_BY and a signal number.

    It saves waiting for the kernel to tear the process down. Whatever the child
    writes there can only end its own run early, as exiting would: the service
    kills the child at once and takes its output as it stands. Anything else is
    no report; the run then ends when the process does.
    """

    def __init__(self, child: Child):
        self.loop = asyncio.get_running_loop()
        self.fd = child.ready
        self.status: asyncio.Future = self.loop.create_future()  # (signaled, exit status or signal number)
        if self.fd >= 0:
            os.set_blocking(self.fd, False)
            self._read()  # a runner that does not report closed its end before the run: EOF now
            if self.fd >= 0:
                self.loop.add_reader(self.fd, self._read)

    def _read(self) -> None:
        try:
            data = os.read(self.fd, 3)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        self.close()
        if len(data) == 1:
            self.status.set_result((False, data[0]))
        elif len(data) == 2 and data[:1] == protocol.KILLED_BY and data[1]:
            self.status.set_result((True, data[1]))

    def take(self) -> None:
        """What the pipe holds now, once the process is gone (a dead writer has said all it will)."""
        self._read()

    def close(self) -> None:
        if self.fd >= 0:
            self.loop.remove_reader(self.fd)
            self.fd = -1


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
    if child.on_run is not None:
        child.on_run()  # watches that only a run needs (thread_cap.py)
    collector = _Collector(child, output_limit)
    feeder = _Feeder(child, data)
    child.stdin = -1  # the feeder owns it now
    report = _ExitReport(child)
    timed_out = False
    try:
        await asyncio.wait((child.exited, report.status), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if report.status.done() and not child.exited.done():
            kill(child)  # it is exiting anyway; whatever it does after its report is not waited for
            signaled, status = report.status.result()
            duration = time.monotonic() - started
            collector.drain()
        else:
            if not child.exited.done():
                timed_out = True
                kill(child)
            signaled, status = await child.exited
            duration = time.monotonic() - started
            if not timed_out and report.fd >= 0:
                report.take()  # reported just before its end: the report says how (killed by a signal it sent itself)
            if report.status.done():
                signaled, status = report.status.result()
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
        report.close()
    if child.settle is not None and not timed_out and not collector.truncated:
        await child.settle()  # the caps it was under, checked on what it left (may set ended_by)
    return Outcome(
        stdout=bytes(collector.buffers[child.stdout]),
        stderr=bytes(collector.buffers[child.stderr]),
        signaled=signaled,
        status=status,
        timed_out=timed_out and not collector.truncated,
        truncated=collector.truncated,
        duration=duration,
        ended_by="" if timed_out or collector.truncated else child.ended_by,
    )
