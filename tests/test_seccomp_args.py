"""The filter's argument checks, call by call, in a forked child that loads it (root or not).

These are the raw system calls a hostile run would make, including values with the
upper 32 bits set: the kernel reads only the lower ones of an int argument, so a check
that compared all 64 would be walked around.
"""

import ctypes
import errno
import os
import socket
import struct

import pytest

from runtimes.jail.policy import allowlist
from runtimes.linux import seccomp as engine
from runtimes.linux.protections import in_child
from runtimes.linux.syscalls import set_no_new_privs

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

SYS = {
    "socket": 41,
    "ioctl": 16,
    "fcntl": 72,
    "flock": 73,
    "kill": 62,
    "getpgid": 121,
    "listen": 50,
    "bind": 49,
    "setsockopt": 54,
    "times": 100,
    "fallocate": 285,
    "timer_create": 222,
    "timer_delete": 226,
    "clock_gettime": 228,
    "clock_getres": 229,
    "clock_nanosleep": 230,
    "clone": 56,
    "close_range": 436,
}
HIGH = 1 << 32


def syscall(name: str, *args) -> str:
    ctypes.set_errno(0)
    result = libc.syscall(SYS[name], *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    if result == -1:
        return errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
    return "ok"


def in_filter(network: bool, probe) -> dict:
    """probe() run in a child under the run's filters (allow-list and pid fence); its answers."""
    program = engine.compile_program(allowlist.build(network))

    def confined() -> dict:
        set_no_new_privs()
        allowlist.fence_program(os.getpid()).load()
        program.load()
        return probe()

    answer, error = in_child(confined)
    assert not error, error
    return answer


def sockets() -> dict:
    kinds = {
        "inet stream": (socket.AF_INET, socket.SOCK_STREAM, 0),
        "inet6 dgram nonblock": (socket.AF_INET6, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK, 0),
        "inet raw": (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP),
        "inet packet": (socket.AF_INET, 10, 0),
        "unix stream": (socket.AF_UNIX, socket.SOCK_STREAM, 0),
        "netlink route": (socket.AF_NETLINK, socket.SOCK_RAW, 0),
        "netlink sock_diag": (socket.AF_NETLINK, socket.SOCK_RAW, 4),
        "packet": (17, socket.SOCK_RAW, 0),
        "inet with high bits": (socket.AF_INET | HIGH, socket.SOCK_STREAM, 0),
        "unix with high bits": (socket.AF_UNIX | HIGH, socket.SOCK_STREAM, 0),
    }
    found = {name: syscall("socket", *args) for name, args in kinds.items()}
    fd = libc.socket(socket.AF_INET, socket.SOCK_STREAM, 0)
    found["listen"] = syscall("listen", fd, 1) if fd >= 0 else "no socket"
    found["bind"] = syscall("bind", fd, b"\x02\x00" + bytes(14), 16) if fd >= 0 else "no socket"
    return found


@pytest.mark.parametrize("network", [True, False])
def test_socket_families_and_kinds(network):
    found = in_filter(network, sockets)
    allowed = "ok" if network else "EPERM"
    assert found == {
        "inet stream": allowed,
        "inet6 dgram nonblock": allowed,
        "inet raw": "EPERM",
        "inet packet": "EPERM",
        "unix stream": "EPERM",
        "netlink route": "EPERM",
        "netlink sock_diag": "EPERM",
        "packet": "EPERM",
        "inet with high bits": "EPERM",
        "unix with high bits": "EPERM",
        "listen": "EPERM" if network else "no socket",
        "bind": "EPERM" if network else "no socket",
    }


def ioctls() -> dict:
    a, b = socket.socketpair()
    r, w = os.pipe()
    buf = ctypes.create_string_buffer(64)
    return {
        "SIOCGIFCONF": syscall("ioctl", a.fileno(), 0x8912, buf),
        "SIOCGIFCONF high bits": syscall("ioctl", a.fileno(), HIGH | 0x8912, buf),
        "SIOCGSKNS": syscall("ioctl", a.fileno(), 0x894C, 0),
        "SIOCGIWNAME": syscall("ioctl", a.fileno(), 0x8B01, buf),
        "TCGETS on a pipe": syscall("ioctl", r, 0x5401, buf),  # allowed: the kernel says "not a tty"
        "FIONREAD": syscall("ioctl", r, 0x541B, buf),
        "FIOCLEX": syscall("ioctl", w, 0x5451, 0),
        "FIONBIO": syscall("ioctl", w, 0x5421, ctypes.byref(ctypes.c_int(1))),
        "TIOCGWINSZ on a pipe": syscall("ioctl", w, 0x5413, buf),
        "TCGETS high bits": syscall("ioctl", r, HIGH | 0x5401, buf),
    }


def filesystem_ioctls(path: str) -> dict:
    fd = os.open(path, os.O_RDONLY)
    fsmap = ctypes.create_string_buffer(192 + 64 * 4)
    struct.pack_into("IIII", fsmap, 0, 0, 0, 4, 0)
    struct.pack_into("IIQQQQ", fsmap, 128, 2**32 - 1, 2**32 - 1, 2**64 - 1, 2**64 - 1, 2**64 - 1, 2**64 - 1)
    fiemap = ctypes.create_string_buffer(32 + 56 * 4)
    struct.pack_into("QQIIII", fiemap, 0, 0, 2**64 - 1, 0, 0, 4, 0)
    return {
        "FS_IOC_GETFSMAP": syscall("ioctl", fd, 0xC0C0583B, fsmap),
        "FS_IOC_FIEMAP": syscall("ioctl", fd, 0xC020660B, fiemap),
        "FS_IOC_GETFLAGS": syscall("ioctl", fd, 0x80086601, ctypes.create_string_buffer(8)),
        "FS_IOC_GETFSUUID": syscall("ioctl", fd, 0x82111500, ctypes.create_string_buffer(24)),
        "FIGETBSZ": syscall("ioctl", fd, 2, ctypes.create_string_buffer(8)),
        "FIONREAD on a file": syscall("ioctl", fd, 0x541B, ctypes.create_string_buffer(8)),
    }


def test_ioctl_allows_the_terminal_and_descriptor_type_only():
    assert in_filter(True, ioctls) == {
        "SIOCGIFCONF": "EPERM",
        "SIOCGIFCONF high bits": "EPERM",
        "SIOCGSKNS": "EPERM",
        "SIOCGIWNAME": "EPERM",
        "TCGETS on a pipe": "ENOTTY",
        "FIONREAD": "ok",
        "FIOCLEX": "ok",
        "FIONBIO": "ok",
        "TIOCGWINSZ on a pipe": "ENOTTY",
        "TCGETS high bits": "ENOTTY",
    }


def test_no_ioctl_maps_or_names_the_hosts_disk():
    """On a file of the host's disk (the interpreter's library, mounted into every tree; where /tmp is a
    directory of that disk, the run's own files): FS_IOC_GETFSMAP answered the whole disk's free extents,
    FS_IOC_FIEMAP where the allocator works (both counters other runs move), FS_IOC_GETFSUUID the disk's
    name."""
    assert in_filter(True, lambda: filesystem_ioctls(os.__file__)) == {
        "FS_IOC_GETFSMAP": "EPERM",
        "FS_IOC_FIEMAP": "EPERM",
        "FS_IOC_GETFLAGS": "EPERM",
        "FS_IOC_GETFSUUID": "EPERM",
        "FIGETBSZ": "EPERM",
        "FIONREAD on a file": "ok",
    }


def locks_and_pids() -> dict:
    fd = os.open("/dev/null", os.O_RDONLY)
    lock = ctypes.create_string_buffer(struct.pack("hhqqi", 1, 0, 0, 0, 0))  # F_WRLCK
    return {
        "flock": syscall("flock", fd, 2),
        "F_SETLK": syscall("fcntl", fd, 6, lock),
        "F_SETLK high bits": syscall("fcntl", fd, HIGH | 6, lock),
        "F_OFD_SETLKW": syscall("fcntl", fd, 38, lock),
        "F_GETFD": syscall("fcntl", fd, 1, 0),
        "F_SETOWN high bits": syscall("fcntl", fd, HIGH | 8, 1),
        "F_SETSIG": syscall("fcntl", fd, 10, 9),
        "kill 1": syscall("kill", 1, 0),
        "kill self": syscall("kill", os.getpid(), 0),
        "kill group": syscall("kill", 0, 0),
        "getpgid 1": syscall("getpgid", 1),
        "getpgid 0 high bits": syscall("getpgid", HIGH),
        "getpgid 0": syscall("getpgid", 0),
    }


def test_locks_succeed_without_locking_and_pids_are_the_callers_only():
    assert in_filter(False, locks_and_pids) == {
        "flock": "ok",
        "F_SETLK": "ok",
        "F_SETLK high bits": "ok",
        "F_OFD_SETLKW": "ok",
        "F_GETFD": "ok",
        "F_SETOWN high bits": "EPERM",
        "F_SETSIG": "EPERM",
        "kill 1": "EPERM",
        "kill self": "ok",
        "kill group": "EPERM",
        "getpgid 1": "EPERM",
        "getpgid 0 high bits": "EPERM",
        "getpgid 0": "ok",
    }


def socket_options() -> dict:
    a, _b = socket.socketpair()
    inet = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    big = ctypes.c_int(1 << 22)
    one = ctypes.c_int(1)
    default = a.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
    found = {
        "SO_SNDBUF": syscall("setsockopt", a.fileno(), 1, 7, ctypes.byref(big), 4),
        "SO_RCVBUF": syscall("setsockopt", a.fileno(), 1, 8, ctypes.byref(big), 4),
        "SO_SNDBUFFORCE": syscall("setsockopt", a.fileno(), 1, 32, ctypes.byref(big), 4),
        "SO_SNDBUF high bits": syscall("setsockopt", a.fileno(), 1 | HIGH, 7 | HIGH, ctypes.byref(big), 4),
        "SO_SNDBUF through option high bits": syscall("setsockopt", a.fileno(), 1, 7 | HIGH, ctypes.byref(big), 4),
        "SO_PASSCRED": syscall("setsockopt", a.fileno(), 1, 16, ctypes.byref(one), 4),
        "SO_KEEPALIVE": syscall("setsockopt", inet.fileno(), 1, 9, ctypes.byref(one), 4),
        "TCP_NODELAY": syscall("setsockopt", inet.fileno(), 6, 1, ctypes.byref(one), 4),
        "IP_TOS": syscall("setsockopt", inet.fileno(), 0, 1, ctypes.byref(one), 4),
        "SOL_NETLINK": syscall("setsockopt", a.fileno(), 270, 1, ctypes.byref(one), 4),
        "socket option 200": syscall("setsockopt", a.fileno(), 1, 200, ctypes.byref(one), 4),
    }
    found["buffer unchanged"] = a.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) == default
    found["receive buffer unchanged"] = a.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) == default
    return found


