"""The service's side of one zygote process: start it, ask it for children, learn how they end."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from runtimes.jail import protocol, zygote_start
from runtimes.jail.zygote_config import ZygoteConfig, config_file
from runtimes.linux.pasta import NamespaceNetwork, Pasta
from runtimes.payload import Unavailable

log = logging.getLogger("sandlot.jail")


@dataclass
class Child:
    """A forked, confined child waiting for its run. The fds are the service's ends."""

    pid: int
    pidfd: int
    uid: int
    tmpdir: str
    stdin: int
    stdout: int
    stderr: int
    ready: int
    exited: asyncio.Future = field(repr=False)
    ended_by: str = ""  # the service's own error line when it ended the run itself (e.g. over its /tmp caps)
    settle: Callable[[], Awaitable[None]] | None = field(default=None, repr=False)  # a last check once it ended
    on_run: Callable[[], None] | None = field(default=None, repr=False)  # its run begins (execution.execute)

    def close(self) -> None:
        for fd in (self.pidfd, self.stdin, self.stdout, self.stderr, self.ready):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.pidfd = self.stdin = self.stdout = self.stderr = self.ready = -1


class ZygoteHandle:
    """The service's handle on one zygote process (the process itself runs zygote/loop.py's `Zygote`)."""

    def __init__(
        self,
        python: str,
        config: ZygoteConfig,
        env: dict[str, str],
        network: NamespaceNetwork | None = None,
        start_timeout: float = 60.0,
    ):
        self.on_exit: list = []  # called once if the zygote dies on its own
        self.tag = ""  # what the owner wants to know it by (the layer it was started on)
        self.tree_root = ""  # the chroot mode: the materialized tree it chrooted into (its runs' /tmp is there)
        self._python = python
        self._config = config
        self._env = env
        self._start_timeout = start_timeout  # SANDLOT_ZYGOTE_START_TIMEOUT
        self._process: subprocess.Popen | None = None
        self._control: socket.socket | None = None
        self._ready: asyncio.Future | None = None
        self._pending: deque[asyncio.Future] = deque()
        self._exits: dict[int, asyncio.Future] = {}
        self._pidfds: dict[int, int] = {}  # pid -> a pidfd of our own, to see it dead even without the zygote
        self.report: dict = {}
        self.started_ahead = False  # its interpreter was started ahead of its config (zygote_start.py)
        self.forks = 0
        self.alive = False
        self._network = network  # userns without root: the runs' namespace and pasta (linux/pasta.py)
        self._pasta: Pasta | None = None
        self.network_error = ""  # why its runs have no network after all (pasta failed or ended as it started)
        self._tasks: set[asyncio.Task] = set()

    async def start(self) -> dict:
        loop = asyncio.get_running_loop()
        config = self._config
        ahead = zygote_start.take_ahead(self._python, self._env, config.runner, config.import_paths)
        if ahead is not None:  # its interpreter started ahead (a runtime function's early hook): its config now
            self.started_ahead = True
            self._process, ours = ahead.process, ahead.control
            try:
                await asyncio.to_thread(ahead.send, config.with_control(ahead.control_fd).to_json())
            except OSError:  # it died meanwhile: said as any zygote that exits as it starts (EOF below)
                pass
            except BaseException:  # cancelled (the service stops as it starts)
                ahead.discard()
                raise
        else:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            config = config.with_control(theirs.fileno())
            with config_file(config) as file:
                self._process = zygote_start.popen(
                    self._python, self._env, config.runner, file.fileno(), theirs.fileno()
                )
            theirs.close()
        ours.setblocking(False)
        self._control = ours
        self._ready = loop.create_future()
        self.alive = True
        loop.add_reader(ours.fileno(), self._on_message)
        try:
            self.report = await asyncio.wait_for(self._ready, timeout=self._start_timeout)
        except TimeoutError as exc:
            await self.stop()
            raise Unavailable(
                f"the zygote did not start: not ready in {self._start_timeout:g} s (SANDLOT_ZYGOTE_START_TIMEOUT)"
            ) from exc
        except EOFError as exc:
            await self.stop()
            raise Unavailable(f"the zygote did not start: {exc or 'it exited'}") from exc
        except asyncio.CancelledError:  # the service stops while this zygote starts (a setting refused meanwhile)
            self._process.kill()  # before it reads the channel: it would wait for its start to end, then complain
            await asyncio.shield(self.stop())
            raise
        if "error" in self.report:
            await self.stop()
            raise Unavailable(f"the zygote could not build the jail: {self.report['error']}")
        return self.report

    async def fork(self, uid: int, tmpdir: str, variant: dict) -> Child:
        if not self.alive or self._control is None:
            raise Unavailable("the zygote is not running")
        loop = asyncio.get_running_loop()
        stdin_r, stdin_w = os.pipe2(os.O_CLOEXEC)
        stdout_r, stdout_w = os.pipe2(os.O_CLOEXEC)
        stderr_r, stderr_w = os.pipe2(os.O_CLOEXEC)
        ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
        theirs = [stdin_r, stdout_w, stderr_w, ready_w]
        reply: asyncio.Future = loop.create_future()
        self._pending.append(reply)
        try:
            socket.send_fds(self._control, [protocol.fork_request(uid, tmpdir, variant)], theirs)
        except OSError as exc:
            self._pending.remove(reply)
            for fd in (stdin_w, stdout_r, stderr_r, ready_r):
                os.close(fd)
            raise Unavailable(f"the zygote is not answering: {exc}") from exc
        finally:
            for fd in theirs:
                os.close(fd)
        self.forks += 1
        try:
            pid, pidfd = await reply
        except BaseException:
            for fd in (stdin_w, stdout_r, stderr_r, ready_r):
                os.close(fd)
            raise
        return Child(pid, pidfd, uid, tmpdir, stdin_w, stdout_r, stderr_r, ready_r, self._exits[pid])

    @property
    def live_children(self) -> int:
        return len(self._exits)

    def _on_message(self) -> None:
        assert self._control is not None
        while True:
            try:
                message, fds, _flags, _addr = socket.recv_fds(
                    self._control, protocol.MAX_MESSAGE, 2, socket.MSG_CMSG_CLOEXEC
                )
            except BlockingIOError:
                return
            except OSError:
                message, fds = b"", []
            if not message:
                self._on_eof()
                return
            kind, body = message[:1], message[1:]
            if kind == protocol.FORKED:
                pid = protocol.parse_pid(body)
                self._exits[pid] = asyncio.get_running_loop().create_future()
                self._pidfds[pid] = os.dup(fds[0])
                self._resolve_pending(result=(pid, fds[0]))
            elif kind == protocol.EXITED:
                pid, signaled, value = protocol.parse_exited(body)
                self._settle(pid, (signaled, value))
            elif kind == protocol.FORK_FAILED:
                self._resolve_pending(error=Unavailable(f"fork failed: {body.decode(errors='replace')}"))
            elif kind == protocol.READY and self._ready and not self._ready.done():
                self._ready.set_result(json.loads(body))
            elif kind == protocol.NET_ATTACH:
                task = asyncio.get_running_loop().create_task(self._attach_network(fds))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _attach_network(self, namespaces: list[int]) -> None:
        """The zygote has its network namespace and rules (fds: its user and network namespaces):
        pasta gives it a way out, then the zygote goes on."""
        try:
            if self._network is None or not self._network.in_force or len(namespaces) != 2:
                raise OSError("this runtime has no network for its runs")
            pasta = await Pasta.attach(self._network, *namespaces)
        except OSError as exc:
            self.network_error = str(exc)
            self._send(protocol.NET_FAILED + str(exc).encode())
            return
        finally:
            for fd in namespaces:
                os.close(fd)
        if not self.alive:
            pasta.stop()
            return
        self._pasta = pasta
        asyncio.get_running_loop().add_reader(pasta.pidfd, self._on_pasta_exit)
        self._send(protocol.NET_READY)

    def _send(self, message: bytes) -> None:
        if self._control is not None:
            try:
                self._control.send(message)
            except OSError:
                pass  # the zygote is gone: _on_eof follows

    def _on_pasta_exit(self) -> None:
        """Without pasta the runs' network is gone. Ended while its zygote starts (pasta applies its own
        seccomp filter only after it has configured the namespace): the zygote serves runs without
        network, and the runtime refuses the others. Ended later: this zygote ends too, and the pool
        starts another."""
        assert self._pasta is not None
        why = self._pasta.failure()
        self._stop_pasta()
        if self._ready is not None and not self._ready.done():
            self.network_error = f"pasta ended as its zygote started: {why}"
            return
        log.error("pasta (the runs' network) ended (%s): stopping its zygote", why)
        if self._process is not None and self._process.poll() is None:
            self._process.kill()

    def _stop_pasta(self) -> None:
        if self._pasta is not None:
            asyncio.get_running_loop().remove_reader(self._pasta.pidfd)
            self._pasta.stop()
            self._pasta = None

    def _resolve_pending(self, result=None, error=None) -> None:
        if not self._pending:
            return
        future = self._pending.popleft()
        if future.done():  # the caller went away; the child still gets reaped
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def _settle(self, pid: int, result: tuple[bool, int]) -> None:
        future = self._exits.pop(pid, None)
        pidfd = self._pidfds.pop(pid, -1)
        if pidfd >= 0:
            asyncio.get_running_loop().remove_reader(pidfd)
            os.close(pidfd)
        if future is not None and not future.done():
            future.set_result(result)

    def _orphans_die(self) -> None:
        """Without the zygote nobody reports: kill what is left and settle each once the kernel says it is dead.

        Its uid and /tmp go back only then (a parent-death signal is on its way too).
        """
        loop = asyncio.get_running_loop()
        for pid, pidfd in list(self._pidfds.items()):
            try:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass
            loop.add_reader(pidfd, self._settle, pid, (True, signal.SIGKILL))
        for pid in [p for p in self._exits if p not in self._pidfds]:
            self._settle(pid, (True, signal.SIGKILL))

    def _on_eof(self) -> None:
        """The zygote is gone; its children die with it (parent-death signal, and our own SIGKILL)."""
        self.alive = False
        if self._control is not None:
            asyncio.get_running_loop().remove_reader(self._control.fileno())
        if self._ready and not self._ready.done():
            self._ready.set_exception(EOFError("the zygote exited during start-up"))
        while self._pending:
            self._resolve_pending(error=Unavailable("the zygote exited"))
        self._orphans_die()
        self._stop_pasta()
        for callback in self.on_exit:
            callback(self)

    async def stop(self) -> None:
        """Close the channel: the zygote kills what is left of its children and exits."""
        if self._control is not None:
            if self.alive:
                asyncio.get_running_loop().remove_reader(self._control.fileno())
            self._control.close()
            self._control = None
        self.alive = False
        if self._process is not None:
            try:
                await asyncio.to_thread(self._process.wait, 10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                await asyncio.to_thread(self._process.wait)
        self._orphans_die()
        self._stop_pasta()
        remaining = [f for f in self._exits.values() if not f.done()]
        if remaining:
            await asyncio.wait(remaining, timeout=10)
