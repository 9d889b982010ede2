"""Namespaces of a run's own, and the capabilities that come with them given up.

A `Forker` forks the zygote's children into their namespaces: with CLONE_NEWPID
each is the first process (pid 1) of its own PID namespace, whose end takes
every other process of that namespace with it. Two ways, the same namespaces:

- where the zygote holds CAP_SYS_ADMIN over its own PID namespace (root: the
  full mode), unshare(CLONE_NEWPID) makes the namespace its next child starts
  in, the interpreter's own os.fork makes that child, setns puts the zygote's
  own back for the next one, and the child makes its other namespaces itself
  (`Forker.child`, unshare, first thing). About 0.1 ms cheaper, in the zygote
  and in the child, than a raw clone() through ctypes;
- otherwise (a user namespace per run: it must own the run's PID namespace)
  `fork_into`: a raw clone() with every flag, between the interpreter's own
  fork hooks, as os.fork does with fork(). (Python 3.11 has no os.unshare.)

With CLONE_NEWUSER the child is the owner of a user namespace of its own: it maps
its own uid and gid (the one mapping an unprivileged process may write), uses
the capabilities it holds there to mount its /tmp, and then gives all of them up.

Everything here is imported by the zygote before it confines itself: standard
library only.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import socket

from runtimes.linux import syscalls
from runtimes.linux.syscalls import CLONE_NEWPID, CLONE_NEWUSER

_SYS_CLONE = {"x86_64": 56, "aarch64": 220}
_PR_SET_DUMPABLE = 4
_PR_CAPBSET_DROP = 24
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_CAPABILITY_VERSION_3 = 0x20080522
_LAST_CAP = 63  # no /proc/sys in the tree: drop every number, the kernel refuses the ones it does not know

# The network join (join_network), on the control socket between a process in a new user + network namespace and
# whoever starts pasta on it (runtimes/linux/pasta.py): the same bytes as the jail's protocol (NET_*).
NET_ATTACH = b"N"  # the namespaces' owner -> the service: pasta may come; fds: its user and network namespaces
NET_READY = b"n"  # the service -> the owner: pasta has configured them
NET_FAILED = b"f"  # the service -> the owner: pasta could not (why follows)

_libc = ctypes.CDLL(None, use_errno=True)
_libc_holding_gil = ctypes.PyDLL(None, use_errno=True)  # the GIL stays held across clone(), as in os.fork


class Forker:
    """How a zygote forks a child into new namespaces (flags: CLONE_NEW*, CLONE_NEWPID among them or not)."""

    def __init__(self, flags: int):
        self.flags = flags
        self._own_pid_namespace = -1  # an fd of the zygote's own PID namespace: the unshare way
        self._in_child = 0  # what the child unshares itself, the unshare way
        if flags & CLONE_NEWPID and not flags & CLONE_NEWUSER and os.geteuid() == 0:
            try:  # before the zygote enters its tree, which has no /proc
                self._own_pid_namespace = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
                # setns back needs CAP_SYS_ADMIN over the namespace's owner (a PID namespace the host's user
                # namespace owns, seen from a user namespace of the service's own), and a filter may refuse it
                syscalls.setns(self._own_pid_namespace, CLONE_NEWPID)
            except OSError:
                if self._own_pid_namespace >= 0:
                    os.close(self._own_pid_namespace)
                self._own_pid_namespace = -1  # the raw clone then
            else:
                self._in_child = flags & ~CLONE_NEWPID

    def fork(self) -> int:
        """0 in the child (which then calls child()), the child's pid in the zygote. Raises OSError."""
        if not self.flags:
            return os.fork()
        if self._own_pid_namespace < 0:
            return fork_into(self.flags)
        syscalls.setns(self._own_pid_namespace, CLONE_NEWPID)  # the zygote's own, whatever the last fork left
        syscalls.unshare(CLONE_NEWPID)  # the namespace the next child starts in, as its pid 1
        pid = os.fork()
        if pid:
            try:  # its own again at once: a fork of anything else meanwhile is not put in the child's
                syscalls.setns(self._own_pid_namespace, CLONE_NEWPID)
            except OSError:
                pass  # the child is made and must be reported: set again before the next fork
        return pid

    def child(self) -> None:
        """In the child, first: the namespaces the fork did not make."""
        if self._in_child:
            syscalls.unshare(self._in_child)


