"""What a child of a warm zygote costs before it runs a line: CPU and page copies, with the interpreter's
at-fork hooks as they are and made cheap (runtimes/jail/zygote/forkhooks.py).

    python bench/fork_cost.py [--layer DIR] [--forks 300]

Imports what a zygote imports (the dependency layer's modules with --layer, else threading, logging and
random, whose hooks every zygote of the default layer has), freezes the heap as the zygote does, then
forks children into a PID namespace (as root) or plainly, each reporting its CPU time and minor faults
at its first line, then exiting. Each variant runs in a fresh interpreter; the table gives medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import gc, importlib, os, resource, sys, time
sys.path[:0] = [{root!r}] + ([{layer!r}] if {layer!r} else [])
from runtimes.linux import syscalls as linux
from runtimes.linux import namespaces
from runtimes.jail.zygote.forkhooks import ForkHooks
from runtimes.python import runner
if {layer!r}:
    for name in runner.layer_modules({layer!r}):
        try:
            importlib.import_module(name)
        except Exception:
            pass
else:
    import logging, random, threading
hooks = ForkHooks()
if {quiet}:
    hooks.quiet()
gc.collect()
gc.freeze()
flags = linux.CLONE_NEWPID if os.geteuid() == 0 else 0
read, write = os.pipe()
for _ in range({forks}):
    pid = namespaces.fork_into(flags) if flags else os.fork()
    if pid == 0:
        hooks.restore()
        os.write(write, b"%d %d\n" % (time.process_time_ns(), resource.getrusage(0).ru_minflt))
        os._exit(0)
    os.waitpid(pid, 0)
    print(os.read(read, 100).decode(), end="")
"""


def measure(quiet: bool, layer: str, forks: int) -> tuple[float, float]:
    source = CHILD.format(root=ROOT, layer=layer, quiet=quiet, forks=forks)
    paths = [p for p in sys.path if p.endswith("site-packages")]
    env = {"PYTHONPATH": os.pathsep.join(paths), "PATH": os.environ.get("PATH", "")}
    out = subprocess.run([sys.executable, "-S", "-c", source], env=env, capture_output=True, text=True, check=True)
    rows = [tuple(map(int, line.split())) for line in out.stdout.splitlines()]
    return statistics.median(r[0] for r in rows) / 1000, statistics.median(r[1] for r in rows)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layer", default="", help="a Python layer directory whose modules to import")
    parser.add_argument("--forks", type=int, default=300)
    args = parser.parse_args()
    print(f"{'at-fork hooks':28s} {'child CPU to its first line':>28s} {'page faults':>12s}")
    for quiet in (False, True, False, True):
        cpu, faults = measure(quiet, args.layer, args.forks)
        print(f"{'made cheap' if quiet else 'as registered':28s} {cpu:25.0f} us {faults:12.0f}")


if __name__ == "__main__":
    main()
