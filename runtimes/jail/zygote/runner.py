"""What the zygote (loop.py) calls on a language runner: a module, named in the zygote's config.

The runner modules (runtimes.python.runner, runtimes.nodejs.runner) are
imported by name in the zygote, so their names are part of the wire between
service and zygote and do not change. Each provides, at module level:

- `REPORTS_EXIT`: the child keeps the ready pipe as fd 3 and reports its exit
  status on it (else the zygote's child closes it before the runner runs);
- `prepare(config)`: in the zygote, before it confines itself, with the
  runner's part of the config (a `RunnerConfig` subclass): build what every
  run needs (the seccomp filters) and return the runner's state, whose
  `report` the zygote passes on to the service;
- `warm(state)`: in the zygote, inside its tree, before the first fork: import
  what runs use (the dependency layer); returns more of the report;
- `as_pid_one(state)`: in the zygote, once, where every child will be pid 1 of
  a PID namespace of its own (the signal shims); may do nothing;
- `run(state, address_space, variant)`: in a confined child: read the run, set
  its limits, load the filter, run the code. Never returns.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, NoReturn, Protocol, runtime_checkable


class RunnerState(Protocol):
    report: dict  # what prepare() found (seccomp loads here, or why not)


@runtime_checkable
class Runner(Protocol):
    REPORTS_EXIT: bool

    def prepare(self, config: Any) -> RunnerState: ...  # config: the runner's RunnerConfig subclass

    def warm(self, state: Any) -> dict: ...

    def as_pid_one(self, state: Any) -> None: ...

    def run(self, state: Any, address_space: int, variant: Mapping) -> NoReturn: ...


def load(name: str) -> Runner:
    """The runner module by its name, checked to provide what the zygote calls."""
    module = importlib.import_module(name)
    if not isinstance(module, Runner):
        missing = [a for a in ("REPORTS_EXIT", "prepare", "warm", "as_pid_one", "run") if not hasattr(module, a)]
        raise TypeError(f"{name} is not a runner: it has no {', '.join(missing)}")
    return module
