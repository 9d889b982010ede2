"""Dependency layers: a directory built from a requirements file, mounted read-only into the jail.

A layer's directory is named after a hash of its requirements and the
interpreter, so a changed file builds a new layer next to the old one and a
finished layer is never written again. A build goes to a scratch directory and
is renamed into place only when pip succeeded.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path

DEFAULT_PYTHON_REQUIREMENTS = Path(__file__).parent / "python" / "requirements.txt"
# dify-sandbox's location, honoured when present in the working directory
DIFY_PYTHON_REQUIREMENTS = Path("dependencies/python-requirements.txt")


class LayerBuildError(RuntimeError):
    pass


def python_requirements(configured: str = "") -> Path:
    if configured:
        return Path(configured)
    if DIFY_PYTHON_REQUIREMENTS.is_file():
        return DIFY_PYTHON_REQUIREMENTS
    return DEFAULT_PYTHON_REQUIREMENTS


def python_layer_dir(data_dir: str, requirements: Path, python: str) -> Path:
    digest = hashlib.sha256()
    digest.update(requirements.read_bytes())
    digest.update(os.path.realpath(python).encode())
    return Path(data_dir) / "layers" / "python" / digest.hexdigest()[:16]


def build_python_layer(requirements: Path, target: Path, mirror_url: str = "", quiet: bool = False) -> Path:
    """pip install --target into a scratch directory, then rename it into place."""
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(target.parent, 0o755)
    scratch = target.with_name(target.name + f".build-{os.getpid()}")
    shutil.rmtree(scratch, ignore_errors=True)
    command = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-compile"]
    command += ["--target", str(scratch), "-r", str(requirements)]
    if mirror_url:
        command += ["--index-url", mirror_url]
    if quiet:
        command.append("--quiet")
    print(f"sandlot: building the Python layer {target} from {requirements}", file=sys.stderr, flush=True)
    result = subprocess.run(command, stdout=sys.stderr if not quiet else subprocess.PIPE, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        shutil.rmtree(scratch, ignore_errors=True)
        output = result.stdout.decode(errors="replace")[-4000:] if result.stdout else ""
        raise LayerBuildError(f"pip failed with code {result.returncode}: {output}".strip())
    _make_readable(scratch)
    os.rename(scratch, target)
    return target


def _make_readable(root: Path) -> None:
    """Runs use other uids: the layer must be world-readable, and nothing in it writable."""
    for dirpath, _dirnames, filenames in os.walk(root):
        os.chmod(dirpath, 0o755)
        for name in filenames:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                mode = os.stat(path).st_mode
                os.chmod(path, 0o755 if mode & 0o111 else 0o644)


def installed(layer: str) -> list[dict[str, str]]:
    """The distributions in a layer, with the versions their metadata gives."""
    if not layer or not os.path.isdir(layer):
        return []
    found = {}
    for dist in importlib.metadata.distributions(path=[layer]):
        name = dist.metadata["Name"]
        if name:
            found[name.lower()] = {"name": name, "version": dist.version}
    return [found[key] for key in sorted(found)]
