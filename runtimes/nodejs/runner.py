"""Runs inside the Node.js zygote (a Python process) and its children.

A child confines itself like any other, limits its data segment (V8 reserves
far more address space than it uses, so RLIMIT_AS would not do), loads the
seccomp filter for its variant (network or not; the one filter that admits
execve, for node itself), and execs node on the wrapper. The tree holds no
other binary, and an exec of anything a run writes (where /tmp is not a noexec
tmpfs) stays under the same filter, uid and limits. node then warms up and
waits on stdin for the run.

The startup snapshot holds the zygote's hash seed, so no run may read it: the
zygote copies it into a sealed memfd before it enters the tree (where it is
not), and each child keeps that as SNAPSHOT_FD. Where there is a tree, the
child copies it (in the kernel: sendfile) into its own /tmp, readable by its
uid alone, closes the memfd and starts node from the copy; the wrapper removes
the copy before it reads the run. Without a tree node reads the memfd itself
(/proc/self/fd) and the wrapper closes it.
"""

from __future__ import annotations

import fcntl
import os
import resource
from collections.abc import Mapping
from dataclasses import dataclass, field

from runtimes.jail.policy import allowlist
from runtimes.nodejs.node_start import heap_flags
from runtimes.nodejs.runner_config import NodeRunnerConfig

MIB = 1024 * 1024
SETUP_FAILED = 125
REPORTS_EXIT = True  # the wrapper writes its exit status on fd 3 (the ready pipe) as it exits
PRIVATE_SNAPSHOT = ".sandlot-snapshot"  # in the run's TMPDIR; the wrapper knows this name: it removes the file
# the snapshot's memfd in a child: after stdin, stdout, stderr and the ready pipe (the zygote's child keeps kept_fds
# there, confine.py); closed before node starts unless node reads it (snapshot_by_fd: the wrapper knows this
# number and closes it)
SNAPSHOT_FD = 4


@dataclass
class State:
    filters: dict
    required: bool
    node: str
    wrapper: str
    cpu_seconds: int
    data_overhead_mb: int
    node_path: str
    node_flags: list[str]
    snapshot: str
    snapshot_flags: list[str]
    snapshot_memory_mb: int
    snapshot_by_fd: bool = False  # node reads the memfd itself (no tree); else each child copies it into its /tmp
    snapshot_size: int = 0
    report: dict = field(default_factory=dict)
    kept_fds: tuple[int, ...] = ()  # the zygote's descriptors each child keeps, from SNAPSHOT_FD on (loop.py)


def prepare(config: NodeRunnerConfig) -> State:
    filters, error = allowlist.prepared(config, allow_exec=True)
    state = State(
        filters=filters,
        required=config.require_seccomp,
        node=config.node,
        wrapper=config.wrapper,
        cpu_seconds=config.cpu_seconds,
        data_overhead_mb=config.data_overhead_mb,
        node_path=config.node_path,
        node_flags=list(config.node_flags),
        snapshot=config.snapshot,
        snapshot_flags=list(config.snapshot_flags),
        snapshot_memory_mb=config.snapshot_memory_mb,
        snapshot_by_fd=config.snapshot_by_fd,
    )
    # a memfd, not bytes of the zygote's heap: every fork copies the page table of that heap, and every exec
    # tears it down again
    if state.snapshot and (config.private_snapshot or config.snapshot_by_fd):
        state.kept_fds = (_sealed_copy(state.snapshot),)
        state.snapshot_size = os.fstat(state.kept_fds[0]).st_size
    state.report = {"seccomp": error is None, "seccomp_error": error}
    return state


def _sealed_copy(path: str) -> int:
    """A memfd holding the file at path, sealed against any change (close-on-exec: each child gets it as
    SNAPSHOT_FD, without that flag, from confine)."""
    fd = os.memfd_create("sandlot-snapshot", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    with open(path, "rb") as blob:
        view = memoryview(blob.read())
    while view:
        view = view[os.write(fd, view) :]
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL)
    return fd


def warm(state: State) -> dict:
    return {}


def as_pid_one(state: State) -> None:
    """Nothing: each child execs node at once, and node is no pid 1 of its own (runtimes/jail/zygote/runner.py)."""


def run(state: State, address_space: int, variant: Mapping) -> None:
    memory_mb = int(variant["memory_mb"])
    data = (memory_mb + state.data_overhead_mb) * MIB
    resource.setrlimit(resource.RLIMIT_DATA, (data, data))
    resource.setrlimit(resource.RLIMIT_CPU, (state.cpu_seconds, state.cpu_seconds + 1))
    if state.filters:
        state.filters[bool(variant["network"])].load()
    elif state.required:
        os.write(2, b"sandbox: seccomp filter unavailable\n")
        os._exit(SETUP_FAILED)
    blob = _snapshot_for(state) if memory_mb == state.snapshot_memory_mb else ""
    if state.kept_fds and not (blob and state.snapshot_by_fd):
        os.close(SNAPSHOT_FD)  # copied, or not started on it: the run must not find it open
    if blob:
        argv = [state.node, *state.node_flags, *state.snapshot_flags, "--snapshot-blob", blob]
    else:
        argv = [state.node, *state.node_flags, *heap_flags(memory_mb), state.wrapper]
    if state.node_path:
        argv.append(state.node_path)  # the layer's node_modules, where require() looks last
    os.execve(state.node, argv, dict(os.environ))


def _snapshot_for(state: State) -> str:
    """The snapshot's path for this child: the inherited memfd's where node reads it (snapshot_by_fd); else its
    own copy of it in its /tmp (the seed must stay hidden from every other run)."""
    if not state.kept_fds:
        return state.snapshot
    if state.snapshot_by_fd:
        return f"/proc/self/fd/{SNAPSHOT_FD}"
    private = os.path.join(os.environ.get("TMPDIR") or "/tmp", PRIVATE_SNAPSHOT)  # /tmp, or /tmp/<uid> (chroot)
    try:
        fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o400)
        try:
            copied = 0
            while copied < state.snapshot_size:
                sent = os.sendfile(fd, SNAPSHOT_FD, copied, state.snapshot_size - copied)
                if not sent:
                    raise OSError("the snapshot ended early")
                copied += sent
        finally:
            os.close(fd)
    except OSError:  # /tmp too small for it (an operator's choice): start on the plain wrapper
        try:
            os.unlink(private)
        except OSError:
            pass
        return ""
    return private