def test_socket_buffers_keep_their_default_size_and_other_options_work():
    assert in_filter(True, socket_options) == {
        "SO_SNDBUF": "ok",
        "SO_RCVBUF": "ok",
        "SO_SNDBUFFORCE": "ok",
        "SO_SNDBUF high bits": "ok",
        "SO_SNDBUF through option high bits": "ok",
        "SO_PASSCRED": "ok",
        "SO_KEEPALIVE": "ok",
        "TCP_NODELAY": "ok",
        "IP_TOS": "ok",
        "SOL_NETLINK": "EPERM",
        "socket option 200": "EPERM",
        "buffer unchanged": True,
        "receive buffer unchanged": True,
    }


def fill_socket_buffers() -> dict:
    """The helper's attack: 100 socketpairs (a run's RLIMIT_NOFILE of 256 gives it 126), each end's buffer
    asked for at its largest and filled. What the kernel holds for them, in MiB."""
    pairs, queued = [], 0
    chunk = b"x" * 65536
    for _ in range(100):
        a, b = socket.socketpair()
        pairs.append((a, b))
        for end in (a, b):
            end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 30)
            end.setblocking(False)
            while True:
                try:
                    queued += end.send(chunk)
                except BlockingIOError:
                    break
    return {"MiB": queued >> 20}


