"""A V8 startup snapshot of the warmed-up wrapper, built once per node binary, wrapper and heap size.

Any V8 flag (the heap limit is one) makes node reject its built-in code cache
and compile its own modules again at every start: about 5 ms of CPU per run
here. A snapshot built with the same flags carries that work, and the
wrapper's warm-up, already done. It must be started with exactly the flags it
was built with, so it serves the default memory limit; other limits start
node on the plain wrapper.
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
from pathlib import Path

log = logging.getLogger("sandlot.nodejs")


def heap_flags(memory_mb: int) -> list[str]:
    return [f"--max-old-space-size={memory_mb}"]


def build(node: str, wrapper: str, memory_mb: int, directory: str) -> str:
    """The snapshot file for these, built if missing; "" if node cannot build one."""
    stat = os.stat(node)
    digest = hashlib.sha256(f"{os.path.realpath(node)}:{stat.st_size}:{stat.st_mtime_ns}:{memory_mb}".encode())
    digest.update(Path(wrapper).read_bytes())
    target = Path(directory) / f"node-{digest.hexdigest()[:16]}.blob"
    if target.is_file():
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = target.with_suffix(f".{os.getpid()}.tmp")
    command = [node, *heap_flags(memory_mb), "--snapshot-blob", str(scratch), "--build-snapshot", wrapper]
    result = subprocess.run(command, env={"LANG": "C.UTF-8"}, cwd="/", capture_output=True, text=True, timeout=120)
    if result.returncode != 0 or not scratch.is_file():
        log.warning("node could not build a startup snapshot; runs start on the plain wrapper: %s", result.stderr)
        scratch.unlink(missing_ok=True)
        return ""
    os.chmod(scratch, 0o644)
    os.rename(scratch, target)
    return str(target)
