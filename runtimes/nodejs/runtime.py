"""The Node.js runtime: jailed node processes spawned ahead of demand, each used for one run."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import stat
import subprocess
from typing import TYPE_CHECKING

from runtimes.jail import modes, protocol
from runtimes.jail.policy import network_access, tree_files
from runtimes.jail.service.pool import MAIN
from runtimes.jail.service.runtime import JailedRuntime
from runtimes.jail.service.supervisor import ZygoteHandle
from runtimes.linux import rootfs
from runtimes.nodejs import snapshot
from runtimes.nodejs.node_start import WRAPPER, WRAPPER_IN_TREE
from runtimes.nodejs.runner_config import NodeRunnerConfig

if TYPE_CHECKING:
    from runtimes.payload import RunRequest

log = logging.getLogger("sandlot.nodejs")


class NodeRuntime(JailedRuntime):
    language = "nodejs"
    runner = "runtimes.nodejs.runner"

    def __init__(self, config):
        super().__init__(config)
        self.snapshot: snapshot.Snapshot | None = None  # the newest zygote's, for the default memory limit
        self._snapshots = snapshot.SnapshotDirectory(os.path.join(config.data_dir, "snapshots"))
        self._snapshot_of: dict[ZygoteHandle, snapshot.Snapshot] = {}
        # one run at a time (a Lambda function): the first zygote starts on the image's baked snapshot, if it
        # has one for this node (snapshot.py: loaded with rehashing), instead of waiting for a build; the
        # serial schedule replaces it once the first run is over, and from then on each zygote builds its own
        self.first_run_apart = config.one_run_at_a_time

    async def start(self) -> None:
        if not self.missing() and not self.refused:
            try:
                await asyncio.to_thread(self._snapshots.open)
            except OSError as exc:  # e.g. a data dir another uid made: runs refused saying so, never "starting"
                self.refused = f"the startup snapshots' directory cannot be used: {exc}"
        await super().start()

    async def start_zygote(self, kind: str = MAIN) -> ZygoteHandle:
        """Each zygote starts on a snapshot of its own (a hash seed of its own, see snapshot.py); a function's
        first, on the baked one where the image has it (rehashed at load: a seed of its own for every run)."""
        if self.first_run_apart:
            baked = await asyncio.to_thread(snapshot.baked, self.node, WRAPPER, self.config.default_memory_mb)
            if baked is not None:
                self.snapshot = baked
                return await super().start_zygote(kind)  # not in _snapshot_of: the image's file stays
        fresh = None
        tree_root = ""  # the chroot jail's tree, held while the snapshot is built with its node
        if self.provisions.trees is not None:
            tree_root = await asyncio.to_thread(
                self.provisions.hold_tree, self.tree().to_dict(), self.tree(layer=False).to_dict()
            )
        try:
            try:
                fresh = await asyncio.to_thread(
                    snapshot.build,
                    self._node_in(tree_root),
                    WRAPPER,
                    self.config.default_memory_mb,
                    self._snapshots.next_path(),
                    cache_dir=self.config.data_dir,
                )
            except (OSError, subprocess.SubprocessError) as exc:  # slower starts, nothing worse
                log.warning("no startup snapshot for node: %s", exc)
            self.snapshot = fresh  # what zygote_config() hands the new zygote
            try:
                zygote = await super().start_zygote(kind)
            except BaseException:
                if fresh:
                    self._snapshots.remove(fresh.path)
                raise
        finally:
            if tree_root:
                await asyncio.to_thread(self.provisions.release_tree, tree_root)
        if fresh:
            self._snapshot_of[zygote] = fresh
        return zygote

    def _node_in(self, tree_root: str) -> str:
        """The node binary to build a snapshot with: the tree's own where it is a copy (the chroot jail on a
        container's overlayfs, jail/trees/), the one every run execs, so that the page cache holds one node binary
        (about 65 MB of it), not the image's too; else the image's."""
        if tree_root:
            copy = tree_root + os.path.realpath(self.node)
            with contextlib.suppress(OSError):
                if stat.S_ISREG(os.lstat(copy).st_mode) and not os.path.samefile(copy, self.node):
                    return copy
        return self.node

    def zygote_retired(self, zygote: ZygoteHandle) -> None:
        super().zygote_retired(zygote)
        retired = self._snapshot_of.pop(zygote, None)
        if retired:
            self._snapshots.remove(retired.path)

    async def stop(self) -> None:
        await super().stop()
        self._snapshot_of.clear()
        self._snapshots.close()

    def status(self) -> dict:
        if self.snapshot is None:
            kind = "none"  # runs start on the plain wrapper
        else:
            kind = "own seed, no rehash" if snapshot.NO_REHASH in self.snapshot.flags else "rehashed at load"
        return {**super().status(), "startup_snapshot": kind}

    @property
    def node(self) -> str:
        return os.path.realpath(self.config.nodejs_path)

    def missing(self) -> str:
        if not os.access(self.node, os.X_OK):
            return f"node is not installed at {self.config.nodejs_path} (NODEJS_PATH)"
        return ""

    def interpreter(self) -> str:
        return self.config.python_path  # the zygote is Python; its children exec node

    def tree(self, layer: bool = True) -> rootfs.TreeSpec:
        """The chroot mode's tree; without layer, the same but for the layer (the image's layer-less tree)."""
        spec = rootfs.TreeSpec()
        spec.add(self.node)
        spec.place(WRAPPER_IN_TREE, WRAPPER)
        if layer and self.config.nodejs_layer:
            spec.place(tree_files.LAYER_IN_TREE, self.config.nodejs_layer)  # fixed: no data dir in view
        spec.add(*rootfs.shared_libraries([self.node]))
        tree_files.run_system_files(spec, self.run_hostname(), self.run_nameservers())
        return spec

    def runner_config(self, kind: str = MAIN) -> NodeRunnerConfig:
        shot = self.snapshot
        layer = self.layer_in_view() if self.config.nodejs_layer else ""
        return NodeRunnerConfig(
            **self.runner_fields(),
            node=self.node,
            wrapper=WRAPPER_IN_TREE if self.mode.tree != modes.NO_TREE else WRAPPER,
            snapshot=shot.path if shot else "",
            private_snapshot=self.mode.tree != modes.NO_TREE,  # each run its own copy, the tree none (runner.py)
            # no tree (landlock): a sealed memfd the zygote made, by /proc/self/fd: a run's domain leaves the data
            # dir's snapshots out, and node's command line names none of it
            snapshot_by_fd=self.mode.tree == modes.NO_TREE,
            snapshot_flags=tuple(shot.flags) if shot else (),
            snapshot_memory_mb=shot.memory_mb if shot else 0,
            cpu_seconds=math.ceil(self.config.max_timeout) + 1,
            node_path=os.path.join(layer, "node_modules") if layer else "",
            # the layer by its link (landlock): node resolves modules by their real path, unless told not to
            node_flags=("--preserve-symlinks",) if layer and layer != self.layer() and os.path.islink(layer) else (),
        )

    def layer(self) -> str:
        return self.config.nodejs_layer

    def set_layer(self, path: str) -> None:
        self.config.nodejs_layer = path

    def variant(self, request: RunRequest) -> tuple:
        return (("memory_mb", self.config.clamp_memory(request.memory_limit_mb)), ("network", request.enable_network))

    def ready_targets(self) -> dict[tuple, int]:
        # Dify asks for network on every run: most ready nodes are of that kind (where runs get network)
        memory = ("memory_mb", self.config.default_memory_mb)
        if self.run_network.kind in (network_access.NONE, network_access.REFUSED):
            return {(memory, ("network", False)): self.config.workers}
        return {(memory, ("network", True)): self.config.workers, (memory, ("network", False)): 1}

    def idle_targets(self) -> dict[tuple, int]:
        # A ready node holds about 10 MiB of its own and keeps the node binary's 27 MiB resident: an idle
        # service keeps none (the first run after 20 s without one starts its node, about 20 ms more).
        return {}

    def encode(self, request: RunRequest, timeout: float, network_refused: str = "") -> bytes:
        run = {"code": request.code}
        if network_refused:
            run["network_refused"] = network_refused  # the wrapper words the refusal of net, dgram and dns
        if self.mode.tmp_note:  # /tmp is not the run's own: its error printing says where to write (wrapper.js)
            run["tmp_note"] = self.mode.tmp_note
        return protocol.run_input(run, request.stdin)
