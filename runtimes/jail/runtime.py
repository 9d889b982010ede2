"""A language runtime behind the jail: a zygote, a pool of ready children, and runs.

Subclasses say what the tree holds, which runner the zygote loads, and how a
run request is put on the child's stdin.
"""

from __future__ import annotations

import asyncio
import glob
import logging
import os
import stat
import tempfile

import pyseccomp

import runtimes
from runtimes import dirlock
from runtimes.config import MIB, RuntimeConfig
from runtimes.jail import modes
from runtimes.jail.egress import EgressFilter
from runtimes.jail.execution import execute
from runtimes.jail.pool import ChildPool
from runtimes.jail.protections import Protections, platform_protections
from runtimes.jail.supervisor import SandboxUnavailable, Zygote
from runtimes.jail.uids import UidPool
from runtimes.jail.userspace_net import NamespaceNetwork
from runtimes.jail.userspace_net import plan as plan_network
from runtimes.payload import RunRequest
from runtimes.tree import TreeSpec

log = logging.getLogger("sandlot.runtime")


class JailedRuntime:
    language = ""
    runner = ""

    def __init__(self, config: RuntimeConfig):
        self.config = config
        self.pool: ChildPool | None = None
        self.report: dict = {}
        self.platform: Protections | None = None  # what this platform lets the jail do (probed at start)
        self.mode = ""  # full | userns | single (modes.py), chosen at start
        self._zygote_uid = -1  # userns as root: the uid zygotes drop to
        self.refused = ""  # a reason runs are refused for good (no seccomp, no jail)
        self.started = False
        self._uids: UidPool | None = None
        self._tmp_parent: tempfile.TemporaryDirectory | None = None
        self._tree_root = ""
        self._tree_root_lock = -1  # held while this instance may still start zygotes on that mount point
        self._egress: EgressFilter | None = None
        self._network: NamespaceNetwork | None = None  # userns without root: the runs' own network namespace
        self.on_layer_unused: list = []  # called with a layer path no zygote uses any more

    # ---- for subclasses --------------------------------------------------------

    def interpreter(self) -> str:
        raise NotImplementedError

    def missing(self) -> str:
        """Why this runtime cannot exist on this machine (e.g. no node), or ""."""
        return ""

    def tree(self) -> TreeSpec:
        raise NotImplementedError

    def runner_config(self) -> dict:
        return {"require_seccomp": self.config.require_seccomp, "extra_syscalls": list(self.config.extra_syscalls)}

    def encode(self, request: RunRequest, timeout: float) -> bytes:
        """What the child reads on stdin for this run (timeout: the run's own, already capped)."""
        raise NotImplementedError

    def variant(self, request: RunRequest) -> tuple:
        """Which kind of child a run needs (the runner learns the rest from stdin)."""
        return ()

    def ready_targets(self) -> dict[tuple, int]:
        """How many children of each variant to keep ready."""
        return {(): self.config.workers}

    # ---- life cycle -----------------------------------------------------------

    async def start(self) -> None:
        config = self.config
        if self.missing():
            self.refused = self.missing()
            self.started = True
            log.warning("%s runs refused: %s", self.language, self.refused)
            return
        try:
            self.platform = await asyncio.to_thread(platform_protections)
            self.mode = modes.select(config.jail, self.platform, config.one_run_at_a_time)
            log.info("%s jail: %s", self.language, self.mode)
            tmp_parent = self._claim_identities()
            self._network = self._plan_network()
            self._tree_root, self._tree_root_lock = _make_tree_root(self.language)
            per_run_uids = self._uids if self.mode == modes.FULL else None
            # one run at a time: nothing is kept ready here (jail/oneshot.py prepares children once a run is over)
            targets = {} if config.one_run_at_a_time else self.ready_targets()
            self.pool = ChildPool(
                self._start_zygote,
                per_run_uids,
                tmp_parent,
                targets,
                config.zygote_max_forks,
                max_age=config.zygote_max_age,
            )
            self.pool.on_retired.append(self.zygote_retired)
            self.report = await self.pool.start()
        except modes.JailRefused as exc:
            self.refused = str(exc)
            self.started = True
            log.error("%s runs refused: %s", self.language, self.refused)
            return
        except Exception as exc:  # noqa: BLE001 - whatever it is, runs get a -500 saying so
            log.exception("%s runtime unavailable: %s", self.language, exc)
            if self.pool is None:
                self.refused = str(exc)  # nothing to retry with
            self.started = True  # the pool keeps trying to start a zygote
            return
        if not self.report.get("seccomp") and config.require_seccomp:
            self.refused = f"the seccomp filter cannot be installed here: {self.report.get('seccomp_error')}"
            log.error("%s runs refused: %s", self.language, self.refused)
        if self.report.get("preload_failed"):
            log.warning("%s: left out of the preload: %s", self.language, self.report["preload_failed"])
        self.started = True

    def _claim_identities(self) -> str | None:
        """As root: a uid block and egress rules for it (userns: one uid of it for the zygotes and their runs).
        single: a parent for per-run directories. userns without root: nothing (runs keep the service's uid)."""
        config = self.config
        if self.mode == modes.SINGLE:
            self._tmp_parent = tempfile.TemporaryDirectory(prefix=f"sandlot-{self.language}-")
            return self._tmp_parent.name
        if os.geteuid() != 0:
            return None
        self._uids = UidPool(config.uid_base, config.uid_count, "/run/sandlot")
        if self.mode == modes.USERNS:
            self._zygote_uid = self._uids.acquire()
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
        if self.mode != modes.USERNS or os.geteuid() == 0 or self.platform is None:
            return None
        network = plan_network(self.platform, self.config.pasta, self.config.egress_allow, self._proxies())
        if network.refused:
            log.warning("%s: %s", self.language, network.refused)
        return network

    def _proxies(self) -> tuple[str, ...]:
        return tuple(v for k, v in self.config.run_env.items() if k.isupper())

    def zygote_config(self) -> dict:
        """What a new zygote is started with, from the current layer and settings."""
        config = self.config
        return {
            "import_paths": _import_paths(),
            "runner": self.runner,
            "runner_config": self.runner_config(),
            "tree": self.tree().to_dict() if self.mode in modes.TREE_MODES else None,
            "tree_root": self._tree_root,
            "zygote_uid": self._zygote_uid,
            "network": self._network.zygote_config() if self._network else None,
            "plan": {
                "mode": self.mode,
                "landlock": self.platform.landlock if self.platform else 0,
                "time_namespace": bool(self.platform and self.platform.time_namespaces)
                and self.mode in modes.TREE_MODES,
                "tmp_size_bytes": config.tmp_size_mb * MIB,
                "tmp_files": config.tmp_files,
                "max_open_files": config.max_open_files,
                "max_threads": config.max_threads,
                "max_file_bytes": config.max_file_mb * MIB,
            },
        }

    async def _start_zygote(self) -> Zygote:
        zygote = Zygote(self.interpreter(), self.zygote_config(), self.config.environment(), network=self._network)
        zygote.tag = self.layer()
        await zygote.start()
        failed = zygote.network_error
        if failed and self._network is not None and not self._network.refused:
            self._network = self._network.failed(failed)
            log.error("%s: %s", self.language, self._network.refused)
        return zygote

    # ---- dependency layers ------------------------------------------------------

    def layer(self) -> str:
        """The dependency layer this runtime's zygotes are started on ("" for none)."""
        return ""

    def set_layer(self, path: str) -> None:
        raise NotImplementedError

    async def switch_layer(self, path: str) -> None:
        """Start a zygote on the new layer and retire the old one: runs in flight finish on
        the old layer, runs after the switch see the new one. Raises if the new one cannot start."""
        if self.pool is None:
            raise SandboxUnavailable(f"the {self.language} runtime is not running")
        old_layer = self.layer()
        self.set_layer(path)
        try:
            report = await self.pool.replace_zygote()
        except SandboxUnavailable:
            self.set_layer(old_layer)
            raise
        self.report = report
        if report.get("preload_failed"):
            log.warning("%s: left out of the preload: %s", self.language, report["preload_failed"])

    def zygote_retired(self, zygote: Zygote) -> None:
        """A zygote and all its children are gone: its layer may be unused now."""
        for callback in self.on_layer_unused:
            if zygote.tag and zygote.tag != self.layer() and not self.pool.uses_tag(zygote.tag):
                callback(zygote.tag)

    async def stop(self) -> None:
        if self.pool is not None:
            await self.pool.stop()
        if self._egress is not None:
            self._egress.remove()
        if self._uids is not None:
            self._uids.close()
        if self._tmp_parent is not None:
            self._tmp_parent.cleanup()
        if self._tree_root:
            os.close(self._tree_root_lock)
            os.rmdir(self._tree_root)  # only ever a mount point, in the zygotes' own namespaces

    @property
    def ready(self) -> bool:
        return self.started and self.pool is not None and self.pool.running and not self.refused

    @property
    def error(self) -> str:
        if self.refused:
            return self.refused
        if self.pool is None or not self.started:
            return "starting"
        return "" if self.pool.running else self.pool.last_error or "the zygote is down"

    def status(self) -> dict:
        return {
            "ready": self.ready,
            "installed": not self.missing(),
            "error": self.error,
            "protections": self.protections(),
            "platform": self.platform.to_dict() if self.platform else None,
            "preloaded": self.report.get("preloaded", []),
            "preload_failed": self.report.get("preload_failed", {}),
            **(self.pool.status() if self.pool else {}),
        }

    def protections(self) -> dict:
        """What each run gets in this runtime's mode (README: protections per run)."""
        mode = self.mode
        tree = mode in modes.TREE_MODES
        landlock = self.platform.landlock if self.platform else 0
        return {
            "mode": mode,
            "fresh_process": True,
            "seccomp": bool(self.report.get("seccomp")),
            "chroot": tree,  # only the read-only tree is visible (pivot_root)
            "own_uid": mode == modes.FULL,
            "user_namespace": mode == modes.USERNS,
            "pid_namespace": tree,  # the run's processes die with its init; no other process can be named
            "capabilities": "none",
            "private_tmp": "tmpfs" if tree else "directory",
            "landlock": landlock,
            "time_namespace": bool(self.report.get("time_namespace")),  # clocks from zero: no host uptime
            "rlimits": True,
            "scrubbed_environment": True,
            "egress_filter": bool(self._egress and self._egress.installed)
            or bool(self._network and self._network.in_force),
            "network_namespace": bool(self._network and self._network.netns),  # the runs' own (userns without root)
            "network_refused": self._network.refused if self._network else "",
        }

    # ---- runs -----------------------------------------------------------------

    async def run(self, request: RunRequest) -> dict:
        if self.refused:
            raise SandboxUnavailable(self.refused)
        if self.pool is None or not self.started:
            raise SandboxUnavailable(f"the {self.language} runtime is starting")
        if request.enable_network and self._network is not None and self._network.refused:
            raise SandboxUnavailable(self._network.refused)
        timeout = self.config.clamp_timeout(request.timeout)
        child = await self.pool.take(self.variant(request))
        try:
            outcome = await execute(child, self.encode(request, timeout), timeout, self.config.output_limit)
        finally:
            self.pool.finish(child)
        return outcome.to_result()


