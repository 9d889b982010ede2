"""Messages between the service and a zygote, over a SOCK_SEQPACKET pair.

Both ends are trusted (the zygote never runs user code). User code never writes
to this channel: a child's output travels on its own pipes only.

A fork request is packed, not JSON: the zygote reads one before every fork, and
every page of the warm interpreter it writes on the way (the json module's,
the dicts and strings a decode makes) is copied again after each fork, since
the last child shares it. With a fixed header and the variant's few distinct
values decoded once, a fork cycle copies 143 pages instead of 168 (the default
layer's zygote, 4 clients).
"""

from __future__ import annotations

import json
import struct
from types import MappingProxyType

from runtimes.linux import namespaces

FORK = b"F"  # service -> zygote: uid, tmpdir, variant (see fork_request); fds: stdin_r, stdout_w, stderr_w, ready_w
FORKED = b"C"  # zygote -> service: pid; fds: pidfd
FORK_FAILED = b"E"  # zygote -> service: reason
EXITED = b"X"  # zygote -> service: pid, killed-by-signal flag, code or signal number
READY = b"R"  # zygote -> service: JSON report of the protections in force
# zygote -> service (before READY): pasta may come, fds: its user and network namespaces; service -> zygote:
# pasta has configured it, or the reason it could not. The bytes of runtimes/linux/namespaces.py's join_network,
# which the layer builds speak too
NET_ATTACH, NET_READY, NET_FAILED = namespaces.NET_ATTACH, namespaces.NET_READY, namespaces.NET_FAILED

MAX_MESSAGE = 65536
_PID_STATUS = struct.Struct("<iii")
_PID = struct.Struct("<i")


_FORK_HEAD = struct.Struct("<IH")  # uid, length of the tmpdir's bytes; then the tmpdir, then the variant's JSON
_VARIANTS_KEPT = 32  # distinct variants decoded once (a runtime has a handful: network or not, a memory limit)
_variants: dict[bytes, MappingProxyType] = {}


def fork_request(uid: int, tmpdir: str, variant: dict) -> bytes:
    """variant: what a runner must know before the run arrives (e.g. Node's network filter)."""
    path = tmpdir.encode()
    return FORK + _FORK_HEAD.pack(uid, len(path)) + path + json.dumps(variant, sort_keys=True).encode()


def parse_fork_request(body: bytes) -> tuple[int, str, MappingProxyType]:
    """uid, tmpdir and the variant (read-only: the same object for every request that names it)."""
    uid, size = _FORK_HEAD.unpack_from(body)
    start = _FORK_HEAD.size + size
    if len(body) < start:
        raise ValueError("a fork request cut short")
    tmpdir = body[_FORK_HEAD.size : start].decode()
    key = body[start:]
    variant = _variants.get(key)
    if variant is None:
        variant = MappingProxyType(dict(json.loads(key)))
        if len(_variants) < _VARIANTS_KEPT:
            _variants[key] = variant
    return uid, tmpdir, variant


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
