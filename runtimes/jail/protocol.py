"""Messages between the service and a zygote, over a SOCK_SEQPACKET pair.

Both ends are trusted (the zygote never runs user code). User code never writes
to this channel: a child's output travels on its own pipes only.
"""

from __future__ import annotations

import json
import struct

FORK = b"F"  # service -> zygote: JSON {uid, tmpdir, variant}; fds: stdin_r, stdout_w, stderr_w, ready_w
FORKED = b"C"  # zygote -> service: pid; fds: pidfd
FORK_FAILED = b"E"  # zygote -> service: reason
EXITED = b"X"  # zygote -> service: pid, killed-by-signal flag, code or signal number
READY = b"R"  # zygote -> service: JSON report of the protections in force
NET_ATTACH = b"N"  # zygote -> service (before READY): pasta may come; fds: its user and network namespaces
NET_READY = b"n"  # service -> zygote: pasta has configured it
NET_FAILED = b"f"  # service -> zygote: reason it could not

MAX_MESSAGE = 65536
_PID_STATUS = struct.Struct("<iii")
_PID = struct.Struct("<i")


def fork_request(uid: int, tmpdir: str, variant: dict) -> bytes:
    """variant: what a runner must know before the run arrives (e.g. Node's network filter)."""
    return FORK + json.dumps({"uid": uid, "tmpdir": tmpdir, "variant": variant}).encode()


def parse_fork_request(body: bytes) -> tuple[int, str, dict]:
    request = json.loads(body)
    return int(request["uid"]), str(request["tmpdir"]), dict(request["variant"])


def forked(pid: int) -> bytes:
    return FORKED + _PID.pack(pid)


def exited(pid: int, signaled: bool, value: int) -> bytes:
    return EXITED + _PID_STATUS.pack(pid, int(signaled), value)


def parse_exited(body: bytes) -> tuple[int, bool, int]:
    pid, signaled, value = _PID_STATUS.unpack(body)
    return pid, bool(signaled), value


def parse_pid(body: bytes) -> int:
    return _PID.unpack(body)[0]


# What a child reads on its stdin: a little-endian length, the run's options as JSON, then
# the user's own stdin (left unread for the user's code). Written by the service only.
RUN_HEADER = struct.Struct("<I")


def run_input(options: dict, stdin: str) -> bytes:
    body = json.dumps(options).encode()
    return RUN_HEADER.pack(len(body)) + body + stdin.encode()


def ready(report: dict) -> bytes:
    return READY + json.dumps(report).encode()


# What a runner writes on the ready pipe (fd 3) as its run ends, before the process is gone: one
# byte, the exit status; or KILLED_BY and the signal number, for a run ended by a signal that it
# sent itself (a PID namespace's pid 1 is spared those: the runners' shims end it so). Anything else
# is no report. The child writes it: it can only end its own run early, as exiting would.
KILLED_BY = b"!"


def killed_by(signum: int) -> bytes:
    return KILLED_BY + bytes([signum & 0xFF])
