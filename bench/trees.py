"""What a materialized tree (the chroot mode) costs to build, to find again after a restart, and on disk.

For each runtime's tree on the given layers: the build where files can be hard-linked (the tree
on the layers' own filesystem), the build where every file is copied (the tree on another
filesystem, as when the data directory is a volume and the interpreter is in the image), the
fingerprint walk a restart pays to find the finished tree, and the disk each really takes
(blocks of the tree's own inodes: a hard link adds nothing but its directory entry).
As root; not run by CI.

    python bench/trees.py --python-layer DIR [--nodejs-layer DIR] [--copy-dir /dev/shm]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from runtimes.config import RuntimeConfig  # noqa: E402
from runtimes.jail.trees import materialized, tree_store  # noqa: E402
from runtimes.nodejs.runtime import NodeRuntime  # noqa: E402
from runtimes.python.runtime import PythonRuntime  # noqa: E402


def own_bytes(root: str) -> int:
    """Disk the tree adds: the blocks of every inode that only the tree holds (nlink 1, or made by it)."""
    total, seen = 0, set()
    for dirpath, dirnames, filenames in os.walk(root):
        total += os.lstat(dirpath).st_blocks * 512
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            info = os.lstat(os.path.join(dirpath, name))
            if info.st_ino in seen:
                continue
            seen.add(info.st_ino)
            if info.st_nlink == 1:  # a copy, a symlink or a node: the tree's own
                total += info.st_blocks * 512
    return total


def measure(name: str, spec: dict, parent: str) -> None:
    root = tempfile.mkdtemp(prefix="sandlot-bench-tree-", dir=parent)
    try:
        started = time.monotonic()
        done = materialized.materialize(spec, root)
        built = time.monotonic() - started
        started = time.monotonic()
        tree_store.fingerprint(spec, True)
        keyed = time.monotonic() - started
        copied = f"{done.copied_bytes / 2**20:.1f} MiB"
        print(
            f"| {name} | {parent} | {built:.2f} s | {done.linked} | {done.copied} | {copied} "
            f"| {own_bytes(root) / 2**20:.1f} MiB | {keyed * 1000:.0f} ms |"
        )
    finally:
        shutil.rmtree(root)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--python-layer", required=True)
    parser.add_argument("--nodejs-layer", default="")
    parser.add_argument("--link-dir", default="", help="a directory on the layers' filesystem (default: beside them)")
    parser.add_argument("--copy-dir", default="/dev/shm", help="a directory on another filesystem")
    args = parser.parse_args()
    specs = {"python3": PythonRuntime(RuntimeConfig(python_layer=args.python_layer)).tree().to_dict()}
    node = NodeRuntime(RuntimeConfig(nodejs_layer=args.nodejs_layer, nodejs_path=shutil.which("node") or ""))
    if not node.missing():
        specs["nodejs"] = node.tree().to_dict()
    link_dir = args.link_dir or os.path.dirname(os.path.dirname(os.path.abspath(args.python_layer)))
    print("| tree | built in | time | linked | copied | copied bytes | disk the tree adds | fingerprint (restart) |")
    print("|---|---|---|---|---|---|---|---|")
    for name, spec in specs.items():
        for parent in (link_dir, args.copy_dir):
            measure(name, spec, parent)


if __name__ == "__main__":
    main()
