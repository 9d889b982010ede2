"""What a runtime's mode sets up for its runs, and tears down at stop.

One `Provisions` per started runtime, made once its mode is chosen (modes.py),
each part following the mode's fields:

- identities: as root, a uid block (uids.py), the zygotes' uid where runs have
  a user namespace, and egress rules by uid (linux/egress.py); runs sharing
  the runtime's uid, a parent directory for their own (linux/tempdirs.py);
- the runs' network: the namespace with pasta (userns without root,
  linux/pasta.py), or proxy egress (policy/proxy_egress.py), and what runs
  asking for network get (`run_network`, policy/network_access.py);
- the tree: the pivot mode's mount point, or the chroot mode's materialized
  trees (trees/tree_store.py) and their cells;
- /tmp: the watcher and the caps of each run's directory (tmp/caps.py,
  tmp/shared_tmp.py), and the serial schedule's scratch sweep (tmp/scratch.py).

The runtime (runtime.py) reads what it needs of them to start its zygotes and
to report its health; nothing here starts a zygote or serves a run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import logging
import os
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING

from runtimes.config import MIB, RuntimeConfig
from runtimes.jail import modes
from runtimes.jail.modes import Mode
from runtimes.jail.policy import landlock_mode, network_access, proxy_egress
from runtimes.jail.policy.proxy_egress import ProxyEgress
from runtimes.jail.service import sweep
from runtimes.jail.service.supervisor import ZygoteHandle
from runtimes.jail.service.thread_cap import ThreadCap
from runtimes.jail.service.uids import UidPool, UidPoolExhausted
from runtimes.jail.tmp.caps import RunDirectories, TmpWatcher
from runtimes.jail.tmp.scratch import Scratch
from runtimes.jail.tmp.shared_tmp import SharedRunDirectories
from runtimes.jail.trees import materialized, tree_store
from runtimes.jail.zygote_config import Confinement, ZygoteConfig, ZygoteNetwork
from runtimes.languages import DEFAULT, NODEJS
from runtimes.linux import pasta, rootfs, tempdirs
from runtimes.linux.egress import EgressFilter, resolvers
from runtimes.linux.pasta import REFUSED as REFUSED_PREFIX
from runtimes.linux.pasta import NamespaceNetwork
from runtimes.linux.protections import Protections

if TYPE_CHECKING:
    from runtimes.jail.service.pool import ChildPool
    from runtimes.linux.rootfs import TreeSpec

log = logging.getLogger("sandlot.runtime")

CELL_SETTLE_SECONDS = 1.0  # after the surplus children's end, before the cells no child is in go (their /tmp removed)
TREE_SETTLE_SECONDS = 5.0  # after a chroot zygote's start or the surplus children's end, before the trees' pages go

# runs sharing the runtime's uid, one at a time (a Lambda function): the platform's network, as before
PLATFORM_NETWORK = network_access.RunNetwork(
    network_access.UNFILTERED, "the platform's own network (one run at a time)"
)


class Provisions:
    def __init__(self, config: RuntimeConfig, language: str, mode: Mode, platform: Protections):
        self.config = config
        self.language = language
        self.mode = mode
        self.platform = platform
        self.uids: UidPool | None = None
        self.zygote_uid = -1  # userns as root: the uid zygotes drop to
        self.tmp_parent = ""  # runs sharing the runtime's uid: their directories' parent (tempdirs.py)
        self.tree_root = ""  # the pivoted tree's mount point (in the zygotes' own namespaces; tempdirs.py)
        self.egress: EgressFilter | None = None
        self.network: NamespaceNetwork | None = None  # userns without root: the runs' own network namespace
        self.proxy: ProxyEgress | None = None  # egress not filtered, a proxy configured: its port only
        self.unfiltered_why = ""  # userns without pasta, SANDLOT_UNFILTERED_EGRESS=allow: why there is no filter
        self.trees: tree_store.TreeStore | None = None  # the chroot mode: materialized trees
        self._forgetting: dict[str, int] = {}  # trees of copies (their pages dropped at rest): zygotes on each
        self._forgetting_files: set[str] = set()  # files of the image (node) whose pages are dropped at rest
        self._forget_hooked: ChildPool | None = None  # the pool whose going idle drops the trees' pages
        self._slots_filled: set[str] = set()  # the trees whose slots were filled once their first runs were served
        self._cells_hooked: ChildPool | None = None  # the pool whose going idle retires the idle cells
        self.tmp_watcher: TmpWatcher | None = None  # the chroot and landlock modes: each run's /tmp capped
        self.run_dirs: RunDirectories | SharedRunDirectories | None = None
        self.thread_cap: ThreadCap | None = None  # the landlock mode: RLIMIT_NPROC would count the service's tasks

    async def set_up(self) -> None:
        """Everything the mode needs before the first zygote starts. Raises modes.JailRefused."""
        config, mode = self.config, self.mode
        self._claim_identities()
        if mode.egress == modes.NO_EGRESS_FILTER and not mode.serial_only:
            self.proxy = await asyncio.to_thread(
                proxy_egress.choose,
                config.proxy_egress,
                config.run_env,
                self.platform.landlock,
                config.unfiltered_egress,
            )
        self.network = self._namespace_network()
        if mode.tree == modes.PIVOT:
            self.tree_root = tempdirs.make(f"root-{self.language}")
        caps = (config.tmp_size_mb * MIB, config.tmp_files)
        if mode.tree == modes.CHROOT:
            self.trees = await asyncio.to_thread(self._open_trees)
            self.tmp_watcher = TmpWatcher()
            self.run_dirs = RunDirectories(self.tmp_watcher, *caps, self.counts_held)
        elif mode.narrow_domain:  # runs sharing the service's uid, many at once: capped as chroot's
            self.tmp_watcher = TmpWatcher()
            self.run_dirs = SharedRunDirectories(
                self.tmp_watcher, *caps, parent=self.tmp_parent, counts_held=self.counts_held
            )
            self.thread_cap = ThreadCap(config.max_threads)
        if mode.processes == modes.UID_SWEEP and self.uids is not None:
            # a killed instance of this uid block may have left runs (whose zygote died, a parent-death
            # signal away from them): none of them may meet the runs about to get the same uids
            await asyncio.to_thread(sweep.kill_range, self.uids.first, self.uids.first + self.uids.size - 1)

    def close(self) -> None:
        if self.thread_cap is not None:
            self.thread_cap.close()
        if self.tmp_watcher is not None:
            self.tmp_watcher.close()
        if self.trees is not None:
            self.trees.close()  # the trees stay: a restart finds them ready
        if self.egress is not None:
            self.egress.remove()
        if self.uids is not None:
            self.uids.close()
        for path in (self.tmp_parent, self.tree_root):
            if path:
                tempdirs.remove(path)

    def confinement(self) -> Confinement:
        """How every child of a new zygote is confined (zygote/confine.py), from the mode, the platform's record
        and the settings."""
        config, mode, platform = self.config, self.mode, self.platform
        return Confinement(
            mode=mode,
            landlock=platform.landlock if platform else 0,
            # the zygote may make one where it holds CAP_SYS_ADMIN: as root, or in a user namespace of its own
            time_namespace=bool(platform and platform.time_namespaces)
            and (os.geteuid() == 0 or mode.identity == modes.USER_NAMESPACE),
            tmp_size_bytes=config.tmp_size_mb * MIB,
            tmp_files=config.tmp_files,
            max_open_files=config.max_open_files,
            max_threads=config.max_threads,
            max_file_bytes=config.max_file_mb * MIB,
            **{
                c: bool(getattr(platform, c, True))
                for c in ("dumpable", "pdeathsig", "no_new_privs", "seccomp", "hostname")
            },
            watched=self.counts_held,
        )

    # ---- identities ---------------------------------------------------------------------------------------

    def _claim_identities(self) -> None:
        """As root: a uid block and, where the mode filters egress by uid, rules for it (a user namespace per
        run: one uid of it for the zygotes and their runs). Runs sharing the runtime's uid: a parent for their
        directories. Without root otherwise: nothing (runs keep the service's uid, in namespaces)."""
        config, mode = self.config, self.mode
        if mode.tmp == modes.DIRECTORY and mode.shares_uid:
            self.tmp_parent = tempdirs.make(self.language)
            return
        if os.geteuid() != 0:
            return
        try:
            self.uids = UidPool(config.uid_base, config.uid_count, "/run/sandlot")
        except UidPoolExhausted as exc:  # a user namespace's map too small: refused, with what it holds
            raise modes.JailRefused(str(exc)) from exc
        if self.uids.note:
            log.warning("%s: %s", self.language, self.uids.note)
        if mode.identity == modes.USER_NAMESPACE:
            self.zygote_uid = self.uids.acquire()
        if mode.egress == modes.NFT_UID:
            last = self.uids.first + self.uids.size - 1
            self.egress = EgressFilter(self.uids.first, last, allow=config.egress_allow, proxies=self.proxies())
            self.egress.install()

    @property
    def pool_uids(self) -> UidPool | None:
        """The uids the pool hands its runs: a uid of its own each, where the mode gives one."""
        return self.uids if self.mode.own_uid else None

    @property
    def pool_tmp_parent(self) -> str | None:
        """Where the pool makes each run's directory: runs sharing the runtime's uid only."""
        return self.tmp_parent if self.mode.tmp == modes.DIRECTORY and self.mode.shares_uid else None

    @property
    def counts_held(self) -> bool:
        """Whether the watcher counts what runs hold open or mapped after the names went (tmp/caps.py, tmp/held.py):
        where their /tmp is a directory it caps, and they can be made dumpable to their own uid."""
        capped = self.mode.tree == modes.CHROOT or self.mode.narrow_domain
        return capped and bool(getattr(self.platform, "dumpable", True))

    def scratch(self) -> Scratch | None:
        """The serial schedule's sweep of what a run sharing the runtime's uid may have left writable places."""
        if not self.mode.shares_uid:
            return None
        writable = list(self.platform.writable) if self.platform else []
        return Scratch([*writable, tempfile.gettempdir()], os.getuid(), [self.config.data_dir], self.tmp_parent)

    # ---- the runs' network --------------------------------------------------------------------------------

    def proxies(self) -> tuple[str, ...]:
        return tuple(v for k, v in self.config.run_env.items() if k.isupper())

    def _namespace_network(self) -> NamespaceNetwork | None:
        """userns without root: a network namespace per zygote, with pasta and nft in it, or network runs refused."""
        if self.mode.egress != modes.NETNS_PASTA or self.platform is None:
            return None
        network = pasta.namespace_network(self.platform, self.config.pasta, self.config.egress_allow, self.proxies())
        if network.refused and self.config.unfiltered_egress == network_access.ALLOW:
            # the operator chose unfiltered egress: the runs keep the host's network, no namespace of their own
            self.unfiltered_why = network.refused.removeprefix(REFUSED_PREFIX)
            return dataclasses.replace(network, netns=False, refused="")
        return network

    @property
    def own_network_namespace(self) -> bool:
        """Runs (of each zygote) live in a network namespace of their own (pasta's)."""
        return bool(self.network and self.network.netns)

    def zygote_network(self) -> ZygoteNetwork | None:
        return ZygoteNetwork(**self.network.zygote_config()) if self.network else None

    def network_failed(self, error: str) -> None:
        """A zygote's pasta failed as it started: runs asking for network are refused from now on."""
        if self.network is not None and not self.network.refused:
            self.network = self.network.failed(error)
            log.error("%s: %s", self.language, self.network.refused)

    def environment(self) -> dict[str, str]:
        """The zygotes' environment: the settings', with the proxies' addresses resolved (runs have no DNS then)."""
        environment = self.config.environment()
        if self.proxy is not None:
            environment.update(self.proxy.env)
        return environment

    @property
    def connect_ports(self) -> tuple[int, ...] | None:
        """Proxy egress: every child's domain allows TCP connect to the proxy's ports only (proxy_egress.py)."""
        return self.proxy.ports if self.proxy and not self.proxy.refused else None

    def nameservers(self) -> tuple[str, ...]:
        """The host's resolvers, but not on loopback where runs have a network namespace of their own (pasta's:
        the host's loopback is not theirs)."""
        servers = resolvers()
        if self.own_network_namespace:
            servers = [s for s in servers if not _loopback(s)]
        return tuple(servers)

    @property
    def egress_in_force(self) -> bool:
        return bool(self.egress and self.egress.installed) or bool(self.network and self.network.in_force)

    @property
    def run_network(self) -> network_access.RunNetwork:
        """What runs asking for network get: filtered egress, or where it cannot be had, what
        SANDLOT_UNFILTERED_EGRESS says (network_access.py). Runs sharing the runtime's uid (a Lambda function, one
        run at a time) keep the platform's own network, as before."""
        mode, setting = self.mode, self.config.unfiltered_egress
        if mode.shares_uid and mode.serial_only:
            return PLATFORM_NETWORK
        if self.proxy is not None:
            if self.proxy.refused:
                return network_access.RunNetwork(network_access.REFUSED, self.proxy.refused)
            return network_access.RunNetwork(network_access.PROXY, self.proxy.description)
        if mode.narrow_domain:  # the landlock mode: nothing tells its runs' packets from the service's
            return network_access.decide(False, landlock_mode.NO_EGRESS_FILTER, setting)
        if mode.egress == modes.NFT_UID:
            installed = bool(self.egress and self.egress.installed)
            why = self.egress.error if self.egress and not installed else ""
            return network_access.decide(installed, why or "the egress rules could not be installed", setting)
        if mode.egress == modes.NETNS_PASTA and self.network is not None:
            if self.unfiltered_why:
                return network_access.decide(False, self.unfiltered_why, setting)
            why = self.network.refused.removeprefix(REFUSED_PREFIX)
            if self.network.netns and setting == network_access.ALLOW:
                setting = network_access.NO_NETWORK  # runs live in a namespace with no way out: none to give
            return network_access.decide(self.network.in_force, why, setting)
        record = self.platform
        error = record.errors.get("host_nft", "") if record else ""
        return network_access.decide(
            False, network_access.chroot_reason(bool(record and record.host_nft), error), setting
        )

    # ---- a zygote on them ----------------------------------------------------------------------------------

    async def start_zygote(
        self,
        python: str,
        layer: str,
        tree: Callable[..., TreeSpec],  # the runtime's tree(layer=True): with layer=False, its layer-less one
        config_for: Callable[[str], ZygoteConfig],  # the zygote's config, on the tree root given ("" for none)
        pool: ChildPool,
    ) -> ZygoteHandle:
        """A zygote started on what the mode set up: the chroot mode's tree (and the cells ahead of its first
        runs), the environment, the runs' network. Raises Unavailable if it does not start."""
        # the chroot mode: its tree, built now if this layer has none yet (a thread: runs go on meanwhile)
        root = ""
        if self.trees:
            root = await asyncio.to_thread(self.hold_tree, tree().to_dict(), tree(layer=False).to_dict())
        config = config_for(root)
        if root and self.uids is not None:
            # the cells of the next runs' uids (as many as are kept ready, and one), made while the zygote starts:
            # its first children need them, and would otherwise make them one by one (tree_store.make_run_tmp)
            pool.background(asyncio.to_thread(self.make_cells, root, self.upcoming_uids()))
        zygote = ZygoteHandle(
            python, config, self.environment(), network=self.network, start_timeout=self.config.zygote_start_timeout
        )
        zygote.tag = layer
        zygote.tree_root = root
        try:
            await zygote.start()
        except BaseException:
            if root:
                await asyncio.to_thread(self.release_tree, root)
            raise
        if zygote.network_error:
            self.network_failed(zygote.network_error)
        if root and self.uids is not None and self._cells_hooked is not pool:
            self._cells_hooked = pool  # once per pool: at rest, the cells no child is in go
            pool.on_idle.append(lambda: pool.background(self._retire_cells()))
        if root and root not in self._slots_filled:
            self._slots_filled.add(root)
            pool.background(self._fill_slots(root, TREE_SETTLE_SECONDS))
        if root and self.trees.uncache:
            self._forgetting[root] = self._forgetting.get(root, 0) + 1
            self._forget_at_rest(pool)
            pool.background(self._forget_tree_pages(TREE_SETTLE_SECONDS))
        elif not root and self.language == NODEJS.wire_name:
            # the other modes run the image's own node: at rest no node is left (its idle level is none), and the
            # ~70 MB of it the children mapped would stay charged to the container that first read them
            node = os.path.realpath(self.config.nodejs_path)
            if materialized.filesystem(node) == "overlay":
                self._forgetting_files.add(node)
                self._forget_at_rest(pool)
        return zygote

    async def _retire_cells(self) -> None:
        """At rest (the surplus ready children gone), the cells of this runtime's uids that no child is in are
        removed, but the next uid's (tree_store.retire_idle_cells): what each holds of the kernel's memory
        (dentries, inodes) is charged to the container and never reclaimed at rest. Once the children let go are
        dead and their /tmp removed (CELL_SETTLE_SECONDS), and again with the trees' pages (TREE_SETTLE_SECONDS)."""
        for delay in (CELL_SETTLE_SECONDS, TREE_SETTLE_SECONDS - CELL_SETTLE_SECONDS):
            await asyncio.sleep(delay)
            if self.trees is None or self.uids is None:
                return
            own = range(self.uids.first, self.uids.first + self.uids.size)
            kept = frozenset(self.uids.upcoming(1))  # the next run's, which may need a child made on demand
            for root in self.trees.held():
                try:
                    retired = await asyncio.to_thread(tree_store.retire_idle_cells, root, own, kept)
                except OSError as exc:  # the tree retired meanwhile: its cells went with it
                    log.debug("%s: idle cells not retired in %s: %s", self.language, root, exc)
                    continue
                if retired:
                    log.debug("%s: retired the idle cells of uids %s in %s", self.language, retired, root)

    def _forget_at_rest(self, pool: ChildPool) -> None:
        if self._forget_hooked is not pool:  # once per pool (a runtime started again has a new one)
            self._forget_hooked = pool
            pool.on_idle.append(lambda: pool.background(self._forget_tree_pages(TREE_SETTLE_SECONDS)))

    async def _fill_slots(self, root: str, delay: float) -> None:
        """An image tree with an operator's layer added: the slots its first runs did not take get the layer too,
        once those runs are served (tree_store.fill_slots): from then on a slot given links nothing that every run
        would see move."""
        await asyncio.sleep(delay)
        try:
            filled = await asyncio.to_thread(tree_store.fill_slots, root)
        except OSError as exc:  # the tree retired meanwhile
            log.debug("%s: the slots of %s were not filled: %s", self.language, root, exc)
            return
        if filled:
            log.debug("%s: the layer linked into %d more slots of %s", self.language, filled, root)

    async def _forget_tree_pages(self, delay: float) -> None:
        """The chroot mode on a container's own filesystem: once the zygote and its first children have read what
        they start on, and again whenever the service goes idle (its surplus children gone), the pages of the
        trees' copies that no process maps are dropped (the interpreter's modules, read once into the zygote; the
        part of node no live process maps): the container is not charged for them at rest. What a run reads later
        comes back from the disk."""
        await asyncio.sleep(delay)
        for path in list(self._forgetting_files):
            rootfs.forget_cached_pages(path)
        for root in list(self._forgetting):
            try:
                await asyncio.to_thread(tree_store.forget_pages, root)
            except OSError as exc:  # the tree retired meanwhile: nothing to forget
                log.debug("%s: the tree's pages were not dropped: %s", self.language, exc)

    def zygote_retired(self, zygote: ZygoteHandle, pool: ChildPool) -> None:
        """The chroot mode: a retired zygote's tree is released, removed if no zygote (of any instance) is left on
        it: thousands of files, off the event loop."""
        if self.trees is not None and zygote.tree_root:
            users = self._forgetting.pop(zygote.tree_root, 0) - 1
            if users > 0:
                self._forgetting[zygote.tree_root] = users
            pool.background(asyncio.to_thread(self.release_tree, zygote.tree_root))
            zygote.tree_root = ""

    # ---- the chroot mode's trees --------------------------------------------------------------------------

    def _open_trees(self) -> tree_store.TreeStore:
        try:
            # the default language's tree is built first (tree_store: one at a time)
            first = self.language == DEFAULT.wire_name
            return tree_store.TreeStore(tree_store.trees_dir(self.config.data_dir), first=first)
        except tree_store.TreeUnusable as exc:
            raise modes.JailRefused(f"the chroot jail's tree cannot be made: {exc}") from exc

    def hold_tree(self, spec: dict, base: dict | None = None) -> str:
        """The chroot mode: the materialized tree for spec, held ("" in other modes); what runs of dead instances
        left in its /tmp goes. base: spec's layer-less tree, whose image tree spec's layer may be added to where the
        image has none of spec's own (tree_store.TreeStore.ensure). Blocking: in a thread."""
        if self.trees is None:
            return ""
        root = self.trees.ensure(spec, base)
        own = range(self.uids.first, self.uids.first + self.uids.size) if self.uids is not None else range(0)
        left = tree_store.clear_stale_run_tmps(root, own)
        if left:
            log.info("%s: removed what runs of stopped instances left in %s/tmp: %s", self.language, root, left)
        return root

    def release_tree(self, root: str) -> None:
        """A held tree is no longer used by this holder: removed if no zygote (of any instance) is left on it."""
        if self.trees is not None and root:
            self.trees.release(root)

    def collect_trees(self) -> None:
        """The trees no instance uses (an older layer's, a killed build's) go. Blocking: in a thread."""
        if self.trees is not None:
            self.trees.collect()

    def upcoming_uids(self) -> list[int]:
        """The uids of the next runs (as many as are kept ready, and one)."""
        return self.uids.upcoming(self.config.workers + 1) if self.uids is not None else []

    def make_cells(self, root: str, uids: list[int]) -> None:
        """The chroot mode: the cells of these uids in the tree at root, made ahead. Blocking: in a thread."""
        try:
            tree_store.make_cells(root, uids)
        except OSError as exc:  # each spawn makes its uid's cell itself, and fails with the reason
            log.warning("%s: could not make the next runs' cells ahead in %s: %s", self.language, root, exc)

    def uid_status(self) -> dict | None:
        """The uid block as this platform's user namespace map allows it (uids.py)."""
        if self.uids is None:
            return None
        return {"first": self.uids.first, "size": self.uids.size, "note": self.uids.note}


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False
