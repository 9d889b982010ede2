"""The first process of each run's PID namespace, made small.

Every run has a PID namespace of its own, so that when the namespace's first
process (its init) ends, the kernel kills everything else in it, and the init
is gone only once nothing of the namespace is left. The init runs nothing of
the run: it reaps what the run leaves behind and waits to be killed. Were it a
fork of the warm zygote, every run would copy and tear down the zygote's big
address space twice (the init's copy and the run's). So a small helper, the
init maker, forked by the zygote before it warms up, makes them: each init is a
fork of that small process, the first in a new PID namespace, and the zygote
then forks the run into that namespace (`fork_run`: setns on the namespace,
then fork), where the run is pid 2 and the zygote's own child. The init opens
its namespace for the zygote itself (/proc/self/ns/pid): joining through its
pidfd would need ptrace access to it, which a zygote without root lacks towards
a process that is not dumpable.

Lifetimes: the maker dies with the zygote, each init with the maker (parent-
death signals, armed and then checked against a pidfd of the parent); the zygote
kills a run's init once it has reaped the run, and reports the run's end when
the init's pidfd says it is gone. An init holds no descriptor and no capability,
and ignores SIGCHLD, so the kernel reaps whatever the run orphaned.

Standard library only: imported by the zygote before it confines itself.
"""

from __future__ import annotations

import os
import select
import signal
import socket

from runtimes import linux
from runtimes.jail import namespaces

_MAKE = b"i"
_FAILED = b"!"


class InitMaker:
    """The zygote's handle on its init maker (a forked child of it)."""

    def __init__(self, zygote_lifeline: int, proc: int) -> None:
        """proc: an open /proc (the tree has none)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ours.set_inheritable(False)
        theirs.set_inheritable(False)
        pid = os.fork()
        if pid == 0:
            ours.close()
            try:
                _serve(theirs, zygote_lifeline, proc)
            finally:
                os._exit(1)
        theirs.close()
        self.socket = ours
        self.pid = pid

    def make(self) -> tuple[int, int]:
        """A new init, the first process of a new PID namespace: its pidfd and its namespace. Raises OSError."""
        self.socket.send(_MAKE)
        message, fds, _flags, _addr = socket.recv_fds(self.socket, 512, 2, socket.MSG_CMSG_CLOEXEC)
        if message == _MAKE and len(fds) == 2:
            return fds[0], fds[1]
        for fd in fds:
            os.close(fd)
        reason = message[1:].decode(errors="replace") if message[:1] == _FAILED else "the init maker is gone"
        raise OSError(f"no PID namespace for the run: {reason}")


def fork_run(namespace: int, flags: int) -> int:
    """Fork into a PID namespace (an open namespace file) and into new namespaces `flags`: 0 in the child.

    The caller's later children go to that namespace too, until the next call:
    fork nothing else after the first. (Going back would need CAP_SYS_ADMIN over
    the caller's own PID namespace, which a zygote without root does not have.)
    """
    linux.setns(namespace, linux.CLONE_NEWPID)
    return namespaces.fork_into(flags)


def _serve(sock: socket.socket, zygote_lifeline: int, proc: int) -> None:
    """The maker's loop: one init per request, made ahead so that a request only waits for its message."""
    linux.set_parent_death_signal(signal.SIGKILL)
    if select.select([zygote_lifeline], [], [], 0)[0]:
        return  # the zygote died before the signal was armed
    lifeline = os.pidfd_open(os.getpid())  # the inits' view of their maker
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # inits are reaped by the kernel; an init inherits it
    spare: list[int] = []
    while True:
        if not spare:
            try:
                spare = _make_one(proc, lifeline)
            except OSError as exc:
                error = _FAILED + str(exc).encode()[:500]
        try:
            request = sock.recv(16)
        except OSError:
            return
        if not request:
            return  # the zygote went away
        if not spare:
            sock.send(error)
            continue
        socket.send_fds(sock, [_MAKE], spare)
        for fd in spare:
            os.close(fd)
        spare = []


def _make_one(proc: int, lifeline: int) -> list[int]:
    """[pidfd, namespace] of a new init."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    with ours, theirs:
        pid = namespaces.fork_into(linux.CLONE_NEWPID)
        if pid == 0:
            try:
                _be_init(theirs, proc, lifeline)
            finally:
                os._exit(1)
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            os.kill(pid, signal.SIGKILL)
            raise
        theirs.close()
        _message, fds, _flags, _addr = socket.recv_fds(ours, 1, 1, socket.MSG_CMSG_CLOEXEC)
        if len(fds) != 1:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            os.close(pidfd)
            raise OSError("the init could not open its namespace")
        return [pidfd, fds[0]]


def _be_init(sock: socket.socket, proc: int, lifeline: int) -> None:
    linux.set_parent_death_signal(signal.SIGKILL)
    if select.select([lifeline], [], [], 0)[0]:
        return  # the maker died before the signal was armed
    namespace = os.open("self/ns/pid", os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc)
    socket.send_fds(sock, [_MAKE], [namespace])
    sock.detach()
    os.closerange(0, os.sysconf("SC_OPEN_MAX"))
    namespaces.clear_capabilities()
    while True:
        signal.pause()
