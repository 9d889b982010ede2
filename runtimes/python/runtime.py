"""The Python runtime: a warm zygote forks each run, the one that has imported the dependency layer or a lean one."""

from __future__ import annotations

import functools
import json
import logging
import os
import subprocess
from typing import TYPE_CHECKING

from runtimes.jail import protocol
from runtimes.jail.policy import tree_files
from runtimes.jail.service.pool import KIND, MAIN
from runtimes.jail.service.runtime import JailedRuntime
from runtimes.linux import rootfs
from runtimes.python.imports import imported_modules
from runtimes.python.runner_config import PythonRunnerConfig

if TYPE_CHECKING:
    from runtimes.payload import RunRequest

log = logging.getLogger("sandlot.runtime")

LEAN = "lean"  # the zygote that imports nothing of the layer
LEAN_VARIANT = ((KIND, LEAN),)


PATHS_CACHE = "interpreter-paths.json"  # in the data dir, as the libraries ldd found (rootfs.shared_libraries)
PATH_KEYS = ("stdlib", "platstdlib", "purelib", "platlib", "dynload")


@functools.lru_cache(maxsize=8)
def interpreter_paths(python: str, cache_dir: str = "") -> dict:
    """Where that interpreter keeps its standard library, asked of the interpreter itself, once: with cache_dir,
    its answer is kept there under the interpreter's identity (and that of a pyvenv.cfg beside it, which moves its
    prefix), so that a start does not wait for another interpreter's start (a zygote's tree needs it first)."""
    where = os.path.dirname(python)
    depends = [python, os.path.join(where, "pyvenv.cfg"), os.path.join(os.path.dirname(where), "pyvenv.cfg")]
    return rootfs.remembered(PATHS_CACHE, depends, lambda: _ask_interpreter(python), _paths_there, cache_dir)


def _paths_there(known: object) -> bool:
    return (
        isinstance(known, dict)
        and set(known) == set(PATH_KEYS)
        and all(isinstance(value, str) for value in known.values())
        and os.path.isdir(known["stdlib"])
    )


