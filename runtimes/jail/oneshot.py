"""One run at a time, and nothing of it left when it returns: the jail as a Lambda instance uses it.

A platform without a uid or namespaces per run (Lambda) gives every run the
uid of the runtime itself, and a process of the same uid is reachable through
/proc/<pid>/fd and /proc/<pid>/mem. So, on top of a JailedRuntime started with
`one_run_at_a_time` (its pool then keeps no children ready: this prepares them):

- the owner says when a run is over for good (`between`: the Lambda function
  calls it once the result is posted, so that preparing the next child does
  not compete with posting it); only then is the child for the next run
  prepared. Where runs share the runtime's uid, no other prepared child exists
  while a run executes, and a run that arrives while the next child is being
  prepared waits for it; where each run has a uid of its own (root), what the
  server keeps ready is prepared in the background;
- `run` returns only when the run's process has been reaped by the zygote, every
  other process of the run's uid that the runtime did not start itself (the
  runtime process and its own children, i.e. the zygote) is killed, and what the
  run left in the writable places is removed. Where the seccomp filter is in
  force a run cannot create a process (fork, vfork and clone without
  CLONE_THREAD fail), so the sweep of /proc is only needed without it; it runs
  once, as soon as the run's process is gone, and waits on pidfds;
- files the runtime itself keeps there (a Node startup snapshot, the runs' parent
  directory) are checked after each run that shares the runtime's uid: if one was
  touched, the zygote is replaced so that no later run starts from it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import select
import shutil
import signal
import stat
import tempfile
from collections import deque

from runtimes.jail.execution import execute, kill
from runtimes.jail.runtime import JailedRuntime
from runtimes.jail.supervisor import Child, SandboxUnavailable
from runtimes.payload import RunRequest

log = logging.getLogger("sandlot.oneshot")

SWEEP_ROUNDS = 200


class StrayProcesses(RuntimeError):
    """Processes of a run could not all be killed: the instance must not serve another run."""


def _status(pid: int) -> tuple[int, int, bool]:
    """(real uid, parent, is a zombie) of a process; raises OSError once it is gone.

    Read raw: the sweep reads this for every process that looks like root's, on every run.
    """
    fd = os.open(f"/proc/{pid}/status", os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = os.read(fd, 4096)
    finally:
        os.close(fd)
    uid, parent, zombie = -1, -1, False
    for line in data.split(b"\n"):
        if line.startswith(b"State:"):
            zombie = line.split()[1] in (b"Z", b"X")
        elif line.startswith(b"PPid:"):
            parent = int(line.split()[1])
        elif line.startswith(b"Uid:"):
            uid = int(line.split()[1])
            break
    return uid, parent, zombie


def strays_of(uid: int) -> list[int]:
    """Live processes whose real uid is `uid`, except this process and its direct children (the zygotes):
    what the runtime started itself. A run's processes are the zygote's children, and an orphan goes
    to init, never to us (this process is no subreaper), so nothing of a run can pass for one of these.

    Only a process that might be of `uid` has its status read (the costly part, where the machine runs
    many processes): as that uid, one it may signal; as root, one that /proc shows as the uid's or as
    root's (a non-dumpable process shows as root's).
    """
    me = os.getpid()
    as_uid = os.geteuid() == uid
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        try:
            if as_uid:
                os.kill(pid, 0)  # PermissionError: neither its real nor its saved uid is ours
            elif os.stat(f"/proc/{entry}").st_uid not in (uid, 0):
                continue
            owner, parent, zombie = _status(pid)
        except (OSError, ValueError):
            continue
        if owner == uid and parent != me and not zombie:
            found.append(pid)
    return found


def kill_strays(uid: int) -> int:
    """SIGKILL every process of uid the runtime did not start, until none is left; how many were killed."""
    if uid == 0:
        raise ValueError("refusing to sweep uid 0")
    killed = 0
    for _ in range(SWEEP_ROUNDS):
        strays = strays_of(uid)
        if not strays:
            return killed
        pidfds = []
        for pid in strays:
            try:
                pidfd = os.pidfd_open(pid)
            except OSError:
                continue  # gone already
            try:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                killed += 1
            except (ProcessLookupError, PermissionError):
                pass  # gone, its pid taken by another uid's process
            pidfds.append(pidfd)
        _wait_gone(pidfds)
    raise StrayProcesses(f"processes of uid {uid} kept appearing after {SWEEP_ROUNDS} rounds of SIGKILL")


def _wait_gone(pidfds: list[int], timeout: float = 2.0) -> None:
    """A pidfd is readable once its process has exited (no need to be its parent)."""
    poller = select.poll()
    for fd in pidfds:
        poller.register(fd, select.POLLIN)
    try:
        remaining = set(pidfds)
        while remaining:
            events = poller.poll(int(timeout * 1000))
            if not events:
                return
            for fd, _ in events:
                poller.unregister(fd)
                remaining.discard(fd)
    finally:
        for fd in pidfds:
            os.close(fd)


def _fingerprint(path: str) -> dict[str, tuple[int, int]]:
    """(inode, ctime) of every file and directory under path: ctime cannot be set back by anyone."""
    prints = {}
    for root, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            full = os.path.join(root, name)
            try:
                st = os.lstat(full)
            except OSError:
                continue
            prints[full] = (st.st_ino, st.st_ctime_ns)
    try:
        st = os.lstat(path)
        prints[path] = (st.st_ino, st.st_ctime_ns)
    except OSError:
        pass
    return prints


class Scratch:
    """The writable places a run shares with the runtime, as they were when the runtime was ready.

    An entry of a place is known by its name and inode. What the runtime's uid had there when the
    runtime was ready stays; any other entry of that uid is what a run left, and goes. Another uid's
    entries stay; in a sticky place the run does not own (/tmp) the run can neither remove nor replace
    them, so one seen once is not looked at again: a run costs a directory read there, however full.
    """

    def __init__(self, places: list[str], uid: int, own: list[str], runs_parent: str):
        self.places = sorted({os.path.realpath(p) for p in places if os.path.isdir(p)})
        self.uid = uid
        self.runs_parent = runs_parent
        self.kept: dict[str, set[tuple[str, int]]] = {}  # the uid's entries when the runtime was ready
        self.others: dict[str, set[tuple[str, int]]] = {}  # other uids' entries, in places that keep them
        for place in self.places:
            self.kept[place] = set()
            self.others[place] = set() if self._keeps_others(place) else None
            for entry, owner in self._entries(place):
                if owner == uid:
                    self.kept[place].add((entry.name, entry.inode()))
                elif self.others[place] is not None:
                    self.others[place].add((entry.name, entry.inode()))
        self.own = own
        self.prints = self._prints()

    def _keeps_others(self, place: str) -> bool:
        try:
            st = os.stat(place)
        except OSError:
            return False
        return bool(st.st_mode & stat.S_ISVTX) and st.st_uid != self.uid

    def _entries(self, place: str, known: frozenset | set = frozenset()):
        """(entry, owner uid) of each entry of place not in known (by name and inode)."""
        try:
            with os.scandir(place) as scan:
                entries = [e for e in scan if (e.name, e.inode()) not in known]
        except OSError:
            return
        for entry in entries:
            try:
                yield entry, entry.stat(follow_symlinks=False).st_uid
            except OSError:
                continue

    def _prints(self) -> dict:
        prints = {}
        for path in self.own:
            prints.update(_fingerprint(path))
        return prints

    def clean(self) -> list[str]:
        """Remove what was not there before (and the runs' own directories); paths removed."""
        removed = []
        for place in self.places:
            others = self.others[place]
            for entry, owner in self._entries(place, self.kept[place] | (others or set())):
                if owner == self.uid:
                    removed.append(_remove(entry.path))
                elif others is not None:
                    others.add((entry.name, entry.inode()))
        if self.runs_parent and os.path.isdir(self.runs_parent):
            for name in os.listdir(self.runs_parent):
                removed.append(_remove(os.path.join(self.runs_parent, name)))
        return removed

    def tampered(self) -> bool:
        return self._prints() != self.prints

    def rebase(self) -> None:
        self.prints = self._prints()


def _remove(path: str) -> str:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)  # fd-based: never follows a planted link
    else:
        try:
            os.unlink(path)
        except OSError:
            pass
    return path


