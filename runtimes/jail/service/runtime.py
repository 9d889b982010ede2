"""A language runtime behind the jail: its mode, its zygotes, a schedule, and the one run path.

`run(request)` is the only way a run is served, locally and on Lambda: take a
confined child from the schedule, hand it the run, collect the outcome, and let
the schedule say when the run may answer (schedule.py: pooled for the server,
serial for a Lambda function and `sandlot run --local`). The mode (modes.py) is
chosen at start from the probed protections record; what the runtime sets up
for it (a uid block, egress rules, the runs' network) follows the mode's fields.

Subclasses say what the tree holds, which runner the zygote loads, and how a
run request is put on the child's stdin.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import logging
import os
import socket
import tempfile
from typing import TYPE_CHECKING

import pyseccomp

import runtimes
from runtimes.config import MIB, RuntimeConfig
from runtimes.jail import modes
from runtimes.jail.policy import landlock_mode, network_access, proxy_egress
from runtimes.jail.policy.proxy_egress import ProxyEgress
from runtimes.jail.policy.tree_files import LAYER_IN_TREE, RUN_HOSTNAME
from runtimes.jail.service import sweep
from runtimes.jail.service.execution import execute
from runtimes.jail.service.pool import MAIN, ChildPool
from runtimes.jail.service.schedule import PooledSchedule, Schedule
from runtimes.jail.service.serial import SerialSchedule
from runtimes.jail.service.supervisor import Zygote
from runtimes.jail.service.uids import UidPool, UidPoolExhausted
from runtimes.jail.tmp.caps import RunDirectories, TmpWatcher
from runtimes.jail.tmp.scratch import Scratch
from runtimes.jail.tmp.shared_tmp import SharedRunDirectories
from runtimes.jail.trees import store
from runtimes.linux import syscalls, tempdirs
from runtimes.linux.egress import EgressFilter, resolvers
from runtimes.linux.pasta import REFUSED as REFUSED_PREFIX
from runtimes.linux.pasta import NamespaceNetwork
from runtimes.linux.pasta import plan as plan_network
from runtimes.linux.protections import Protections, platform_protections
from runtimes.linux.rootfs import TreeSpec
from runtimes.payload import RequestFields, RunResult, Unavailable

if TYPE_CHECKING:
    from runtimes.payload import RunRequest

log = logging.getLogger("sandlot.runtime")


class JailedRuntime:
    language = ""
    runner = ""

    def __init__(self, config: RuntimeConfig):
        self.config = config
        self.pool: ChildPool | None = None
        self.schedule: Schedule | None = None
        self.platform: Protections | None = None  # what this platform lets the jail do (probed at start)
        self.mode: modes.Mode | None = None  # chosen at start (modes.py)
        self._zygote_uid = -1  # userns as root: the uid zygotes drop to
        self.refused = ""  # a reason runs are refused for good (no seccomp, no jail)
        self.started = False
        self._started = asyncio.Event()  # set once start() is over, whatever its end: runs wait for it
        self._uids: UidPool | None = None
        self._tmp_parent = ""  # runs sharing the runtime's uid: their directories' parent (tempdirs.py)
        self._tree_root = ""  # the pivoted tree's mount point (in the zygotes' own namespaces; tempdirs.py)
        self._egress: EgressFilter | None = None
        self._network: NamespaceNetwork | None = None  # userns without root: the runs' own network namespace
        self._proxy: ProxyEgress | None = None  # egress not filtered, a proxy configured: its port only
        self._unfiltered_why = ""  # userns without pasta, SANDLOT_UNFILTERED_EGRESS=allow: why there is no filter
        self._trees: store.TreeStore | None = None  # the chroot mode: materialized trees
        self._tmp_watcher: TmpWatcher | None = None  # the chroot mode: each run's /tmp capped
        self.on_layer_unused: list = []  # called with a layer path no zygote uses any more
        self._left_out: dict[str, dict] = {}  # by kind of zygote: the preload failures last logged

    # ---- for subclasses --------------------------------------------------------

    def interpreter(self) -> str:
        raise NotImplementedError

    def missing(self) -> str:
        """Why this runtime cannot exist on this machine (e.g. no node), or ""."""
        return ""

    def tree(self) -> TreeSpec:
        raise NotImplementedError

    def readable(self) -> list[str]:
        """The landlock mode: what a run may read and execute (landlock_mode.py)."""
        return landlock_mode.readable(self.tree())

    def run_hostname(self) -> str:
        """What uname() tells a run: RUN_HOSTNAME in a UTS namespace of its own; where it has none (chroot),
        this machine's (a container's) own name, which the run's hosts file then knows too, as the name
        a run may look up (nothing uname() does not tell it already)."""
        if self.mode is not None and not self.mode.clone_flags & syscalls.CLONE_NEWUTS:
            return socket.gethostname()
        if self.platform is not None and not self.platform.hostname:
            return socket.gethostname()  # sethostname refused: the UTS namespace keeps the container's name
        return RUN_HOSTNAME

    def run_nameservers(self) -> tuple[str, ...]:
        """The resolvers a run's resolv.conf names: those its egress lets it reach, from the host's resolv.conf.
        Filtered egress: the ones the rules admit (egress.py), but not on loopback where runs have a network
        namespace of their own (pasta's: the host's loopback is not theirs). The operator's unfiltered egress:
        the host's. Through the proxy (no UDP, no DNS), or no network: none. Runs without network share the tree
        of those with (one per zygote): they read the same lines, and cannot open a socket to use them."""
        kind = self.run_network.kind
        if kind not in (network_access.FILTERED, network_access.UNFILTERED):
            return ()
        servers = resolvers()
        if self._network is not None and self._network.netns:  # userns without root: pasta's namespace
            servers = [s for s in servers if not _loopback(s)]
        return tuple(servers)

    def zygote_kinds(self) -> tuple[str, ...]:
        """The kinds of zygote this runtime keeps (pool.py), the first started first."""
        return (MAIN,)

    def runner_config(self, kind: str = MAIN) -> dict:
        return {
            "require_seccomp": self.config.require_seccomp,
            "extra_syscalls": list(self.config.extra_syscalls),
            "seccomp": bool(self.platform is None or self.platform.seccomp),  # seccomp_policy.prepared
        }

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

    # ---- life cycle -----------------------------------------------------------

    async def start(self) -> None:
        try:
            await self._start()
        finally:
            self.started = True
            self._started.set()

    async def _start(self) -> None:
        config = self.config
        if self.refused or self.missing():  # refused before start: a layer that could not be built (cli.serve)
            self.refused = self.refused or self.missing()
            log.warning("%s runs refused: %s", self.language, self.refused)
            return
        try:
            self.platform = await asyncio.to_thread(platform_protections)
            self.mode = modes.select(config.jail, self.platform, config.one_run_at_a_time)
            log.info("%s jail: %s", self.language, self.mode.name)
            if config.require_seccomp and not self.platform.seccomp:
                raise modes.JailRefused(self._no_seccomp(self.platform.errors.get("seccomp", "")))
            if self.mode.narrow_domain and not config.require_seccomp:
                raise modes.JailRefused(landlock_mode.needs_seccomp(self.platform.landlock))
            tmp_parent = self._claim_identities()
            if self.mode.egress == modes.NO_EGRESS_FILTER and not self.mode.serial_only:
                self._proxy = await asyncio.to_thread(
                    proxy_egress.plan,
                    config.proxy_egress,
                    config.run_env,
                    self.platform.landlock,
                    config.unfiltered_egress,
                )
            self._network = self._plan_network()
            if self.mode.tree == modes.PIVOT:
                self._tree_root = tempdirs.make(f"root-{self.language}")
            run_dirs = None
            if self.mode.tree == modes.CHROOT:
                self._trees = await asyncio.to_thread(self._open_trees)
                self._tmp_watcher = TmpWatcher()
                run_dirs = RunDirectories(
                    self._tmp_watcher, config.tmp_size_mb * MIB, config.tmp_files, self._counts_held()
                )
            elif self.mode.narrow_domain:  # runs sharing the service's uid, many at once: capped as chroot's
                self._tmp_watcher = TmpWatcher()
                caps = (config.tmp_size_mb * MIB, config.tmp_files)
                run_dirs = SharedRunDirectories(
                    self._tmp_watcher, *caps, parent=tmp_parent, counts_held=self._counts_held()
                )
            if self.mode.processes == modes.UID_SWEEP and self._uids is not None:
                # a killed instance of this uid block may have left runs (whose zygote died, a parent-death
                # signal away from them): none of them may meet the runs about to get the same uids
                await asyncio.to_thread(sweep.kill_range, self._uids.first, self._uids.first + self._uids.size - 1)
            if self.run_network.kind != network_access.FILTERED:
                log.warning("%s: %s", self.language, self.run_network.log_line)
            self.pool = ChildPool(
                self._start_zygote,
                self._uids if self.mode.own_uid else None,
                tmp_parent,
                config.zygote_max_forks,
                max_age=config.zygote_max_age,
                sweep_uids=self.mode.processes == modes.UID_SWEEP and self.mode.own_uid,
                rotate_in_background=not config.one_run_at_a_time,
                run_dirs=run_dirs,
                kinds=self.zygote_kinds(),
            )
            self.pool.on_retired.append(self.zygote_retired)
            if not config.one_run_at_a_time:  # before the first zygote: it fills up whenever a zygote runs
                self.schedule = PooledSchedule(self.pool, self.ready_targets(), self.idle_targets())
            await self.pool.start()
        except modes.JailRefused as exc:
            self.refused = str(exc)
            log.error("%s runs refused: %s", self.language, self.refused)
            return
        except Exception as exc:  # noqa: BLE001 - whatever it is, runs get a -500 saying so
            log.exception("%s runtime unavailable: %s", self.language, exc)
            if self.pool is None:
                self.refused = str(exc)  # nothing to retry with
            return  # the pool keeps trying to start a zygote
        if not self.filter_in_force and config.require_seccomp:
            self.refused = self._no_seccomp(self.report.get("seccomp_error") or "")
            log.error("%s runs refused: %s", self.language, self.refused)
            if config.one_run_at_a_time:
                await self.pool.stop()  # a function that refuses every run keeps no zygote for them
            return
        if self.schedule is None:
            self.schedule = self._serial_schedule()
        await self.schedule.start()
        if self._trees is not None:  # the trees no instance uses (an older layer's, a killed build's) go
            self.pool.background(asyncio.to_thread(self._trees.collect))

    def _open_trees(self) -> store.TreeStore:
        try:
            return store.TreeStore(store.trees_dir(self.config.data_dir))
        except store.TreeUnusable as exc:
            raise modes.JailRefused(f"the chroot jail's tree cannot be made: {exc}") from exc

    @staticmethod
    def _no_seccomp(why: str) -> str:
        return f"the seccomp filter cannot be installed here: {why or 'refused'}"

    @property
    def report(self) -> dict:
        """What the current zygote said when it was ready (seccomp, preloads)."""
        return self.pool.report if self.pool is not None else {}

    @property
    def filter_in_force(self) -> bool:
        """The zygote loads the seccomp filter, and the platform's record agrees that it can (a probe child
        killed by SIGSYS must not pass for a filter that loads)."""
        return bool(self.report.get("seccomp")) and (self.platform is None or self.platform.seccomp)

    def _serial_schedule(self) -> SerialSchedule:
        assert self.pool is not None and self.mode is not None
        scratch = None
        if self.mode.shares_uid:
            writable = list(self.platform.writable) if self.platform else []
            runs_parent = self._tmp_parent
            scratch = Scratch([*writable, tempfile.gettempdir()], os.getuid(), [self.config.data_dir], runs_parent)
        unfiltered = not self.filter_in_force
        return SerialSchedule(
            self.pool,
            self.default_variant(),
            sweep_uid=unfiltered and self.mode.processes == modes.UID_SWEEP,
            wait_for_namespace=unfiltered and self.mode.pid_namespace,
            scratch=scratch,
        )

    def default_variant(self) -> tuple:
        """The kind of child most runs need (Dify asks for network on every run)."""
        return self.variant(RequestFields(language=self.language, code="", enable_network=True))

    def _claim_identities(self) -> str | None:
        """As root: a uid block and, where the mode filters egress by uid, rules for it (a user namespace per
        run: one uid of it for the zygotes and their runs). Runs sharing the runtime's uid: a parent for their
        directories. Without root otherwise: nothing (runs keep the service's uid, in namespaces)."""
        config = self.config
        mode = self.mode
        if mode.tmp == modes.DIRECTORY and mode.shares_uid:
            self._tmp_parent = tempdirs.make(self.language)
            return self._tmp_parent
        if os.geteuid() != 0:
            return None
        try:
            self._uids = UidPool(config.uid_base, config.uid_count, "/run/sandlot")
        except UidPoolExhausted as exc:  # a user namespace's map too small: refused, with what it holds
            raise modes.JailRefused(str(exc)) from exc
        if self._uids.note:
            log.warning("%s: %s", self.language, self._uids.note)
        if mode.identity == modes.USER_NAMESPACE:
            self._zygote_uid = self._uids.acquire()
        if mode.egress == modes.NFT_UID:
            self._egress = EgressFilter(
                self._uids.first,
                self._uids.first + self._uids.size - 1,
                allow=config.egress_allow,
                proxies=self._proxies(),
            )
            self._egress.install()
        return None

    def _plan_network(self) -> NamespaceNetwork | None:
        """userns without root: a network namespace per zygote, with pasta and nft in it, or network runs refused."""
        if self.mode.egress != modes.NETNS_PASTA or self.platform is None:
            return None
        network = plan_network(self.platform, self.config.pasta, self.config.egress_allow, self._proxies())
        if network.refused and self.config.unfiltered_egress == network_access.ALLOW:
            # the operator chose unfiltered egress: the runs keep the host's network, no namespace of their own
            self._unfiltered_why = network.refused.removeprefix(REFUSED_PREFIX)
            return dataclasses.replace(network, netns=False, refused="")
        return network

    @property
    def run_network(self) -> network_access.RunNetwork:
        """What runs asking for network get: filtered egress, or where it cannot be had, what
        SANDLOT_UNFILTERED_EGRESS says (network_access.py). Runs sharing the runtime's uid (a Lambda function, one
        run at a time) keep the platform's own network, as before."""
        mode, setting = self.mode, self.config.unfiltered_egress
        if mode is None or (mode.shares_uid and mode.serial_only):
            return network_access.RunNetwork(
                network_access.UNFILTERED, "the platform's own network (one run at a time)"
            )
        if self._proxy is not None:
            if self._proxy.refused:
                return network_access.RunNetwork(network_access.REFUSED, self._proxy.refused)
            return network_access.RunNetwork(network_access.PROXY, self._proxy.description)
        if mode.narrow_domain:  # the landlock mode: nothing tells its runs' packets from the service's
            return network_access.decide(False, landlock_mode.NO_EGRESS_FILTER, setting)
        if mode.egress == modes.NFT_UID:
            installed = bool(self._egress and self._egress.installed)
            why = self._egress.error if self._egress and not installed else ""
            return network_access.decide(installed, why or "the egress rules could not be installed", setting)
        if mode.egress == modes.NETNS_PASTA and self._network is not None:
            if self._unfiltered_why:
                return network_access.decide(False, self._unfiltered_why, setting)
            why = self._network.refused.removeprefix(REFUSED_PREFIX)
            if self._network.netns and setting == network_access.ALLOW:
                setting = network_access.NO_NETWORK  # runs live in a namespace with no way out: none to give
            return network_access.decide(self._network.in_force, why, setting)
        record = self.platform
        error = record.errors.get("host_nft", "") if record else ""
        return network_access.decide(
            False, network_access.chroot_reason(bool(record and record.host_nft), error), setting
        )

    def _proxies(self) -> tuple[str, ...]:
        return tuple(v for k, v in self.config.run_env.items() if k.isupper())

    def _counts_held(self) -> bool:
        """Whether the watcher counts what runs hold open or mapped after the names went (tmpcap, unnamed.py):
        where their /tmp is a directory it caps, and they can be made dumpable to their own uid."""
        capped = self.mode.tree == modes.CHROOT or self.mode.narrow_domain
        return capped and bool(getattr(self.platform, "dumpable", True))

    def zygote_config(self, kind: str = MAIN) -> dict:
        """What a new zygote of that kind is started with, from the current layer and settings."""
        config = self.config
        return {
            "import_paths": _import_paths(),
            "runner": self.runner,
            "runner_config": self.runner_config(kind),
            "tree": self.tree().to_dict() if self.mode.tree == modes.PIVOT else None,
            "readable": self.readable() if self.mode.narrow_domain else None,
            # proxy egress: every child's domain allows TCP connect to the proxy's ports only (proxy_egress.py)
            "connect_ports": list(self._proxy.ports) if self._proxy and not self._proxy.refused else None,
            "tree_root": self._tree_root,
            "zygote_uid": self._zygote_uid,
            "network": self._network.zygote_config() if self._network else None,
            "plan": {
                "mode": self.mode.to_dict(),
                "landlock": self.platform.landlock if self.platform else 0,
                # the zygote may make one where it holds CAP_SYS_ADMIN: as root, or in a user namespace of its own
                "time_namespace": bool(self.platform and self.platform.time_namespaces)
                and (os.geteuid() == 0 or self.mode.identity == modes.USER_NAMESPACE),
                "tmp_size_bytes": config.tmp_size_mb * MIB,
                "tmp_files": config.tmp_files,
                "max_open_files": config.max_open_files,
                "max_threads": config.max_threads,
                "max_file_bytes": config.max_file_mb * MIB,
                **{
                    call: bool(getattr(self.platform, call, True))
                    for call in ("dumpable", "pdeathsig", "no_new_privs", "seccomp", "hostname")
                },
                "watched": self._counts_held(),
            },
        }

    async def _start_zygote(self, kind: str = MAIN) -> Zygote:
        config = self.zygote_config(kind)
        root = ""
        if self._trees is not None:  # built now if this layer has none yet (a thread: runs go on meanwhile)
            root = await asyncio.to_thread(self._ensure_tree, self.tree().to_dict())
            config["tree_root"] = root
        environment = self.config.environment()
        if self._proxy is not None:  # the proxies' addresses resolved: runs have no DNS then
            environment.update(self._proxy.env)
        if root and self._uids is not None:
            # the cells of the next runs' uids (as many as are kept ready, and one), made while the zygote starts:
            # its first children need them, and would otherwise make them one by one (store.make_run_tmp)
            upcoming = self._uids.upcoming(self.config.workers + 1)
            self.pool.background(asyncio.to_thread(self._make_cells, root, upcoming))
        zygote = Zygote(self.interpreter(), config, environment, network=self._network)
        zygote.tag = self.layer()
        zygote.tree_root = root
        try:
            await zygote.start()
        except BaseException:
            if root:
                await asyncio.to_thread(self._trees.release, root)
            raise
        failed = zygote.network_error
        if failed and self._network is not None and not self._network.refused:
            self._network = self._network.failed(failed)
            log.error("%s: %s", self.language, self._network.refused)
        left_out = zygote.report.get("preload_failed") or {}
        if left_out and left_out != self._left_out.get(kind):  # once, not at every rotation
            log.warning("%s: left out of the preload: %s", self.language, left_out)
        self._left_out[kind] = left_out
        return zygote

    def _make_cells(self, root: str, uids: list[int]) -> None:
        try:
            store.make_cells(root, uids)
        except OSError as exc:  # each spawn makes its uid's cell itself, and fails with the reason
            log.warning("%s: could not make the next runs' cells ahead in %s: %s", self.language, root, exc)

    def _ensure_tree(self, spec: dict) -> str:
        """The materialized tree for spec, held; what runs of dead instances left in its /tmp goes."""
        root = self._trees.ensure(spec)
        own = range(self._uids.first, self._uids.first + self._uids.size) if self._uids is not None else range(0)
        left = store.clear_stale_run_tmps(root, own)
        if left:
            log.info("%s: removed what runs of stopped instances left in %s/tmp: %s", self.language, root, left)
        return root

    # ---- dependency layers ------------------------------------------------------

    def layer_in_view(self) -> str:
        """The layer's path as runs see it: in a tree, where the tree places it (tree.LAYER_IN_TREE, whatever the
        data dir); without one (landlock, Lambda), its own."""
        if self.layer() and self.mode.tree != modes.NO_TREE:
            return LAYER_IN_TREE
        return self.layer()

    def layer(self) -> str:
        """The dependency layer this runtime's zygotes are started on ("" for none)."""
        return ""

    def set_layer(self, path: str) -> None:
        raise NotImplementedError

    async def switch_layer(self, path: str) -> None:
        """Start a zygote on the new layer and retire the old one: runs in flight finish on
        the old layer, runs after the switch see the new one. Raises if the new one cannot start."""
        if self.pool is None:
            raise Unavailable(f"the {self.language} runtime is not running")
        old_layer = self.layer()
        self.set_layer(path)
        try:
            await self.pool.replace_zygote()
        except Unavailable:
            self.set_layer(old_layer)
            raise

    def zygote_retired(self, zygote: Zygote) -> None:
        """A zygote and all its children are gone: its layer, and its tree, may be unused now."""
        if self._trees is not None and zygote.tree_root:
            # removed if no zygote (of any instance) is left on it: thousands of files, off the event loop
            self.pool.background(asyncio.to_thread(self._trees.release, zygote.tree_root))
            zygote.tree_root = ""
        for callback in self.on_layer_unused:
            if zygote.tag and zygote.tag != self.layer() and not self.pool.uses_tag(zygote.tag):
                callback(zygote.tag)

    async def stop(self) -> None:
        if self.schedule is not None:
            await self.schedule.stop()
        if self.pool is not None:
            await self.pool.stop()
        if self._tmp_watcher is not None:
            self._tmp_watcher.close()
        if self._trees is not None:
            self._trees.close()  # the trees stay: a restart finds them ready
        if self._egress is not None:
            self._egress.remove()
        if self._uids is not None:
            self._uids.close()
        for path in (self._tmp_parent, self._tree_root):
            if path:
                tempdirs.remove(path)

    FAILING_AFTER = 3  # children failed in a row, none confined since: runs fail, the runtime is not ready

    @property
    def ready(self) -> bool:
        """A run can be served: the zygote serves, and (served many at once) a child has been fully confined,
        and children are not failing one after another."""
        return (
            self.started
            and self.schedule is not None
            and self.pool.running
            and not self.refused
            and not self._children_failing()
        )

    def _children_failing(self) -> str:
        """Why children cannot be had now, or ""."""
        pool = self.pool
        if pool is None:
            return ""
        if pool.failed_in_a_row >= self.FAILING_AFTER or (pool.spawn_error and not pool.confined):
            return pool.spawn_error
        if not pool.confined and not self.config.one_run_at_a_time:  # the serial schedule forks at a run
            return "no child confined yet"
        return ""

    @property
    def error(self) -> str:
        if self.refused:
            return self.refused
        if self.pool is None or not self.started:
            return "starting"
        if not self.pool.running:
            return self.pool.last_error or "the zygote is down"
        return self._children_failing()

    def status(self) -> dict:
        return {
            "ready": self.ready,
            "installed": not self.missing(),
            "error": self.error,
            "protections": self.protections(),
            "platform": self.platform.to_dict() if self.platform else None,
            "preloaded": self.report.get("preloaded", []),
            "preload_failed": self.report.get("preload_failed", {}),
            "huge_pages": self.report.get("huge_pages", 0),  # of the zygote's warm heap (jail/zygote/warmheap.py)
            # the uid block as this platform's user namespace map allows it (jail/service/uids.py)
            "uids": {"first": self._uids.first, "size": self._uids.size, "note": self._uids.note}
            if self._uids
            else None,
            **(self.pool.status() if self.pool else {}),
            **(self.schedule.status() if self.schedule else {"ready_children": 0}),
        }

    def protections(self) -> dict:
        """What each run gets in this runtime's mode (README: protections per run)."""
        mode = self.mode
        if mode is None:
            return {"mode": ""}
        return {
            "mode": mode.name,
            "fresh_process": True,
            "seccomp": bool(self.report.get("seccomp")),
            "tree": mode.tree,  # what a run sees as /: the read-only tree (pivot or chroot), or the platform's
            "chroot": mode.tree != modes.NO_TREE,
            "own_uid": mode.own_uid,
            "user_namespace": mode.identity == modes.USER_NAMESPACE,
            "pid_namespace": mode.pid_namespace,  # the run is pid 1: its processes die with it; none other is named
            "processes_ended_by": mode.processes,
            "capabilities": "none",
            "private_tmp": mode.tmp,
            "landlock": self.platform.landlock if self.platform else 0,
            **(landlock_mode.health(self.platform.landlock if self.platform else 0) if mode.narrow_domain else {}),
            "time_namespace": bool(self.report.get("time_namespace")),  # clocks from zero: no host uptime
            **self._hostname_health(),
            "rlimits": True,
            "scrubbed_environment": True,
            "egress_filter": bool(self._egress and self._egress.installed)
            or bool(self._network and self._network.in_force),
            "network_namespace": bool(self._network and self._network.netns),  # the runs' own (userns without root)
            "network_refused": self.run_network.message if self.run_network.kind == network_access.REFUSED else "",
            **self.run_network.health(),  # what runs asking for network get: filtered, none, unfiltered, refused
        }

    def _hostname_health(self) -> dict:
        """What uname() tells a run: a name of its own, or where sethostname is refused (podman's profile
        without CAP_SYS_ADMIN) the container's, the step dropped as cosmetic."""
        if self.mode is None or not self.mode.clone_flags & syscalls.CLONE_NEWUTS:
            return {"hostname": "the container's", "hostname_reason": "no UTS namespace in this mode"}
        if self.platform is not None and not self.platform.hostname:
            why = self.platform.errors.get("hostname", "refused")
            return {"hostname": "the container's", "hostname_reason": f"sethostname refused ({why}): step dropped"}
        return {"hostname": RUN_HOSTNAME, "hostname_reason": ""}

    # ---- runs -----------------------------------------------------------------

    async def run(self, request: RunRequest, max_seconds: float | None = None) -> RunResult:
        """The one run path: a child from the schedule, the run, its outcome once the schedule lets it answer.

        A run that arrives while the runtime starts waits for it, within its own timeout. max_seconds: a
        tighter bound than the request's own (a Lambda invocation's remaining time).
        """
        timeout = self.config.clamp_timeout(request.timeout)
        if max_seconds is not None:
            timeout = max(0.001, min(timeout, max_seconds))
        if not self.started:
            try:
                await asyncio.wait_for(self._started.wait(), timeout)
            except TimeoutError:
                raise Unavailable(f"the {self.language} runtime is starting") from None
        if self.refused:
            raise Unavailable(self.refused)
        if self.schedule is None:
            raise Unavailable(self.error or f"the {self.language} runtime is not running")
        network_refused = ""
        if request.enable_network:
            network = self.run_network
            if network.kind == network_access.REFUSED:
                raise Unavailable(network.message)
            if network.kind == network_access.NONE:  # served without network, its socket calls saying why
                request = request.model_copy(update={"enable_network": False})
                network_refused = network.message
        child = await self.schedule.take(self.variant(request))
        try:
            data = self.encode(request, timeout, network_refused)
            outcome = await execute(child, data, timeout, self.config.output_limit)
        finally:
            await self.schedule.finish(child)
        return outcome.to_result()

    async def between(self) -> None:
        """The schedule's work once a run's answer has gone out, before the next run (serial: clean-up and
        the next child; pooled: nothing)."""
        if self.schedule is not None:
            await self.schedule.between()


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False


def _import_paths() -> list[str]:
    """Where the zygote finds this package and pyseccomp before it confines itself."""
    paths = [os.path.dirname(os.path.dirname(os.path.abspath(runtimes.__file__)))]
    seccomp_dir = os.path.dirname(os.path.abspath(pyseccomp.__file__))
    if seccomp_dir not in paths:
        paths.append(seccomp_dir)
    return paths
