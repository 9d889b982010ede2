"""The role's credentials out of a runtime function's process, before anything else happens in it.

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
"""

from __future__ import annotations

import os
import sys

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


EARLY_HOOK = "import runtimes.function.credentials as _sandlot; _sandlot.early_hook()\n"  # a .pth line: site runs it


def early_hook() -> None:
    """Called by the image's .pth file as any interpreter of its venv starts: a Lambda runtime process (one the
    Runtime API is handed to) drops the credentials there and then; any other is left alone. A runtime
    function's process then starts its platform probe (runtimes/function/early.py) in a forked child, so that it runs
    beside awslambdaric's imports too, not only beside the function's own."""
    if "AWS_LAMBDA_RUNTIME_API" in os.environ:
        drop_credentials()
        if any(arg.startswith("runtimes.") and arg.endswith(".lambda_function.handler") for arg in sys.orig_argv):
            from runtimes.function import early

            early._start_probe()