def _import_paths() -> list[str]:
    """Where the zygote finds this package and pyseccomp before it confines itself."""
    paths = [os.path.dirname(os.path.dirname(os.path.abspath(runtimes.__file__)))]
    seccomp_dir = os.path.dirname(os.path.abspath(pyseccomp.__file__))
    if seccomp_dir not in paths:
        paths.append(seccomp_dir)
    return paths


TREE_ROOT_PREFIX = "sandlot-root-"


def _make_tree_root(language: str) -> tuple[str, int]:
    """An empty directory for the zygotes' tree to be mounted on (in their own namespaces), and a lock on it.

    Instances that were killed (no stop) leave theirs behind: those whose instance
    is gone (the pid in the name) and that no instance holds a lock on are removed
    first.
    """
    parent = tempfile.gettempdir()
    for path in glob.glob(os.path.join(parent, f"{TREE_ROOT_PREFIX}*-*-*")):
        try:
            info = os.lstat(path)
            owner = int(os.path.basename(path).rsplit("-", 2)[-2])
        except (OSError, ValueError):
            continue  # not one of ours (an older instance's names carry no pid: left alone)
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not _alive(owner):
            dirlock.remove_if_unlocked(path)
    root = tempfile.mkdtemp(prefix=f"{TREE_ROOT_PREFIX}{language}-{os.getpid()}-", dir=parent)
    return root, dirlock.lock_shared(root)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another uid's: alive
    return True
