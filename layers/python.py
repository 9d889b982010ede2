"""The Python layer: `pip install --target` from a requirements file."""

from __future__ import annotations

import importlib.metadata
import os
import sys
import sysconfig
from pathlib import Path

from layers import isolation
from layers.store import LayerBuildError

DEFAULT_REQUIREMENTS = Path(__file__).parent / "python" / "requirements.txt"
DIFY_REQUIREMENTS = Path("dependencies/python-requirements.txt")  # dify-sandbox's location


def requirements_file(configured: str = "") -> Path:
    if configured:
        return Path(configured).resolve()
    if DIFY_REQUIREMENTS.is_file():
        return DIFY_REQUIREMENTS.resolve()
    return DEFAULT_REQUIREMENTS


def build(requirements: Path, scratch: Path, build_uid: int, mirror_url: str = "", find_links: str = "") -> None:
    """pip install --target scratch, as an unprivileged user (see layers.isolation)."""
    argv = [
        os.path.join(sys.prefix, "bin", "python"),
        "-m",
        "pip",
        "install",
        "--no-cache-dir",
        "--no-compile",
        "--disable-pip-version-check",
        "--progress-bar",
        "off",
        "--target",
        str(scratch),
        "-r",
        str(requirements),
    ]
    readable = [sys.prefix, sys.base_prefix, sysconfig.get_paths()["platstdlib"], str(requirements.parent)]
    if mirror_url:
        argv += ["--index-url", mirror_url]
    if find_links:
        argv += ["--no-index", "--find-links", find_links]
        readable.append(find_links)
    readable += isolation.configured_paths([sys.executable, "-m", "pip", "config", "list"])
    env = {k: v for k, v in os.environ.items() if k.startswith("PIP_") or k.lower().endswith("_proxy")}
    env.update({"HOME": str(scratch), "LANG": "C.UTF-8", "PATH": "/usr/bin:/bin"})
    dynload = next((p for p in sys.path if p.endswith("lib-dynload")), "")
    result = isolation.run(argv, str(scratch), [*readable, dynload], env, build_uid)
    if result.returncode != 0:
        raise LayerBuildError(f"pip failed with code {result.returncode}: {_tail(result.stdout)}")


def _tail(output: bytes, limit: int = 4000) -> str:
    return output.decode(errors="replace")[-limit:].strip()


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
