"""The Python runner's part of the zygote's configuration (runtimes/jail/zygote_config.py).

A small module of its own: the service (runtime.py) fills it, the zygote (runner.py) reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

from runtimes.jail.zygote_config import RunnerConfig


@dataclass(frozen=True)
class PythonRunnerConfig(RunnerConfig):
    preload: tuple[str, ...] = ()  # the layer's modules to import ahead (empty: every top-level one of the layer)
    layer_path: str = ""  # the layer as runs see it ("" for none)
    lazy: bool = False  # import nothing of the layer ahead (the lean zygote, or a function's first)
