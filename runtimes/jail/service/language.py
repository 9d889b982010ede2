"""What a language declares to the jail: the hooks its runtime (a JailedRuntime) overrides.

The base (runtime.py) calls these and nothing else of a language; a language
overrides these, and extends the life cycle hooks listed in JailedRuntime's
docstring, calling the base's.
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING

from runtimes.config import RuntimeConfig
from runtimes.jail import modes
from runtimes.jail.policy import landlock_mode, network_access
from runtimes.jail.policy.tree_files import LAYER_IN_TREE
from runtimes.jail.service import health
from runtimes.jail.service.pool import MAIN
from runtimes.jail.service.provisions import PLATFORM_NETWORK, Provisions
from runtimes.jail.zygote_config import RunnerConfig, ZygoteConfig, import_paths
from runtimes.linux.egress import resolvers
from runtimes.linux.protections import Protections
from runtimes.linux.rootfs import TreeSpec
from runtimes.payload import RequestFields

if TYPE_CHECKING:
    from runtimes.payload import RunRequest


class LanguageHooks:
    language = ""  # the name runs ask for (python3, nodejs)
    runner = ""  # the runner module's name, imported by the zygote (zygote/runner.py's Runner)
    config: RuntimeConfig
    platform: Protections | None
    mode: modes.Mode | None
    provisions: Provisions | None
    first_run_apart: bool  # the serial schedule's first run has a zygote of its own (runtime.py)

    def interpreter(self) -> str:
        raise NotImplementedError

    def missing(self) -> str:
        """Why this runtime cannot exist on this machine (e.g. no node), or ""."""
        return ""

    def tree(self, layer: bool = True) -> TreeSpec:
        """The chroot mode's tree of this runtime's runs; without layer, the same without the dependency layer
        (and what only it needs): the image's layer-less tree (trees/image_trees.py)."""
        raise NotImplementedError

    def readable(self) -> list[str]:
        """The landlock mode: what a run may read and execute (landlock_mode.py)."""
        return landlock_mode.readable(self.tree())

    def zygote_kinds(self) -> tuple[str, ...]:
        """The kinds of zygote this runtime keeps (pool.py), the first started first."""
        return (MAIN,)

    def runner_config(self, kind: str = MAIN) -> RunnerConfig:
        """The runner's part of a new zygote's config; a language returns its own subclass, from these fields."""
        return RunnerConfig(**self.runner_fields())

    def runner_fields(self) -> dict:
        """The fields every runner's config has (zygote_config.RunnerConfig)."""
        return {
            "require_seccomp": self.config.require_seccomp,
            "extra_syscalls": tuple(self.config.extra_syscalls),
            "seccomp": bool(self.platform is None or self.platform.seccomp),  # allowlist.prepared
            "refuse_links": self.links_refused,
        }

    @property
    def links_refused(self) -> bool:
        """Runs get EPERM from link(2): in the chroot mode every run's cell holds hard links to the tree's files,
        on the filesystem of its own /tmp, and where fs.protected_hardlinks is 0 nothing else keeps a run from
        linking them there (their link count would then tell every other run what this one does)."""
        return (
            self.mode is not None
            and self.mode.tree == modes.CHROOT
            and self.platform is not None
            and not self.platform.protected_hardlinks
        )

    def encode(self, request: RunRequest, timeout: float, network_refused: str = "") -> bytes:
        """What the child reads on stdin for this run (timeout: the run's own, already capped; network_refused:
        why a run that asked for network has none, for its socket calls to say)."""
        raise NotImplementedError

    def variant(self, request: RunRequest) -> tuple:
        """Which kind of child a run needs (the runner learns the rest from stdin)."""
        return ()

    def ready_targets(self) -> dict[tuple, int]:
        """How many children of each variant to keep ready."""
        return {(): self.config.workers}

    def idle_targets(self) -> dict[tuple, int]:
        """How many to keep ready once the service is idle (schedule.py): one of the kind most runs need."""
        return {self.default_variant(): 1}

    def park_targets(self) -> dict[tuple, float]:
        """Variants whose zygote is parked (stopped) after this many seconds without a run (schedule.py): none."""
        return {}

    def default_variant(self) -> tuple:
        """The kind of child most runs need (Dify asks for network on every run)."""
        return self.variant(RequestFields(language=self.language, code="", enable_network=True))

    # ---- its dependency layer

    def layer_in_view(self) -> str:
        """The layer's path as runs see it: in a tree, where the tree places it (tree.LAYER_IN_TREE, whatever the
        data dir); without one but with a parent for the runs' directories (landlock), a link to it there,
        `<runs' parent>/layer-<the layer's name>` (layer_link): modules' paths, sys.path and tracebacks name no data
        dir; without either (Lambda), its own."""
        layer = self.layer()
        if layer and self.mode.tree != modes.NO_TREE:
            return LAYER_IN_TREE
        parent = self.provisions.tmp_parent if self.provisions is not None else ""
        if layer and parent:
            return layer_link(parent, layer)
        return layer

    def layer(self) -> str:
        """The dependency layer this runtime's zygotes are started on ("" for none)."""
        return ""

    def set_layer(self, path: str) -> None:
        raise NotImplementedError

    # ---- what the tree tells a run ---------------------------------------------------------------

    def run_hostname(self) -> str:
        return health.run_hostname(self.mode, self.platform)

    def run_nameservers(self) -> tuple[str, ...]:
        """The resolvers a run's resolv.conf names: those its egress lets it reach, from the host's resolv.conf
        (provisions.nameservers). Through the proxy (no UDP, no DNS), or no network: none. Runs without network
        share the tree of those with (one per zygote): they read the same lines, and cannot open a socket."""
        if self.run_network.kind not in (network_access.FILTERED, network_access.UNFILTERED):
            return ()
        return self.provisions.nameservers() if self.provisions else tuple(resolvers())

    @property
    def run_network(self) -> network_access.RunNetwork:
        """What runs asking for network get (provisions.run_network)."""
        return self.provisions.run_network if self.provisions is not None else PLATFORM_NETWORK

    def zygote_config(self, kind: str = MAIN, tree_root: str = "") -> ZygoteConfig:
        """What a new zygote of that kind is started with, from the current layer and settings (tree_root: the
        chroot mode's materialized tree, held for it)."""
        mode, provisions = self.mode, self.provisions
        return ZygoteConfig(
            import_paths=import_paths(),
            runner=self.runner,
            runner_config=self.runner_config(kind),
            confinement=provisions.confinement(),
            tree=self.tree().to_dict() if mode.tree == modes.PIVOT else None,
            tree_root=tree_root or provisions.tree_root,
            readable=tuple(self.readable()) if mode.narrow_domain else None,
            connect_ports=provisions.connect_ports,
            zygote_uid=provisions.zygote_uid,
            network=provisions.zygote_network(),
            single_fork=self.first_run_apart,
        )


def layer_link(parent: str, layer: str) -> str:
    """A link in parent (the runs' directories' parent: the service's own, no run writes it) to the layer, made
    once per layer (atomically: a zygote never finds it half made). Its target is the layer's path in the data
    dir: readlink and realpath still tell it (no mount namespace to show it elsewhere without a link)."""
    link = os.path.join(parent, "layer-" + os.path.basename(layer.rstrip("/")))
    try:
        if os.readlink(link) == layer:
            return link
    except OSError:
        pass
    fresh = f"{link}.{os.getpid()}.new"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(fresh)
    os.symlink(layer, fresh)
    os.replace(fresh, link)
    return link