def test_a_run_cannot_pin_gigabytes_in_socket_buffers():
    """Each buffer raised to net.core.wmem_max, a run's 126 pairs held about 2 GiB (4 GiB with the ends passed
    away over SCM_RIGHTS), outside every memory limit of the run."""
    found = in_filter(False, fill_socket_buffers)
    assert found["MiB"] < 128, found


def test_a_lock_taken_under_the_filter_is_not_held():
    """What another run would see: no lock at all on the shared file."""
    import fcntl

    def take() -> dict:
        with open("/etc/hosts", "rb") as f:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            with open("/proc/locks") as locks:
                inode = os.fstat(f.fileno()).st_ino
                return {"held": any(f":{inode} " in line for line in locks)}

    assert in_filter(False, take) == {"held": False}


@pytest.mark.parametrize("pid", [1, 2, 300, 32767, 65536, 4194304])
def test_the_fence_copied_for_a_pid_is_the_fence_built_for_it(pid):
    built = allowlist.clock_prefix(pid) + bytes(engine.compile_program(allowlist.fence_for(pid))._buffer)
    assert bytes(allowlist.fence_program(pid)._buffer) == built


# ---- the page cache and machine-wide counters (issue 19) ----------------------------------

SYS_PAGE_CACHE = {"mincore": 27, "madvise": 28, "sysinfo": 99, "fadvise64": 221, "preadv2": 327, "cachestat": 451}
MAP_PRIVATE, PROT_READ = 0x02, 0x1


