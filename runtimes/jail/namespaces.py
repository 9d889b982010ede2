"""Namespaces of a run's own, and the capabilities that come with them given up.

`fork_into` is os.fork with namespace flags: the child starts in new namespaces,
and with CLONE_NEWPID it is the first process (pid 1) of its own PID namespace,
whose end takes every other process of that namespace with it. Python 3.11 has
no os.unshare, and unshare(CLONE_NEWPID) would only move the caller's later
children; a raw clone() between the interpreter's own fork hooks does it in one
step, as os.fork does with fork().

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
import platform
import signal

_SYS_CLONE = {"x86_64": 56, "aarch64": 220}
_PR_SET_DUMPABLE = 4
_PR_CAPBSET_DROP = 24
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_CAPABILITY_VERSION_3 = 0x20080522
_LAST_CAP = 63  # no /proc/sys in the tree: drop every number, the kernel refuses the ones it does not know

_libc = ctypes.CDLL(None, use_errno=True)
_libc_holding_gil = ctypes.PyDLL(None, use_errno=True)  # the GIL stays held across clone(), as in os.fork


def fork_into(flags: int) -> int:
    """fork() into new namespaces: 0 in the child, the child's pid in the parent."""
    number = _SYS_CLONE[platform.machine()]
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


# Made here, in the zygote, not in each child that clears its capabilities: the empty sets never change.
_prctl, _capset = _libc.prctl, _libc.capset
_NO_CAPABILITIES = (_CapData * 2)()


def clear_capabilities() -> None:
    """Empty effective, permitted, inheritable and ambient sets."""
    if _prctl(_PR_CAP_AMBIENT, ctypes.c_ulong(_PR_CAP_AMBIENT_CLEAR_ALL), 0, 0, 0) < 0:
        err = ctypes.get_errno()
        if err != errno.EINVAL:  # a kernel without ambient capabilities has none to clear
            raise OSError(err, f"PR_CAP_AMBIENT: {os.strerror(err)}")
    header = _CapHeader(_CAPABILITY_VERSION_3, 0)
    if _capset(ctypes.byref(header), _NO_CAPABILITIES) < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"capset: {os.strerror(err)}")
