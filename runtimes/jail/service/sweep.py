"""Every process of a uid, found, killed, and seen unable to act: where a uid, not a namespace, ends a run.

Where runs have no PID namespace (a Lambda function; a container without
namespaces) the run's uid is the handle on everything it started: a process of
that uid that the runtime did not start itself is the run's, and is killed. A
run that is filtered cannot create a process (fork, vfork and clone without
CLONE_THREAD fail), so the sweep then only confirms; without the filter it is
what ends the run's strays.

`inert` is the answer rule of the serial schedule: a result may go out once
every thread of the run's processes has entered exit (a zombie, or PF_EXITING
on each task), as read from /proc, outside the run: no thread in exit returns
to user space, so nothing of the run can act again, although the kernel has
not torn it down yet.
"""

from __future__ import annotations

import asyncio
import os
import select
import signal
import time

from runtimes.linux.procfs import task_inert

SWEEP_ROUNDS = 200


class StrayProcesses(RuntimeError):
    """Processes of a run could not all be killed: the instance must not serve another run."""


def _status(pid: int) -> tuple[int, int, bool]:
    """(real uid, parent, is a zombie) of a process; raises OSError once it is gone.

    Read raw: the sweep reads this for every process that looks like the uid's, on every run.
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
    A process all of whose threads are exiting is not live: it can start nothing any more.

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
        if owner == uid and parent != me and not zombie and not _all_exiting(pid):
            found.append(pid)
    return found


def kill_strays(uid: int, wait: bool = True) -> list[int]:
    """SIGKILL every process of uid the runtime did not start, until none is left that can act; the pids killed.

    wait: until each is dead (its memory and files released), not only exiting.
    """
    if uid == 0:
        raise ValueError("refusing to sweep uid 0")
    killed: list[int] = []
    for _ in range(SWEEP_ROUNDS):
        strays = strays_of(uid)
        if not strays:
            return killed
        targets: list[tuple[int, int]] = []
        for pid in strays:
            # gone already, or its pid taken since the scan by a process of another uid or by one of ours
            pidfd = _pin(pid, lambda owner, parent: owner == uid and parent != os.getpid())
            if pidfd < 0:
                continue
            try:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                killed.append(pid)
            except (ProcessLookupError, PermissionError):
                pass  # gone, its pid taken by another uid's process
            targets.append((pid, pidfd))
        try:
            if wait:
                _wait_gone([pidfd for _pid, pidfd in targets])
            else:
                _wait_exiting(targets)
        finally:
            for _pid, pidfd in targets:
                os.close(pidfd)
    raise StrayProcesses(f"processes of uid {uid} kept appearing after {SWEEP_ROUNDS} rounds of SIGKILL")


def kill_range(first: int, last: int) -> list[int]:
    """SIGKILL every process whose real uid is in first..last (a uid block's runs left by a killed instance),
    in one scan of /proc, and wait until they are gone; the pids killed."""
    if first <= 0:
        raise ValueError("refusing to sweep uid 0")
    killed: list[int] = []
    for _ in range(SWEEP_ROUNDS):
        targets = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                shown = os.stat(f"/proc/{entry}").st_uid  # a non-dumpable process shows as root's
                if shown != 0 and not first <= shown <= last:
                    continue
                owner, _parent, zombie = _status(int(entry))
            except (OSError, ValueError):
                continue
            if not first <= owner <= last or zombie:
                continue
            pidfd = _pin(int(entry), lambda owner, _parent: first <= owner <= last)
            if pidfd < 0:
                continue
            try:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                killed.append(int(entry))
            except (ProcessLookupError, PermissionError):
                pass
            targets.append(pidfd)
        if not targets:
            return killed
        try:
            _wait_gone(targets)
        finally:
            for pidfd in targets:
                os.close(pidfd)
    raise StrayProcesses(f"processes of uids {first}-{last} kept appearing after {SWEEP_ROUNDS} rounds of SIGKILL")


def _pin(pid: int, meant) -> int:
    """A pidfd of pid if the process it now names is still one the sweep means (`meant(uid, parent)`), else -1.

    Between the scan of /proc and pidfd_open the process may have ended and its pid gone to another
    process (as root nothing else would refuse the signal; sharing the runs' uid, one of our own children
    could take it): the pidfd fixes which process is meant, and its uid and parent are read again after
    it. If that one ends too and its pid is taken once more, the signal through the pidfd reaches nobody.
    """
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return -1
    try:
        owner, parent, _zombie = _status(pid)
    except (OSError, ValueError):
        owner = parent = -1
    if owner < 0 or not meant(owner, parent):
        os.close(pidfd)
        return -1
    return pidfd


async def sweep(uid: int) -> None:
    """kill_strays, without a thread unless there is something to kill (one scan is quick)."""
    if strays_of(uid):
        await asyncio.to_thread(kill_strays, uid)


def _wait_gone(pidfds: list[int], timeout: float = 2.0) -> None:
    """A pidfd is readable once its process has exited (no need to be its parent)."""
    poller = select.poll()
    for fd in pidfds:
        poller.register(fd, select.POLLIN)
    remaining = set(pidfds)
    while remaining:
        events = poller.poll(int(timeout * 1000))
        if not events:
            return
        for fd, _ in events:
            poller.unregister(fd)
            remaining.discard(fd)


def _wait_exiting(targets: list[tuple[int, int]], timeout: float = 2.0) -> None:
    """Until every thread of each (pid, pidfd) has entered exit (or timeout: the caller's next scan sees it)."""
    delay, waited = 0.0001, 0.0
    while waited < timeout:
        targets = [(pid, pidfd) for pid, pidfd in targets if not exiting_or_gone(pid, pidfd)]
        if not targets:
            return
        time.sleep(delay)
        waited += delay
        delay = min(delay * 2, 0.005)


def _all_exiting(pid: int) -> bool:
    """Whether every thread of pid has entered exit (True once the process is gone)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True
    for tid in tasks:
        try:
            fd = os.open(f"/proc/{pid}/task/{tid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue  # that thread is gone
        try:
            stat = os.read(fd, 1024)
        except OSError:
            continue
        finally:
            os.close(fd)
        if not task_inert(stat):
            return False
    return True


def exiting_or_gone(pid: int, pidfd: int) -> bool:
    """Whether the process pidfd names has exited, or every thread of it has entered exit. While its pidfd
    is not readable the process lives, so its pid is still its own: /proc/<pid> is read only then."""
    if select.select([pidfd], [], [], 0)[0]:
        return True
    return _all_exiting(pid)


SPIN_SECONDS = 0.003  # how long inert() polls without yielding (asyncio cannot sleep under a millisecond)


async def inert(pid: int, pidfd: int, timeout: float = 5.0) -> None:
    """Wait until every thread of the process (sent SIGKILL already) has entered exit.

    A killed process is usually there within tens of microseconds, and the event loop cannot wait less than a
    millisecond (epoll's resolution): the first SPIN_SECONDS are polled in short sleeps that keep the loop
    (one run at a time: nothing else is waiting on it), the rest with asyncio's. Raises StrayProcesses if
    one has not within timeout (a task stuck in the kernel).
    """
    loop = asyncio.get_running_loop()
    started = loop.time()
    delay = 0.00005
    while not exiting_or_gone(pid, pidfd):
        waited = loop.time() - started
        if waited > timeout:
            raise StrayProcesses(f"process {pid} did not enter exit within {timeout:g} s of SIGKILL")
        if waited < SPIN_SECONDS:
            time.sleep(delay)
            delay = min(delay * 2, 0.0005)
        else:
            await asyncio.sleep(0.001)