def page_cache_calls() -> dict:
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    fd = os.open(os.__file__, os.O_RDONLY)  # a file of the interpreter: shared by every run in the tree
    mapped = libc.mmap(None, 4096, PROT_READ, MAP_PRIVATE, fd, 0)
    anonymous = ctypes.create_string_buffer(1 << 16)
    aligned = (ctypes.addressof(anonymous) + 4095) & ~4095
    buf = ctypes.create_string_buffer(4096)
    iov = (ctypes.c_void_p * 2)(ctypes.addressof(buf), 4096)
    info = ctypes.create_string_buffer(128)
    vec = ctypes.create_string_buffer(1)

    def call(name: str, *args) -> str:
        SYS[name] = SYS_PAGE_CACHE[name]
        return syscall(name, *args)

    def madvise(address: int, advice: int) -> str:
        return call("madvise", ctypes.c_void_p(address), 4096, advice)

    return {
        "fadvise DONTNEED": call("fadvise64", fd, 0, 0, 4),
        "fadvise DONTNEED high bits": call("fadvise64", fd, 0, 0, HIGH | 4),
        "fadvise WILLNEED": call("fadvise64", fd, 0, 0, 3),
        "fadvise SEQUENTIAL": call("fadvise64", fd, 0, 0, 2),
        "fadvise NOREUSE": call("fadvise64", fd, 0, 0, 5),
        "preadv2": call("preadv2", fd, iov, 1, 0, 0, 0),
        "preadv2 RWF_NOWAIT": call("preadv2", fd, iov, 1, 0, 0, 0x8),
        "preadv2 RWF_NOWAIT|RWF_HIPRI": call("preadv2", fd, iov, 1, 0, 0, 0x9),
        "mincore": call("mincore", ctypes.c_void_p(mapped), 4096, vec),
        "cachestat": call("cachestat", fd, 0, info, 0),
        "sysinfo": call("sysinfo", info),
        "madvise DONTNEED anonymous": madvise(aligned, 4),
        "madvise DONTNEED file": madvise(mapped, 4),
        "madvise WILLNEED file": madvise(mapped, 3),
        "madvise HUGEPAGE": madvise(aligned, 14),
        "madvise DONTFORK": madvise(aligned, 10),
        "madvise COLD file": madvise(mapped, 20),
        "madvise PAGEOUT file": madvise(mapped, 21),
        "madvise PAGEOUT high bits": madvise(mapped, HIGH | 21),
        "madvise MERGEABLE": madvise(aligned, 12),
        "madvise COLLAPSE": madvise(aligned, 25),
    }


