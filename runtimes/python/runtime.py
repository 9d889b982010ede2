"""The Python runtime: a warm zygote that has imported the dependency layer forks each run."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import subprocess

from runtimes import tree
from runtimes.jail import protocol
from runtimes.jail.runtime import JailedRuntime
from runtimes.payload import RunRequest, Unavailable

log = logging.getLogger("sandlot.runtime")


@functools.lru_cache(maxsize=8)
def interpreter_paths(python: str) -> dict:
    """Where that interpreter keeps its standard library, asked of the interpreter itself."""
    script = (
        "import json, sys, sysconfig\n"
        "p = sysconfig.get_paths()\n"
        "print(json.dumps({'stdlib': p['stdlib'], 'platstdlib': p['platstdlib'],"
        " 'purelib': p['purelib'], 'platlib': p['platlib'],"
        " 'dynload': next((d for d in sys.path if d.endswith('lib-dynload')), '')}))\n"
    )
    out = subprocess.run([python, "-I", "-S", "-c", script], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


class PythonRuntime(JailedRuntime):
    """A server's first zygote imports nothing of the layer (it is up in a fraction of the time: runs are
    served at once, and a run that imports a package pays for it); a preloaded one replaces it in the
    background, and only then does the runtime say it is ready (/health)."""

    language = "python3"
    runner = "runtimes.python.runner"

    def __init__(self, config):
        super().__init__(config)
        self._lazy = False  # the zygote being started is the first of a server's
        self._preloading = False  # serving from that first zygote while the preloaded one starts

    async def start(self) -> None:
        self._lazy = not self.config.one_run_at_a_time and bool(self.config.python_layer)
        try:
            await super().start()
        finally:
            lazy, self._lazy = self._lazy, False
        if lazy and super().ready:
            self._preloading = True
            self.pool.background(self._preloaded())

    async def _preloaded(self) -> None:
        try:
            await self.pool.replace_zygote()
            for _ in range(500):  # ready once the first has gone too (its ready children are killed now)
                if not self.pool.retiring:
                    break
                await asyncio.sleep(0.01)
        except Unavailable as exc:  # the lazy one goes on serving; rotation tries again later
            log.warning("python3: the preloaded zygote did not start: %s", exc)
        finally:
            self._preloading = False

    @property
    def ready(self) -> bool:
        return super().ready and not self._preloading

    def interpreter(self) -> str:
        return self.config.python_path

    def tree(self) -> tree.TreeSpec:
        python = os.path.realpath(self.config.python_path)
        paths = interpreter_paths(python)
        spec = tree.TreeSpec()
        spec.add(python, paths["stdlib"], paths["platstdlib"])
        layer = self.config.python_layer
        elf = [python, *tree.elf_files_under(paths["dynload"])]
        if layer:
            spec.add(layer)
            elf += tree.elf_files_under(layer)
        spec.add(*tree.shared_libraries(elf, cache_dir=self.config.data_dir))
        tree.run_system_files(spec, self.run_hostname())
        for site in {paths["purelib"], paths["platlib"]}:  # the interpreter's own packages stay out
            if os.path.isdir(site):
                spec.hidden.append(site)
        return spec

    def runner_config(self) -> dict:
        return {
            **super().runner_config(),
            "preload": list(self.config.python_preload) if self.config.python_layer else [],
            "layer_path": self.config.python_layer,
            "lazy": self._lazy,
        }

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
        return protocol.run_input(options, request.stdin)
