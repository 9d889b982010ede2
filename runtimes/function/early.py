"""The first steps of a runtime function's init, before its heavy imports (the standard library and the probe).

1. The role's credentials out of the process (`drop_credentials`, below): a no-op where the image's early hook
   (infra/layout.sh's `sandlot-early.pth`) already did it, before awslambdaric was even imported.
2. The platform probe (linux/protections.py) starts while the process is still small and single-threaded
   (in the image, as the interpreter starts, from the same early hook, before awslambdaric is imported):
   a forked child of this process runs it (each mechanism in a throwaway child of its own, as always) and
   writes the record to a pipe, while this process goes on with its imports. The child has this process's
   credentials, namespaces, filters and limits, so its record is the one this process would have probed;
   `record()` reads it and makes it this process's record (the one platform_protections() returns, which
   the runtime's start and the function read). If the child gives no record, this process probes itself.
3. Then the first zygote's interpreter starts (jail/zygote_start.py's `start_ahead`): as the runtime's start would
   start it (the interpreter and environment the settings give, the language's runner), it imports the
   zygote's modules while this process imports its own, and waits for its config, which the runtime's start
   writes to it once the mode is chosen (the zygote's confinement follows the config, as always). A start
   that asks for another interpreter, environment or runner kills it and starts its own; so does the
   function's init when its runtime did not take it.
4. asyncio is imported without ssl (`_asyncio_without_tls`).

## The role's credentials

Lambda puts them in the runtime client's environment, and /proc/<pid>/environ of
a same-uid process keeps the original block even after unsetenv. So the process
re-executes itself, the very same command, without them: the new image's
environment block never held them. A runtime function needs none (its role has
nothing beyond its logs, which go to stdout). Standard library only, so that it
runs first and cheaply, before the heavy imports of init.

In the image they never reach it: the Dockerfiles' ENTRYPOINT is env(1), which
drops them and execs the interpreter (ENTRYPOINT_PREFIX), so that the function's
process starts one interpreter, as a bare function's does (a re-exec cost a
second bare start, about 7 ms). Should a Lambda runtime process of the image's
venv be started any other way, infra/layout.sh's `.pth` file (EARLY_HOOK) calls
`early_hook()` while the interpreter starts, before awslambdaric is imported,
and the re-exec happens there, the replaced process having done nothing but
start. (Wiping the
credentials in place instead would leave copies: the environment block that
/proc/<pid>/environ reads, and the interpreter's own copies in its heap, which a
same-uid process may read through /proc/<pid>/mem where the platform allows it.)

Standard library only, its imports inside the functions that need them: every interpreter of the image's venv
imports this module (EARLY_HOOK).
"""

from __future__ import annotations

import os
import sys
import time

CREDENTIALS = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
)


# The image's ENTRYPOINT before the interpreter (runtimes/*/Dockerfile; tests/lambda keep them equal)
ENTRYPOINT_PREFIX = ("/usr/bin/env", *(arg for name in CREDENTIALS for arg in ("-u", name)))


def drop_credentials() -> None:
    """Re-exec this very command without the credentials in its environment (no-op once they are gone)."""
    if not any(name in os.environ for name in CREDENTIALS):
        return
    env = {k: v for k, v in os.environ.items() if k not in CREDENTIALS}
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


EARLY_HOOK = "import runtimes.function.early as _sandlot; _sandlot.early_hook()\n"  # a .pth line: site runs it


def early_hook() -> None:
    """Called by the image's .pth file as any interpreter of its venv starts: a Lambda runtime process (one the
    Runtime API is handed to) drops the credentials there and then; any other is left alone. A runtime
    function's process then starts its platform probe (below) in a forked child, so that it runs
    beside awslambdaric's imports too, not only beside the function's own."""
    if "AWS_LAMBDA_RUNTIME_API" in os.environ:
        drop_credentials()
        if _handler_package():
            _start_probe()  # first: forked while the process is smallest (each of its children copies less)
            _start_zygote_ahead()


probe_seconds = float("nan")  # from the probe's start to its record being read (nan: not probed here)
imports_started = float("nan")  # time.monotonic() as the handler module began its imports (first_steps)
_ahead_tried = False
_probe: tuple[int, int, float] | None = None  # (pid, read end, started)
_started = False


def first_steps() -> None:
    """The handler module's first call (a no-op for what the image's early hook already did)."""
    global imports_started
    imports_started = time.monotonic()
    drop_credentials()
    _start_probe()
    _start_zygote_ahead()
    _asyncio_without_tls()


def _asyncio_without_tls() -> None:
    """asyncio (the function's next import: the runtime runs on it), imported without ssl, which asyncio imports
    only to offer TLS: this process makes no TLS connection (awslambdaric's client is a C extension of its own,
    the runs' network is theirs), and ssl with libssl and libcrypto costs about 5 ms of CPU on every cold
    start. Only this process's asyncio goes without TLS; an `import ssl` elsewhere still works."""
    if "asyncio" in sys.modules or "ssl" in sys.modules:
        return
    sys.modules["ssl"] = None  # type: ignore[assignment] - `import ssl` raises ImportError: asyncio's ssl is None
    try:
        import asyncio  # noqa: F401
    finally:
        if "ssl" in sys.modules and sys.modules["ssl"] is None:
            del sys.modules["ssl"]


def _handler_package() -> str:
    """`runtimes.<language>` where this process is a runtime function's (awslambdaric's handler argument)."""
    for arg in sys.orig_argv:
        if arg.startswith("runtimes.") and arg.endswith(".lambda_function.handler"):
            return arg.removesuffix(".lambda_function.handler")
    return ""


def _start_zygote_ahead() -> None:
    """The first zygote's interpreter, started now (jail/zygote_start.py), so that its start and imports run beside
    this process's: as it will be started (the interpreter and environment the settings give, the language's
    runner), its config to come once the runtime has chosen its mode. Where the settings need the model to be
    read, or anything here fails, the runtime's start starts its zygote as usual (and says why, if it cannot)."""
    global _ahead_tried
    package = _handler_package()
    if _ahead_tried or not package:
        return
    _ahead_tried = True
    try:
        from runtimes.config import RuntimeConfig, proxy_environment
        from runtimes.function.environment import light_environment
        from runtimes.jail import zygote_start

        settings = light_environment()
        if settings is not None:
            env = RuntimeConfig(run_env=proxy_environment(settings)).environment()  # as the runtime's would be
            zygote_start.start_ahead(settings.PYTHON_PATH, env, f"{package}.runner")
    except Exception:  # noqa: BLE001 - the usual start instead
        return


def _start_probe() -> None:
    global _probe, _started
    if _started:
        return  # once per process: the image's early hook may have started it already (early_hook)
    import threading

    if threading.active_count() > 1:
        return  # forking now could copy another thread's held locks: probed in process, later
    _started = True
    import json

    from runtimes.linux import protections

    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            os.close(read_end)
            _close_zygote_ahead()  # its config pipe and channel are this process's, not the probe's
            data = json.dumps(protections.probe().to_dict()).encode()
            while data:
                data = data[os.write(write_end, data) :]
        finally:
            os._exit(0)
    os.close(write_end)
    _probe = (pid, read_end, started)


def _close_zygote_ahead() -> None:
    started = sys.modules.get("runtimes.jail.zygote_start")
    if started is not None:
        started.close_inherited()


def record() -> None:
    """Wait for the early probe's record and make it this process's (a no-op if none was started)."""
    global _probe, probe_seconds
    if _probe is None:
        return
    (pid, read_end, started), _probe = _probe, None
    import json

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
