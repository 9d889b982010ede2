"""Messages between the service and a zygote, over a SOCK_SEQPACKET pair.

Both ends are trusted (the zygote never runs user code). User code never writes
to this channel: a child's output travels on its own pipes only.
"""

from __future__ import annotations

import json
import struct

FORK = b"F"  # service -> zygote: uid, tmpdir; fds: stdin_r, stdout_w, stderr_w
FORKED = b"C"  # zygote -> service: pid; fds: pidfd
FORK_FAILED = b"E"  # zygote -> service: reason
EXITED = b"X"  # zygote -> service: pid, killed-by-signal flag, code or signal number
READY = b"R"  # zygote -> service: JSON report of the protections in force

MAX_MESSAGE = 65536
_PID_STATUS = struct.Struct("<iii")
_UID = struct.Struct("<i")


def fork_request(uid: int, tmpdir: str) -> bytes:
    return FORK + _UID.pack(uid) + tmpdir.encode()


def parse_fork_request(body: bytes) -> tuple[int, str]:
    (uid,) = _UID.unpack_from(body)
    return uid, body[_UID.size :].decode()


def forked(pid: int) -> bytes:
    return FORKED + _UID.pack(pid)


def exited(pid: int, signaled: bool, value: int) -> bytes:
    return EXITED + _PID_STATUS.pack(pid, int(signaled), value)


def parse_exited(body: bytes) -> tuple[int, bool, int]:
    pid, signaled, value = _PID_STATUS.unpack(body)
    return pid, bool(signaled), value


def parse_pid(body: bytes) -> int:
    return _UID.unpack(body)[0]


def ready(report: dict) -> bytes:
    return READY + json.dumps(report).encode()
