"""A language runtime behind the jail: its mode, its zygotes, a schedule, and the one run path.

`run(request)` is the only way a run is served, locally and on Lambda: take a
confined child from the schedule, hand it the run, collect the outcome, and let
the schedule say when the run may answer (schedule.py: pooled for the server,
serial for a Lambda function and `sandlot run --local`). The mode (modes.py) is
chosen at start from the probed protections record; what the runtime sets up
for it (a uid block, egress rules, the runs' network, trees, /tmp caps) is its
`provisions` (provisions.py); what it reports of itself, health.py.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import TYPE_CHECKING

from runtimes.config import RuntimeConfig
from runtimes.jail import modes
from runtimes.jail.policy import network_access
from runtimes.jail.service import health
from runtimes.jail.service.execution import execute
from runtimes.jail.service.language import LanguageHooks
from runtimes.jail.service.pool import MAIN, ChildPool
from runtimes.jail.service.provisions import Provisions
from runtimes.jail.service.schedule import PooledSchedule, Schedule
from runtimes.jail.service.serial import SerialSchedule
from runtimes.jail.service.supervisor import ZygoteHandle
from runtimes.linux.protections import Protections, platform_protections
from runtimes.payload import RunResult, Unavailable

if TYPE_CHECKING:
    from runtimes.payload import RunRequest

log = logging.getLogger("sandlot.runtime")


class JailedRuntime(LanguageHooks):
    """A language's runtime: the base of PythonRuntime and NodeRuntime, which override only the hooks
    language.py declares, and extend (calling the base's) `start()`, `stop()`, `start_zygote(kind)`,
    `zygote_retired(zygote)`, `status()`, `ready` and `error`. Where one run at a time starts on a zygote
    for the first run alone (serial.py), a language sets `first_run_apart` in its __init__; the base clears
    it once that run is over, and the language's next zygotes are the usual ones. A language reads `config`,
    `mode`, `platform`, `pool`, `schedule`, `provisions`, `run_network` and `report`; nothing else of the base.
    """

    def __init__(self, config: RuntimeConfig):
        self.config = config
        self.pool: ChildPool | None = None
        self.schedule: Schedule | None = None
        self.platform: Protections | None = None  # what this platform lets the jail do (probed at start)
        self.mode: modes.Mode | None = None  # chosen at start (modes.py)
        self.provisions: Provisions | None = None  # what the mode set up (made once it is chosen)
        self.refused = ""  # a reason runs are refused for good (no seccomp, no jail)
        self.started = False
        self._started = asyncio.Event()  # set once start() is over, whatever its end: runs wait for it
        self.on_layer_unused: list = []  # called with a layer path no zygote uses any more
        self.first_run_apart = False  # the serial schedule's first run has a zygote of its own (see above)
        self._left_out: dict[str, dict] = {}  # by kind of zygote: the preload failures last logged
        self.zygote_started_ahead = False  # a zygote of it was one started ahead of its config (zygote_start.py)

    # ---- life cycle -----------------------------------------------------------------------------

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
            health.refuse_unless_jailed(config, self.platform, self.mode)
            self.provisions = provisions = Provisions(config, self.language, self.mode, self.platform)
            await provisions.set_up()
            if self.run_network.kind != network_access.FILTERED:
                log.warning("%s: %s", self.language, self.run_network.log_line)
            self.pool = ChildPool(
                self.start_zygote,
                provisions.pool_uids,
                provisions.pool_tmp_parent,
                config.zygote_max_forks,
                max_age=config.zygote_max_age,
                sweep_uids=self.mode.processes == modes.UID_SWEEP and self.mode.own_uid,
                rotate_in_background=not config.one_run_at_a_time,
                run_dirs=provisions.run_dirs,
                thread_cap=provisions.thread_cap,
                kinds=self.zygote_kinds(),
            )
            self.pool.on_retired.append(self.zygote_retired)
            if not config.one_run_at_a_time:  # before the first zygote: it fills up whenever a zygote runs
                self.schedule = PooledSchedule(
                    self.pool, self.ready_targets(), self.idle_targets(), self.park_targets()
                )
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
            self.refused = health.no_seccomp(self.report.get("seccomp_error") or "")
            log.error("%s runs refused: %s", self.language, self.refused)
            if config.one_run_at_a_time:
                await self.pool.stop()  # a function that refuses every run keeps no zygote for them
            return
        if self.schedule is None:
            self.schedule = self._serial_schedule()
        await self.schedule.start()
        if provisions.trees is not None:  # the trees no instance uses (an older layer's, a killed build's) go
            self.pool.background(asyncio.to_thread(provisions.collect_trees))

    def _serial_schedule(self) -> SerialSchedule:
        unfiltered = not self.filter_in_force
        return SerialSchedule(
            self.pool,
            self.default_variant(),
            sweep_uid=unfiltered and self.mode.processes == modes.UID_SWEEP,
            wait_for_namespace=unfiltered and self.mode.pid_namespace,
            scratch=self.provisions.scratch(),
            first_run=self._first_run_over if self.first_run_apart else None,
        )

    def _first_run_over(self) -> None:
        self.first_run_apart = False  # the zygotes from now on are the usual ones

    @property
    def report(self) -> dict:
        """What the current zygote said when it was ready (seccomp, preloads)."""
        return self.pool.report if self.pool is not None else {}

    @property
    def filter_in_force(self) -> bool:
        """The zygote loads the seccomp filter, and the platform's record agrees that it can (a probe child
        killed by SIGSYS must not pass for a filter that loads)."""
        return bool(self.report.get("seccomp")) and (self.platform is None or self.platform.seccomp)

    async def start_zygote(self, kind: str = MAIN) -> ZygoteHandle:
        """A new zygote of that kind, started (the pool's call, at start and at each rotation)."""
        config_for = functools.partial(self.zygote_config, kind)
        zygote = await self.provisions.start_zygote(self.interpreter(), self.layer(), self.tree, config_for, self.pool)
        self.zygote_started_ahead |= zygote.started_ahead
        health.log_left_out(self.language, kind, zygote.report, self._left_out)
        return zygote

    # ---- dependency layers ----------------------------------------------------------------------

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

    def zygote_retired(self, zygote: ZygoteHandle) -> None:
        """A zygote and all its children are gone: its layer, and its tree, may be unused now."""
        if self.provisions is not None:
            self.provisions.zygote_retired(zygote, self.pool)
        for callback in self.on_layer_unused:
            if zygote.tag and zygote.tag != self.layer() and not self.pool.uses_tag(zygote.tag):
                callback(zygote.tag)

    async def stop(self) -> None:
        if self.schedule is not None:
            await self.schedule.stop()
        if self.pool is not None:
            await self.pool.stop()
        if self.provisions is not None:
            self.provisions.close()

    # ---- health -----------------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """A run can be served (health.ready)."""
        return health.ready(self)

    @property
    def error(self) -> str:
        """Why runs cannot be served now, or "" (health.error)."""
        return health.error(self)

    def status(self) -> dict:
        return health.status(self)

    def protections(self) -> dict:
        """What each run gets in this runtime's mode (README: protections per run; health.py)."""
        return health.protections(self)

    def build_image_tree(self, into: str = "", slots: int = 0) -> list[tuple[str, bool]]:
        """The chroot jail's trees of this runtime, and their cells by slot, built into an image (`sandlot layers
        trees`, the service image's Dockerfile: trees/image_trees.py): its tree, and its layer-less one, to which a
        container adds an operator's layer (one tree where there is no layer); (each one's path, whether it was
        built now)."""
        from runtimes.jail.trees import image_trees

        into, slots = into or image_trees.IMAGE_TREES, slots or image_trees.DEFAULT_SLOTS
        wanted = (self.tree().to_dict(), self.tree(layer=False).to_dict())
        specs = {image_trees.image_key(spec): spec for spec in wanted}  # one where there is no layer
        return [image_trees.build(spec, into, slots) for spec in specs.values()]

    # ---- runs -------------------------------------------------------------------------------------

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