def test_no_call_evicts_or_probes_the_shared_page_cache_nor_reads_machine_counters():
    assert in_filter(False, page_cache_calls) == {
        "fadvise DONTNEED": "EPERM",
        "fadvise DONTNEED high bits": "EPERM",
        "fadvise WILLNEED": "ok",
        "fadvise SEQUENTIAL": "ok",
        "fadvise NOREUSE": "ok",
        "preadv2": "ok",
        "preadv2 RWF_NOWAIT": "ENOTSUP",  # EOPNOTSUPP, as on a file that cannot do it: callers fall back
        "preadv2 RWF_NOWAIT|RWF_HIPRI": "ENOTSUP",
        "mincore": "EPERM",
        "cachestat": "EPERM",
        "sysinfo": "EPERM",
        "madvise DONTNEED anonymous": "ok",
        "madvise DONTNEED file": "ok",
        "madvise WILLNEED file": "ok",
        "madvise HUGEPAGE": "ok",
        "madvise DONTFORK": "ok",
        "madvise COLD file": "EPERM",
        "madvise PAGEOUT file": "EPERM",
        "madvise PAGEOUT high bits": "EPERM",
        "madvise MERGEABLE": "EPERM",
        "madvise COLLAPSE": "EPERM",
    }


def test_the_calls_that_evict_or_probe_cannot_be_reopened_by_allowed_syscalls():
    for number in (27, 28, 99, 221, 327, 328):
        with pytest.raises(ValueError, match="may not be allowed"):
            allowlist.check_extra_syscalls([number])


def test_times_answers_enosys():
    """Its return value is the host's clock ticks since boot, which no time namespace shifts."""
    buf = ctypes.create_string_buffer(32)
    assert in_filter(False, lambda: syscall("times", buf)) == "ENOSYS"


def cpu_clock(pid: int, kind: int) -> int:
    """Linux's CPU clock id: (~pid << 3) | kind (0-2 a process's, 4-6 a thread's)."""
    return (~pid << 3) | kind


def clocks() -> dict:
    ts = ctypes.create_string_buffer(16)
    parent, me = os.getppid(), os.getpid()

    def gettime(clock: int) -> str:
        return syscall("clock_gettime", clock, ts)

    timer = ctypes.c_int(0)

    def timer_create(clock: int) -> str:
        answer = syscall("timer_create", clock, None, ctypes.byref(timer))
        if answer == "ok":
            syscall("timer_delete", timer.value)
        return answer

    struct.pack_into("qq", ts, 0, 0, 1000)
    return {
        "system clocks": {c: gettime(c) for c in (0, 1, 2, 3, 4, 5, 6, 7, 11)},
        "unknown clock 12": gettime(12),
        "own process, pid 0": [gettime(cpu_clock(0, kind)) for kind in (0, 1, 2)],
        "own thread, pid 0": [gettime(cpu_clock(0, kind)) for kind in (4, 5, 6)],
        "own process, its pid": [gettime(cpu_clock(me, kind)) for kind in (0, 1, 2)],
        "own main thread, its tid": gettime(cpu_clock(me, 6)),
        "clockfd 0": gettime(cpu_clock(0, 3)),
        "parent's process clock": [gettime(cpu_clock(parent, kind)) for kind in (0, 1, 2)],
        "pid 1's process clock": gettime(cpu_clock(1, 2)),
        "parent's clock, getres": syscall("clock_getres", cpu_clock(parent, 2), ts),
        "parent's clock, nanosleep": syscall("clock_nanosleep", cpu_clock(parent, 2), 0, ts, None),
        "parent's clock, timer_create": timer_create(cpu_clock(parent, 2)),
        "own clock, timer_create": timer_create(cpu_clock(0, 2)),
        "own clock, getres": syscall("clock_getres", cpu_clock(0, 2), ts),
        "process cputime with high bits": gettime(HIGH | 2),
        "own clock zero-extended (the vDSO's way)": gettime(cpu_clock(0, 2) & 0xFFFFFFFF),
        "parent's clock zero-extended": gettime(cpu_clock(parent, 2) & 0xFFFFFFFF),
        "parent's clock with other high bits": gettime((cpu_clock(parent, 2) & 0xFFFFFFFF) | (5 << 32)),
    }