def _ask_interpreter(python: str) -> dict:
    script = (
        "import json, sys, sysconfig\n"
        "p = sysconfig.get_paths()\n"
        "print(json.dumps({'stdlib': p['stdlib'], 'platstdlib': p['platstdlib'],"
        " 'purelib': p['purelib'], 'platlib': p['platlib'],"
        " 'dynload': next((d for d in sys.path if d.endswith('lib-dynload')), '')}))\n"
    )
    out = subprocess.run([python, "-I", "-S", "-c", script], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


PARK_SECONDS = 60.0  # the preloaded zygote parked after this long without a run that needs it


class PythonRuntime(JailedRuntime):
    """Two zygotes where the runtime has a layer and serves many runs: a lean one, which imports nothing of
    the layer, and the preloaded one. Forking the lean one costs a fifth less (a smaller heap to copy and
    write), so a run whose code imports only what the lean zygote holds (`print`, Dify's wrapper: json,
    base64) is forked there, and every other run from the preloaded one (imports.py reads the code). The lean
    one starts first and serves every run at once; the runtime says it is ready (/health) once the
    preloaded one is up too. The preloaded one alone for one run at a time (a Lambda function, `sandlot run
    --local`), and without root where runs have a network namespace (a pasta per zygote)."""

    language = "python3"
    runner = "runtimes.python.runner"

    def __init__(self, config):
        super().__init__(config)
        self._lean_report: dict | None = None
        self._lean_held: frozenset[str] = frozenset()
        # one run at a time (a Lambda function, `sandlot run --local`): the first run, often the only one (a
        # fresh environment per run or per new tenant), does not wait for the layer's preload; its zygote
        # is lean, and the serial schedule replaces it with the preloaded one once that run is over
        self.first_run_apart = config.one_run_at_a_time and bool(config.python_layer)

    def zygote_kinds(self) -> tuple[str, ...]:
        if self.config.one_run_at_a_time or not self.config.python_layer:
            return (MAIN,)
        if self.provisions is not None and self.provisions.own_network_namespace:
            return (MAIN,)  # each zygote would bring a network namespace and a pasta of its own (28 MiB)
        return (LEAN, MAIN)

    @property
    def ready(self) -> bool:
        return super().ready and (self.pool.kind_running(MAIN) or self.pool.parked(MAIN))

    @property
    def error(self) -> str:
        error = super().error
        if error or self.pool is None or self.pool.kind_running(MAIN) or self.pool.parked(MAIN):
            return error
        return self.pool.error_of(MAIN) or "the preloaded zygote is starting"

    def variant(self, request: RunRequest) -> tuple:
        pool = self.pool
        if pool is None or LEAN not in pool.kinds or not pool.kind_running(LEAN):
            return ()
        code = f"{request.preload}\n{request.code}" if request.preload and self.config.enable_preload else request.code
        needed = imported_modules(code)
        lean = needed is not None and needed <= self._lean_modules()
        if not pool.kind_running(MAIN):
            if not lean and pool.parked(MAIN) and self.schedule is not None:
                self.schedule.wake(())  # parked while idle: started again for the runs after this one
            return LEAN_VARIANT  # the preloaded one is starting: the lean one serves every run meanwhile
        return LEAN_VARIANT if lean else ()

    def _lean_modules(self) -> frozenset[str]:
        """The modules the lean zygote holds (as it said when ready)."""
        report = self.pool.report_of(LEAN)
        if self._lean_report is not report:
            self._lean_report, self._lean_held = report, frozenset(report.get("modules", ()))
        return self._lean_held

    def ready_targets(self) -> dict[tuple, int]:
        return {variant: self.config.workers for variant in self._variants()}

    def idle_targets(self) -> dict[tuple, int]:
        """Idle, one ready child of the zygote most runs need (the lean one, where there is one): a ready child
        of the other would hold 1.8 MiB more for runs that, after 20 s without one, may wait for a fork."""
        return {self._variants()[0]: 1}

    def park_targets(self) -> dict[tuple, float]:
        """The preloaded zygote (about 30 MiB of its own) is parked after PARK_SECONDS without a run that needs
        it; the next such run is served by the lean one, which imports what it asks for (its import time is
        then the run's), while the preloaded one starts again (docs/benchmarks.md: the idle row)."""
        return {(): PARK_SECONDS} if LEAN in self.pool.kinds else {}

    def _variants(self) -> tuple[tuple, ...]:
        """The kinds of child the pool's zygotes make (the schedule's targets are set once the pool exists)."""
        return (LEAN_VARIANT, ()) if LEAN in self.pool.kinds else ((),)

    def interpreter(self) -> str:
        return self.config.python_path

    def tree(self, layer: bool = True) -> rootfs.TreeSpec:
        """The chroot mode's tree; without layer, the same but for the layer and the libraries only its ELF files
        load (the image's layer-less tree, to which a container adds an operator's layer: image_trees.additions)."""
        python = os.path.realpath(self.config.python_path)
        paths = interpreter_paths(python, self.config.data_dir)
        spec = rootfs.TreeSpec()
        spec.add(python, paths["stdlib"], paths["platstdlib"])
        layer = self.config.python_layer if layer else ""
        # the interpreter's libraries, then those only the layer's ELF files load: asked apart, so that the first
        # answer is the layer-less tree's too, and the image's (rootfs.IMAGE_CACHE) whatever the layer
        libraries = rootfs.shared_libraries(
            [python, *rootfs.elf_files_under(paths["dynload"])], cache_dir=self.config.data_dir
        )
        if layer:
            spec.place(tree_files.LAYER_IN_TREE, layer)  # at a fixed path: the data dir's stays out of view
            own = rootfs.system_libraries(
                rootfs.shared_libraries(rootfs.elf_files_under(layer), cache_dir=self.config.data_dir), layer
            )
            libraries += [path for path in own if path not in libraries]
        spec.add(*rootfs.outside(libraries, layer))
        tree_files.run_system_files(spec, self.run_hostname(), self.run_nameservers())
        for site in {paths["purelib"], paths["platlib"]}:  # the interpreter's own packages stay out
            if os.path.isdir(site):
                spec.hidden.append(site)
        return spec

    def runner_config(self, kind: str = MAIN) -> PythonRunnerConfig:
        return PythonRunnerConfig(
            **self.runner_fields(),
            preload=tuple(self.config.python_preload) if self.config.python_layer else (),
            layer_path=self.layer_in_view(),
            lazy=kind == LEAN or self.first_run_apart,
        )

    def layer(self) -> str:
        return self.config.python_layer

    def set_layer(self, path: str) -> None:
        self.config.python_layer = path

    def encode(self, request: RunRequest, timeout: float, network_refused: str = "") -> bytes:
        config = self.config
        options = {
            "code": request.code,
            "preload": request.preload if config.enable_preload else "",
            "enable_network": request.enable_network,
            "timeout": timeout,
            "memory_limit_mb": config.clamp_memory(request.memory_limit_mb),
        }
        if network_refused:
            options["network_refused"] = network_refused  # the runner's audit hook words the refusal
        if self.mode.tmp_note:  # /tmp is not the run's own: its error printing says where to write (runner.py)
            options["tmp_note"] = self.mode.tmp_note
        return protocol.run_input(options, request.stdin)
