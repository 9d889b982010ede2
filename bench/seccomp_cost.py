"""What the run's seccomp filters cost per system call: no filter, then the allow-list with the
pid fence stacked on it, as a run has them. Not run by CI.

    python bench/seccomp_cost.py [--calls 200000] [--compare OTHER_CHECKOUT]

--compare loads another checkout's runtimes/jail/policy/allowlist.py too (e.g. a `git archive`
of main), so that two versions are measured side by side on the same machine and moment.
Before this change the root jail loaded the allow-list alone and the reduced jail both;
now every run has both. Each row: nanoseconds per call, Python's own call included (best of 7 rounds), for getppid and
a read of 0 bytes (plain allow), fcntl(F_GETFD) and ioctl(FIONREAD) (checked by argument), and, checked by
argument since the page-cache calls were narrowed (issue 19), madvise(MADV_DONTNEED) and preadv2 with flags 0.
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import importlib.util
import json
import mmap
import os
import sys
import termios
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from runtimes.jail.policy import allowlist  # noqa: E402
from runtimes.linux.syscalls import set_no_new_privs  # noqa: E402

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_page = mmap.mmap(-1, 4096)
_page_address = ctypes.addressof(ctypes.c_char.from_buffer(_page))
_file = os.open(__file__, os.O_RDONLY)
_iov = (ctypes.c_void_p * 2)(ctypes.addressof(ctypes.create_string_buffer(1)), 1)
SYS_MADVISE, SYS_PREADV2, MADV_DONTNEED = 28, 327, 4

CALLS = {
    "getppid": lambda r, buf: os.getppid(),  # not cached by libc: a system call each time
    "read 0 bytes": lambda r, buf: os.read(r, 0),
    "fcntl F_GETFD": lambda r, buf: os.get_inheritable(r),
    "ioctl FIONREAD": lambda r, buf: fcntl.ioctl(r, termios.FIONREAD, buf),
    # checked by argument since issue 19 (malloc's madvise; a positioned read with flags)
    "madvise DONTNEED": lambda r, buf: _libc.syscall(SYS_MADVISE, ctypes.c_void_p(_page_address), 4096, MADV_DONTNEED),
    "preadv2 flags 0": lambda r, buf: _libc.syscall(SYS_PREADV2, _file, _iov, 1, 0, 0, 0),
}


def measure(calls: int) -> dict[str, float]:
    r, _w = os.pipe()
    buf = bytearray(4)
    found = {}
    for name, call in CALLS.items():
        rounds = []
        for _ in range(7):
            started = time.perf_counter_ns()
            for _ in range(calls):
                call(r, buf)
            rounds.append((time.perf_counter_ns() - started) / calls)
        found[name] = min(rounds)  # the least disturbed round: the machine is shared
    return found


def in_child(calls: int, load) -> dict[str, float]:
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        load()
        os.write(write_end, json.dumps(measure(calls)).encode())
        os._exit(0)
    os.close(write_end)
    data = b""
    while chunk := os.read(read_end, 65536):
        data += chunk
    os.waitpid(pid, 0)
    return json.loads(data)


def loader(policy, fence: bool):
    program = policy.compile_program(policy.build(False))

    def load():
        set_no_new_privs()
        if fence:
            policy.fence_for(os.getpid()).load()
        program.load()

    return load


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--compare", default="")
    args = parser.parse_args()
    rows = {"no filter": in_child(args.calls, lambda: None)}
    if args.compare:
        path = os.path.join(args.compare, "runtimes", "jail", "policy", "allowlist.py")
        if not os.path.exists(path):  # a release before the jail's layout (issue 39)
            path = os.path.join(args.compare, "runtimes", "jail", "seccomp_policy.py")
        spec = importlib.util.spec_from_file_location("other_seccomp_policy", path)
        other = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(other)
        rows[f"{args.compare}: allow-list"] = in_child(args.calls, loader(other, False))
        rows[f"{args.compare}: allow-list + fence"] = in_child(args.calls, loader(other, True))
    rows["this checkout: allow-list"] = in_child(args.calls, loader(allowlist, False))
    rows["this checkout: allow-list + fence"] = in_child(args.calls, loader(allowlist, True))
    print(f"{'ns per call':40}" + "".join(f"{name:>18}" for name in CALLS))
    for label, found in rows.items():
        print(f"{label:40}" + "".join(f"{found[name]:18.0f}" for name in CALLS))


if __name__ == "__main__":
    main()
