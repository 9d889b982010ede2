"""The Node.js runner's part of the zygote's configuration (runtimes/jail/zygote_config.py).

A small module of its own: the service (runtime.py) fills it, the zygote (runner.py) reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

from runtimes.jail.zygote_config import RunnerConfig


@dataclass(frozen=True)
class NodeRunnerConfig(RunnerConfig):
    node: str = ""  # the node binary every run execs
    wrapper: str = ""  # the wrapper node runs, as runs see it
    cpu_seconds: int = 0  # RLIMIT_CPU of every run (the longest timeout, and one)
    data_overhead_mb: int = 256  # RLIMIT_DATA on top of the run's memory limit (V8's own)
    node_path: str = ""  # the layer's node_modules, as runs see it ("" for none)
    node_flags: tuple[str, ...] = ()  # more of node's options, every run (--preserve-symlinks: the layer's link)
    snapshot: str = ""  # the zygote's startup snapshot ("" for none: runs start on the plain wrapper)
    private_snapshot: bool = False  # each run gets its own copy (its seed must stay hidden; the tree holds none)
    # without a tree (landlock): node reads the snapshot from a sealed memfd the zygote made before confining
    # itself, inherited as SNAPSHOT_FD (/proc/self/fd/N: no data dir in node's command line, and the run's
    # domain leaves the data dir's snapshots out); the wrapper closes it before the run's code
    snapshot_by_fd: bool = False
    snapshot_flags: tuple[str, ...] = ()  # what node must be started with to load it
    snapshot_memory_mb: int = 0  # the heap limit it was built for
