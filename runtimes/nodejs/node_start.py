"""How node is started for a run: the wrapper it runs and its heap flags.

Shared by the runtime (the tree places the wrapper), the snapshot builder (it
builds on the wrapper with these flags) and the runner (it execs node with
them): a leaf module, so that none of them imports another for it and the
zygote imports nothing more than this.
"""

from __future__ import annotations

import os

WRAPPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "wrapper.js")
WRAPPER_IN_TREE = "/opt/sandlot/wrapper.js"  # wherever the package is installed (even under /tmp)


def heap_flags(memory_mb: int) -> list[str]:
    return [f"--max-old-space-size={memory_mb}"]
