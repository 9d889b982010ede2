"""The role's credentials out of a runtime function's process, before anything else happens in it.

Lambda puts them in the runtime client's environment, and /proc/<pid>/environ of
a same-uid process keeps the original block even after unsetenv. So the process
re-executes itself, the very same command, without them: the new image's
environment block never held them. A runtime function needs none (its role has
nothing beyond its logs, which go to stdout). Standard library only, so that it
runs first and cheaply, before the heavy imports of init.

In the image it runs even earlier: infra/layout.sh puts a `.pth` file in the
venv (EARLY_HOOK) that calls `early_hook()` while the interpreter starts, before
awslambdaric is imported, so that the process that is replaced has done nothing
but start. What remains of the re-exec is one bare interpreter start. (Wiping the
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


def drop_credentials() -> None:
    """Re-exec this very command without the credentials in its environment (no-op once they are gone)."""
    if not any(name in os.environ for name in CREDENTIALS):
        return
    env = {k: v for k, v in os.environ.items() if k not in CREDENTIALS}
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


EARLY_HOOK = "import runtimes.credentials as _sandlot; _sandlot.early_hook()\n"  # a .pth line: site runs it


def early_hook() -> None:
    """Called by the image's .pth file as any interpreter of its venv starts: a Lambda runtime process (one the
    Runtime API is handed to) drops the credentials there and then; any other is left alone."""
    if "AWS_LAMBDA_RUNTIME_API" in os.environ:
        drop_credentials()