def fork_into(flags: int) -> int:
    """fork() into new namespaces: 0 in the child, the child's pid in the parent."""
    number = _SYS_CLONE[os.uname().machine]  # platform.machine()'s answer, without its import
    ctypes.pythonapi.PyOS_BeforeFork()
    pid = _libc_holding_gil.syscall(ctypes.c_long(number), ctypes.c_ulong(flags | signal.SIGCHLD), 0, 0, 0, 0)
    err = ctypes.get_errno()
    if pid == 0:
        ctypes.pythonapi.PyOS_AfterFork_Child()
        return 0
    ctypes.pythonapi.PyOS_AfterFork_Parent()
    if pid < 0:
        raise OSError(err, f"clone: {os.strerror(err)}")
    return pid


def map_own_ids(proc_fd: int, uid: int, gid: int) -> None:
    """In a user namespace just created: be uid/gid there too (no other id exists in it).

    proc_fd: an open /proc, for a process whose tree has none.
    """
    lines = (("self/setgroups", "deny"), ("self/uid_map", f"{uid} {uid} 1"), ("self/gid_map", f"{gid} {gid} 1"))
    # A non-dumpable process's /proc files belong to a root its new namespace has not mapped
    # (yet): dumpable for the three writes, as nothing can reach it yet, then not again.
    _libc.prctl(_PR_SET_DUMPABLE, ctypes.c_ulong(1), 0, 0, 0)
    try:
        for name, line in lines:
            fd = os.open(name, os.O_WRONLY | os.O_CLOEXEC, dir_fd=proc_fd)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)
    finally:
        _libc.prctl(_PR_SET_DUMPABLE, ctypes.c_ulong(0), 0, 0, 0)


def join_network(control: socket.socket, proc_fd: int, max_message: int = 65536) -> bytes:
    """In a user and network namespace just made (its egress rules installed): send both to the service over
    control (NET_ATTACH, their fds: this process is not dumpable, its /proc/<pid>/ns closed to others), for
    pasta to be attached to them; the service's answer (NET_READY, NET_FAILED and why, or b"" if it is gone).

    proc_fd: an open /proc (map_own_ids)."""
    spaces = [os.open(f"self/ns/{kind}", os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc_fd) for kind in ("user", "net")]
    try:
        socket.send_fds(control, [NET_ATTACH], spaces)
    finally:
        for fd in spaces:
            os.close(fd)
    return control.recv(max_message)


def drop_bounding_set() -> None:
    """No capability can come back, even through exec (needs CAP_SETPCAP: before any identity change)."""
    for cap in range(_LAST_CAP + 1):
        if _libc.prctl(_PR_CAPBSET_DROP, ctypes.c_ulong(cap), 0, 0, 0) < 0:
            err = ctypes.get_errno()
            if err == errno.EINVAL:
                break  # past the last capability this kernel knows
            raise OSError(err, f"PR_CAPBSET_DROP {cap}: {os.strerror(err)}")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


# Made here, in the zygote, not in each child that clears its capabilities: capset resolved (the zygote never
# calls it), and the empty sets, which never change.
_capset = _libc.capset
_NO_CAPABILITIES = (_CapData * 2)()


def clear_capabilities() -> None:
    """Empty effective, permitted, inheritable and ambient sets."""
    if _libc.prctl(_PR_CAP_AMBIENT, ctypes.c_ulong(_PR_CAP_AMBIENT_CLEAR_ALL), 0, 0, 0) < 0:
        err = ctypes.get_errno()
        if err != errno.EINVAL:  # a kernel without ambient capabilities has none to clear
            raise OSError(err, f"PR_CAP_AMBIENT: {os.strerror(err)}")
    header = _CapHeader(_CAPABILITY_VERSION_3, 0)
    if _capset(ctypes.byref(header), _NO_CAPABILITIES) < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"capset: {os.strerror(err)}")
