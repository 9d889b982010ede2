"""Thin ctypes wrappers for the Linux calls Python 3.11 lacks (mounts, namespaces, prctl, seccomp).

Shared by the jail and by the isolated layer build (layers/jailer.py).
Everything here is imported by the zygote before it confines itself, so it must
only use the standard library.
"""

from __future__ import annotations

import ctypes
import os

_libc = ctypes.CDLL(None, use_errno=True)

CLONE_NEWTIME = 0x00000080  # unshare() only: clone() reads these bits as the exit signal
CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_NOATIME = 0x400
MS_NODIRATIME = 0x800
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21

MNT_DETACH = 0x2

MADV_COLLAPSE = 25

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38

_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def _b(path: str | None) -> bytes | None:
    return None if path is None else os.fsencode(path)


def syncfs(path: str) -> None:
    """Write back what is dirty on the filesystem holding path, and only that one (sync(2) waits for every
    filesystem of the machine: other containers' too)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        _check(_libc.syncfs(fd), f"syncfs {path}")
    finally:
        os.close(fd)


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(_libc.mount(_b(source), _b(target), _b(fstype), ctypes.c_ulong(flags), _b(data)), f"mount {target}")


def open_own(name: str) -> int:
    """/proc/self/<name> open for reading (ahead of entering a tree that has no /proc), or -1 without one."""
    try:
        return os.open(f"/proc/self/{name}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return -1


def malloc_trim() -> bool:
    """glibc's malloc_trim(0): the free pages of malloc's heap back to the kernel; False without it (musl)."""
    try:
        return bool(_libc.malloc_trim(0))
    except AttributeError:
        return False


def madvise(address: int, length: int, advice: int) -> None:
    _check(_libc.madvise(ctypes.c_void_p(address), ctypes.c_size_t(length), ctypes.c_int(advice)), "madvise")


def umount2(target: str, flags: int = 0) -> None:
    _check(_libc.umount2(_b(target), flags), f"umount {target}")


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), "unshare")


def setns(fd: int, nstype: int) -> None:
    """Join the namespaces of nstype that fd (a namespace file or a pidfd) names."""
    _check(_libc.setns(fd, nstype), "setns")


def pivot_root(new_root: str, put_old: str) -> None:
    number = _SYS_PIVOT_ROOT[os.uname().machine]  # platform.machine()'s answer, without its import
    _check(_libc.syscall(number, _b(new_root), _b(put_old)), "pivot_root")


def prctl(option: int, arg: int = 0) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), f"prctl {option}")


def set_no_new_privs() -> None:
    prctl(PR_SET_NO_NEW_PRIVS, 1)


def set_dumpable(dumpable: bool) -> None:
    """A non-dumpable process's /proc entries belong to root: same-uid code cannot read them."""
    prctl(PR_SET_DUMPABLE, 1 if dumpable else 0)


def set_parent_death_signal(signum: int) -> None:
    prctl(PR_SET_PDEATHSIG, signum)


PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class SeccompProgram:
    """A compiled BPF program, loadable with one prctl (no_new_privs must be set).

    Built once in the zygote from libseccomp's export, so that a child spends a
    single system call on its filter instead of regenerating it.
    """

    def __init__(self, bpf: bytes):
        if not bpf or len(bpf) % 8:
            raise ValueError("not a BPF program")
        self._buffer = ctypes.create_string_buffer(bpf, len(bpf))
        self._prog = _SockFprog(len(bpf) // 8, ctypes.addressof(self._buffer))

    def load(self) -> None:
        _check(
            _libc.prctl(PR_SET_SECCOMP, ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.byref(self._prog), 0, 0),
            "seccomp",
        )
