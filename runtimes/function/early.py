"""The first steps of a runtime function's init, before its heavy imports (the standard library and the probe).

1. The role's credentials out of the process (credentials.py): a no-op where the image's early hook
   (infra/layout.sh's `sandlot-early.pth`) already did it, before awslambdaric was even imported.
2. The platform probe (linux/protections.py) starts while the process is still small and single-threaded
   (in the image, as the interpreter starts, from the same early hook, before awslambdaric is imported):
   a forked child of this process runs it (each mechanism in a throwaway child of its own, as always) and
   writes the record to a pipe, while this process goes on with its imports. The child has this process's
   credentials, namespaces, filters and limits, so its record is the one this process would have probed;
   `record()` reads it and makes it this process's record (the one platform_protections() returns, which
   the runtime's start and the function read). If the child gives no record, this process probes itself.
"""

from __future__ import annotations

import json
import os
import threading
import time

from runtimes.function.credentials import drop_credentials

probe_seconds = float("nan")  # from the probe's start to its record being read (nan: not probed here)
_probe: tuple[int, int, float] | None = None  # (pid, read end, started)
_started = False


def first_steps() -> None:
    drop_credentials()
    _start_probe()


def _start_probe() -> None:
    global _probe, _started
    if _started:
        return  # once per process: the image's early hook may have started it already (credentials.early_hook)
    if threading.active_count() > 1:
        return  # forking now could copy another thread's held locks: probed in process, later
    _started = True
    from runtimes.linux import protections

    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            os.close(read_end)
            data = json.dumps(protections.probe().to_dict()).encode()
            while data:
                data = data[os.write(write_end, data) :]
        finally:
            os._exit(0)
    os.close(write_end)
    _probe = (pid, read_end, started)


def record() -> None:
    """Wait for the early probe's record and make it this process's (a no-op if none was started)."""
    global _probe, probe_seconds
    if _probe is None:
        return
    (pid, read_end, started), _probe = _probe, None
    from runtimes.linux import protections

    chunks = []
    try:
        while chunk := os.read(read_end, 65536):
            chunks.append(chunk)
    finally:
        os.close(read_end)
    _, status = os.waitpid(pid, 0)
    try:
        found = protections.Protections.from_dict(json.loads(b"".join(chunks)))
    except (ValueError, TypeError):
        return  # killed, or no answer: platform_protections() probes in this process
    if os.waitstatus_to_exitcode(status) != 0:
        return
    with protections._probing:
        if protections._cached is None:
            protections._cached = found
    probe_seconds = time.monotonic() - started