def test_cpu_clocks_name_the_run_itself_only():
    """The kernel reads any process's CPU time for whoever names its pid in a clock id: in the chroot mode (no
    PID namespace) every other run's, the zygotes' and the service's. Only the caller's own are allowed."""
    assert in_filter(False, clocks) == {
        "system clocks": {str(c): "ok" for c in (0, 1, 2, 3, 4, 5, 6, 7, 11)},
        "unknown clock 12": "EINVAL",
        "own process, pid 0": ["ok"] * 3,
        "own thread, pid 0": ["ok"] * 3,
        "own process, its pid": ["ok"] * 3,
        "own main thread, its tid": "ok",
        "clockfd 0": "EINVAL",
        "parent's process clock": ["EINVAL"] * 3,
        "pid 1's process clock": "EINVAL",
        "parent's clock, getres": "EINVAL",
        "parent's clock, nanosleep": "EINVAL",
        "parent's clock, timer_create": "EINVAL",
        "own clock, timer_create": "ok",
        "own clock, getres": "ok",
        "process cputime with high bits": "ok",  # the kernel reads 2
        "own clock zero-extended (the vDSO's way)": "ok",
        "parent's clock zero-extended": "EINVAL",
        "parent's clock with other high bits": "EINVAL",
    }


def test_the_parents_cpu_clock_is_readable_without_the_filter():
    """The case above is not the kernel's own refusal: outside the filter the parent's clock answers."""
    ts = ctypes.create_string_buffer(16)
    answer, error = in_child(lambda: syscall("clock_gettime", cpu_clock(os.getppid(), 2), ts))
    assert not error and answer == "ok"


def test_python_clocks_work_under_the_filter():
    import threading
    import time

    def probe() -> list:
        seen = [time.process_time() >= 0, time.thread_time() >= 0, time.monotonic() > 0, time.time() > 0]
        seen.append(time.clock_gettime(time.pthread_getcpuclockid(threading.get_ident())) >= 0)
        time.sleep(0.001)
        return seen

    assert in_filter(False, probe) == [True] * 5


def pipe_sizes() -> dict:
    import fcntl

    r, w = os.pipe()
    found = {}
    for name, size in (
        ("one page", 4096),
        ("the default", 65536),
        ("a byte more", 65537),
        ("1 MiB", 1 << 20),
        ("a page, high bits", HIGH | 4096),
        ("1 MiB, high bits", HIGH | (1 << 20)),
    ):
        ctypes.set_errno(0)
        result = libc.fcntl(w, fcntl.F_SETPIPE_SZ, ctypes.c_long(size))
        found[name] = "ok" if result >= 0 else errno.errorcode[ctypes.get_errno()]
    found["size"] = fcntl.fcntl(r, fcntl.F_GETPIPE_SZ)
    return found


def test_pipes_grow_no_larger_than_the_default():
    """Pipe pages are counted per uid: runs that share one passed bits by growing pipes past the soft limit."""
    assert in_filter(False, pipe_sizes) == {
        "one page": "ok",
        "the default": "ok",
        "a byte more": "EPERM",
        "1 MiB": "EPERM",
        "a page, high bits": "ok",
        "1 MiB, high bits": "EPERM",
        "size": 4096,  # the last size set: a page
    }


NOT_SUPPORTED = errno.errorcode[errno.EOPNOTSUPP]  # ENOTSUP: the same number


def fallocate_modes(path: str) -> dict:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    modes = {
        "0 (grow the file)": 0,
        "0 with high bits": HIGH,
        "KEEP_SIZE": 1,
        "PUNCH_HOLE | KEEP_SIZE": 3,
        "ZERO_RANGE": 0x10,
        "ZERO_RANGE | KEEP_SIZE": 0x11,
        "INSERT_RANGE": 0x20,
        "KEEP_SIZE with high bits": HIGH | 1,
    }
    found = {name: syscall("fallocate", fd, mode, 0, 1 << 20) for name, mode in modes.items()}
    found["size"] = os.fstat(fd).st_size
    return found


