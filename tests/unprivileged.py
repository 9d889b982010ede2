"""A whole service started as an unprivileged uid, as a developer without root would run it.

The pyenv interpreter under /root cannot be executed by another uid, so the
service runs on a venv made from Debian's /usr/bin/python3.11 in a world-readable
place, with the project's dependencies from pyproject.toml: built once, cached
under /var/cache/sandlot-tests (keyed by the dependency list), shared by every
test session and worktree (an flock serialises builds). Its data dir (layers) is
kept too, so layers are built once. Where the checkout itself is closed to other
uids (a clone in a mode-700 temp dir), the service runs on a copy of the
project's packages in a world-readable place, removed when the tests end.
"""

from __future__ import annotations

import atexit
import fcntl
import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
import tomllib

from service import Service

SYSTEM_PYTHON = "/usr/bin/python3.11"
NOBODY = 65534
CACHE = "/var/cache/sandlot-tests"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def unavailable() -> str:
    """Why an unprivileged service cannot be started here, or ""."""
    if os.geteuid() != 0:
        return "needs root to start a service as another uid"
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        return f"needs {SYSTEM_PYTHON} (an interpreter every uid can run)"
    return ""


def _dependencies() -> list[str]:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    # the lambda extra too: a stand-in service may be started with SANDLOT_BACKEND=lambda (boto3)
    return sorted([*project["dependencies"], *project["optional-dependencies"]["lambda"]])


def venv_python() -> str:
    """The cached venv's interpreter, built first if missing."""
    deps = _dependencies()
    key = hashlib.sha256("\n".join(deps).encode()).hexdigest()[:16]
    venv = os.path.join(CACHE, f"venv-{key}")
    python = os.path.join(venv, "bin", "python")
    os.makedirs(CACHE, mode=0o755, exist_ok=True)
    with open(os.path.join(CACHE, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(os.path.join(venv, ".complete")):
            shutil.rmtree(venv, ignore_errors=True)
            old = os.umask(0o022)
            try:
                subprocess.run([SYSTEM_PYTHON, "-m", "venv", venv], check=True)
                subprocess.run([python, "-m", "pip", "install", "-q", *deps], check=True)
            finally:
                os.umask(old)
            open(os.path.join(venv, ".complete"), "w").close()  # noqa: SIM115
    return python


def data_dir(name: str) -> str:
    """A data dir the unprivileged service owns, kept between sessions (its layers are built once)."""
    base = os.environ.get("SANDLOT_DATA_DIR", "/var/lib/sandlot")
    path = f"{base}-uid{NOBODY}-{name}"
    os.makedirs(path, mode=0o755, exist_ok=True)
    os.chown(path, NOBODY, NOBODY)
    return path


PACKAGES = ("handler", "runtimes", "layers")
_copies: list[str] = []


def _open_to_others(path: str) -> bool:
    """Whether another uid can reach path: every directory on the way searchable by others."""
    while True:
        if not os.stat(path).st_mode & stat.S_IXOTH:
            return False
        parent = os.path.dirname(path)
        if parent == path:
            return True
        path = parent


def source() -> str:
    """The project's packages where nobody can read them: the checkout itself, or a copy of it."""
    if _open_to_others(ROOT):
        return ROOT
    if not _copies:
        os.makedirs(CACHE, mode=0o755, exist_ok=True)
        copy = tempfile.mkdtemp(prefix="src-", dir=CACHE)
        os.chmod(copy, 0o755)
        for package in PACKAGES:
            shutil.copytree(
                os.path.join(ROOT, package), os.path.join(copy, package), ignore=shutil.ignore_patterns("__pycache__")
            )
        _copies.append(copy)
        atexit.register(shutil.rmtree, copy, ignore_errors=True)
    return _copies[0]


def service(**env: str) -> Service:
    """A Service (not started) that runs as nobody on the cached venv."""
    env.setdefault("SANDLOT_DATA_DIR", data_dir("service"))
    env.setdefault("HOME", "/nonexistent")
    svc = Service(cwd="/", **env)
    svc.python = venv_python()
    svc.source = source()
    svc.user = NOBODY
    return svc