def _gone(child: Child) -> asyncio.Future:
    """Done once the child has exited: its pidfd turns readable when the process is dead (its memory and
    files released; for a namespace's init, once everything else in the namespace is dead too), without
    waiting for the zygote to reap it and say so."""
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


async def _sweep(uid: int) -> None:
    """kill_strays, without a thread unless there is something to kill (one scan is quick)."""
    if strays_of(uid):
        await asyncio.to_thread(kill_strays, uid)


class OneShotRuns:
    """Runs requests one at a time on a started JailedRuntime (config.one_run_at_a_time)."""

    def __init__(self, runtime: JailedRuntime, writable: list[str]):
        if not runtime.config.one_run_at_a_time:
            raise ValueError("a one-shot runtime needs RuntimeConfig.one_run_at_a_time")
        self.runtime = runtime
        self.writable = writable
        self.scratch: Scratch | None = None
        self.shares_uid = not runtime.config.privileged  # runs get this process's own uid
        if self.shares_uid and os.getuid() == 0:
            raise ValueError("runs that share the runtime's uid cannot be swept as root: use the full jail")
        # children kept ready between runs, by variant: one of the usual kind where runs share our uid (and
        # none while a run executes); where each run has a uid of its own, what the server keeps ready
        self.targets: dict[tuple, int] = {}
        self.prepared: dict[tuple, deque[Child]] = {}
        self._preparing: asyncio.Task | None = None
        self.running = False
        # whether a run prepares the next child itself as it ends; an owner that calls `between` once the
        # result is delivered (the Lambda function, after the post) turns this off
        self.prepare_after_run = True
        self.runs = 0

    @property
    def filter_in_force(self) -> bool:
        """The zygote loads the seccomp filter, and the platform's record agrees that it can."""
        platform = self.runtime.platform
        return bool(self.runtime.report.get("seccomp")) and (platform is None or platform.seccomp)

    def default_variant(self) -> tuple:
        request = RunRequest.model_construct(
            language=self.runtime.language, code="", enable_network=True, memory_limit_mb=None
        )
        return self.runtime.variant(request)

    async def start(self) -> None:
        """After runtime.start(): remember the writable places, prepare the first child."""
        runtime = self.runtime
        self.targets = {self.default_variant(): 1} if self.shares_uid else runtime.ready_targets()
        self.prepared = {variant: deque() for variant in self.targets}
        if self.shares_uid:
            runs_parent = runtime._tmp_parent.name if runtime._tmp_parent is not None else ""
            places = [*self.writable, tempfile.gettempdir()]
            self.scratch = Scratch(places, os.getuid(), [runtime.config.data_dir], runs_parent)
        await self.prepare()

    async def prepare(self) -> None:
        """Children for the next runs (where runs share our uid: only while no run executes)."""
        runtime = self.runtime
        if self.shares_uid and not self.running and runtime.pool is not None and runtime.pool.due_for_replacement:
            await self._replace_zygote()
        for variant, target in self.targets.items():
            ready = self.prepared[variant]
            while len(ready) < target:
                if runtime.refused or runtime.pool is None or (self.running and self.shares_uid):
                    return
                try:
                    child = await runtime.pool.take(variant)
                except SandboxUnavailable as exc:
                    log.warning("could not prepare a child for the next run: %s", exc)
                    return
                ready.append(child)

    async def _replace_zygote(self) -> None:
        """Where runs share our uid, a worn-out zygote is replaced here, while nothing of a run lives (the
        pool would do it in the background, during a run). What the new zygote brings among the runtime's
        own files (node: its startup snapshot) is then known to be the runtime's own doing: the tamper
        check takes it as the new normal, instead of reporting the runtime's own change as a run's."""
        try:
            await self.runtime.pool.replace_zygote()
        except SandboxUnavailable as exc:
            log.warning("could not replace the zygote: %s", exc)
            return
        if self.scratch is not None:
            self.scratch.rebase()

    def prepare_later(self) -> None:
        """Prepare the next children in the background (where runs share our uid, a run that arrives
        meanwhile waits for them). Call it on the runtime's event loop."""
        if self.running:
            return
        if self._preparing is None or self._preparing.done():
            self._preparing = asyncio.get_running_loop().create_task(self.prepare())

    async def between(self) -> None:
        """The last run is over and its result delivered. Where runs share our uid, return once the child
        for the next run is ready; otherwise prepare in the background."""
        self.prepare_later()
        if self.shares_uid and self._preparing is not None:
            await asyncio.shield(self._preparing)

    async def run(self, request: RunRequest, timeout: float) -> dict:
        runtime = self.runtime
        if self.running:
            raise SandboxUnavailable("one run at a time: another run is in progress")
        self.running = True
        try:
            if self.shares_uid and self._preparing is not None:  # nothing prepared may outlast this point
                await asyncio.shield(self._preparing)
                self._preparing = None
            if runtime.refused:
                raise SandboxUnavailable(runtime.refused)
            if runtime.pool is None:
                raise SandboxUnavailable(f"the {runtime.language} runtime is not running")
            child = await self._child_for(runtime.variant(request))
            self.runs += 1
            # without the filter a run may leave processes holding its output pipes open: sweep them as soon
            # as the run's process is gone, so that the output is complete without waiting for them
            gone = _gone(child)
            sweeper = None if self.filter_in_force else asyncio.ensure_future(self._sweep_after(child, gone))
            try:
                outcome = await execute(child, runtime.encode(request, timeout), timeout, runtime.config.output_limit)
            finally:
                await self._end(child, sweeper, gone)
        finally:
            self.running = False
        if self.prepare_after_run:
            self.prepare_later()
        return outcome.to_result()

    async def _child_for(self, variant: tuple) -> Child:
        ready = self.prepared.get(variant)
        while ready:
            child = ready.popleft()
            if not child.exited.done():
                return child
            await self._end(child)  # killed while it waited
        if self.shares_uid:
            for others in self.prepared.values():
                while others:
                    await self._end(others.popleft())  # of another kind: gone before this one exists
        return await self.runtime.pool.take(variant)

    async def _sweep_after(self, child: Child, gone: asyncio.Future) -> None:
        await gone
        await _sweep(child.uid)

    async def _end(self, child: Child, sweeper: asyncio.Future | None = None, gone=None) -> None:
        """Kill the child and wait until it is dead, then its strays, its files: nothing of it outlives this."""
        kill(child)
        await (gone or child.exited)  # dead: its pidfd says so, or the zygote has reaped it
        self.runtime.pool.finish(child)  # what it held goes back once the zygote has reaped it
        if child.tmpdir:
            _remove(child.tmpdir)
        if not self.filter_in_force:  # with the filter, a run cannot create a process
            if sweeper is not None:
                await sweeper  # swept once the run's process was gone; nothing of the uid can appear since
            else:
                await _sweep(child.uid)
        if self.scratch is not None:
            removed = self.scratch.clean()
            if removed:
                log.info("removed what a run left behind: %s", removed)
            if self.scratch.tampered():
                log.warning("a run touched the runtime's own files: replacing the zygote")
                await self.runtime.pool.replace_zygote()
                self.scratch.rebase()

    async def stop(self) -> None:
        if self._preparing is not None:
            await asyncio.gather(self._preparing, return_exceptions=True)
        for ready in self.prepared.values():
            while ready:
                await self._end(ready.popleft())