def test_fallocate_takes_mode_0_only(tmp_path):
    """KEEP_SIZE allocates past the file's size, which RLIMIT_FSIZE does not bound: the chroot mode's /tmp cap was
    walked past by 1 GiB so. Mode 0 grows the file, as a write does."""
    assert in_filter(False, lambda: fallocate_modes(str(tmp_path / "f"))) == {
        "0 (grow the file)": "ok",
        "0 with high bits": "ok",
        "KEEP_SIZE": NOT_SUPPORTED,
        "PUNCH_HOLE | KEEP_SIZE": NOT_SUPPORTED,
        "ZERO_RANGE": NOT_SUPPORTED,
        "ZERO_RANGE | KEEP_SIZE": NOT_SUPPORTED,
        "INSERT_RANGE": NOT_SUPPORTED,
        "KEEP_SIZE with high bits": NOT_SUPPORTED,
        "size": 1 << 20,
    }


CLONE_VM, CLONE_FILES, CLONE_THREAD, CLOSE_RANGE_UNSHARE = 0x100, 0x400, 0x10000, 0x2


def descriptor_tables() -> dict:
    """Ways for a thread to a descriptor table of its own. The clone flags lack CLONE_SIGHAND, which the kernel
    requires with CLONE_THREAD: a call the filter admits fails with EINVAL there, and no thread is ever made."""
    import threading

    threads = []
    worker = threading.Thread(target=lambda: threads.append("ran"))
    worker.start()
    worker.join()
    spare = os.dup(0)
    return {
        "clone thread, shared table": syscall("clone", CLONE_THREAD | CLONE_FILES | CLONE_VM, 0, 0, 0, 0),
        "clone thread, own table": syscall("clone", CLONE_THREAD | CLONE_VM, 0, 0, 0, 0),
        "close_range": syscall("close_range", spare, spare, 0),
        "close_range, unshare": syscall("close_range", 0, 0, CLOSE_RANGE_UNSHARE),
        "close_range, unshare with high bits": syscall("close_range", 0, 0, CLOSE_RANGE_UNSHARE | HIGH),
        "a Python thread": threads,
    }


def test_every_thread_of_a_run_shares_its_descriptor_table():
    """The watcher reads a run's /proc/<pid>/fd for files held after their names went (tmp/held.py): a thread
    with a table of its own would hold them out of its sight."""
    assert in_filter(True, descriptor_tables) == {
        "clone thread, shared table": "EINVAL",  # admitted by the filter, refused by the kernel (no SIGHAND)
        "clone thread, own table": "EPERM",
        "close_range": "ok",
        "close_range, unshare": "EPERM",
        "close_range, unshare with high bits": "EPERM",
        "a Python thread": ["ran"],
    }


def links(directory: str) -> dict:
    source = os.path.join(directory, "shared")
    with open(source, "w") as file:
        file.write("x")
    found = {}
    for name, call in (
        ("link", lambda target: os.link(source, target)),
        ("linkat", lambda target: os.link(source, target, follow_symlinks=False)),
    ):
        target = os.path.join(directory, name)
        try:
            call(target)
            found[name] = "ok"
        except OSError as exc:
            found[name] = errno.errorcode[exc.errno]
    found["symlink"] = "ok" if os.symlink(source, os.path.join(directory, "symbolic")) is None else "?"
    return found


def test_hard_links_are_refused_only_where_the_filter_is_built_to_refuse_them(tmp_path):
    """Where fs.protected_hardlinks is 0, a chroot-mode run could link the tree's shared files into its /tmp
    (language.links_refused): the filter then answers link and linkat as that setting would, with EPERM. Elsewhere
    (its own files in its /tmp) links work as before; symlinks are never touched."""

    def run(refuse: bool, directory: str) -> dict:
        program = engine.compile_program(allowlist.build(False, refuse_links=refuse))

        def confined() -> dict:
            set_no_new_privs()
            program.load()
            return links(directory)

        answer, error = in_child(confined)
        assert not error, error
        return answer

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert run(False, str(tmp_path / "a")) == {"link": "ok", "linkat": "ok", "symlink": "ok"}
    assert run(True, str(tmp_path / "b")) == {"link": "EPERM", "linkat": "EPERM", "symlink": "ok"}
