"""The local backend's dependency layers: one store per language, rebuilt and switched on request.

update/refresh build a new layer directory (pip or npm, unprivileged), then ask
the runtime to start a zygote on it and retire the old one. A failed build or a
zygote that cannot start on the new layer leaves the old layer serving. The old
directory is removed once no zygote uses it.

One build at a time, whichever language: a build takes a core or two and the
runs being served must not feel it twice. Builds run at nice BUILD_NICE (their
own thread's priority, which pip and npm inherit), so that runs come first.
Every build has a record (layers/builds.py) with its log as it comes: the
package manager (layers/packages.py) makes its own; for the others (the update
routes, the periodic refresh) `recorder` makes one.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from layers.builds import SWITCHING, Build
from layers.requested import RequestedPackages
from layers.store import LayerBuildError, LayerStore, Requested

log = logging.getLogger("sandlot.layers")

BUILD_NICE = 10  # runs (nice 0) get about ten times a build's share of a busy core


def _lower_priority() -> None:
    """In the build thread only (Linux priorities are per thread; the processes it starts inherit it)."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, BUILD_NICE)
    except OSError:
        pass


@dataclass
class Layer:
    store: LayerStore
    list_installed: Callable[[str], list[dict[str, str]]]
    packages: RequestedPackages | None = None  # what an operator asked for on top of the base (layers/requested.py)
    base_names: Callable[[], set[str]] = set  # the packages the base file names
    base_file: Callable[[], str] = str  # the base file's path, for the operator


class LayerManager:
    def __init__(self, layers: dict[str, Layer]):
        self.layers = layers
        self._lock = asyncio.Lock()  # one build at a time, whichever language
        self._builder = ThreadPoolExecutor(1, thread_name_prefix="layer-build", initializer=_lower_priority)
        self.recorder: Callable[[str, str], Build] | None = None  # (language, trigger) -> a record for the build

    def ensure(self, language: str) -> str:
        """The layer to start on: built now if there is none for the current sources."""
        return self.layers[language].store.ensure()

    def wants_build(self, language: str) -> bool:
        """No layer of the current sources is there: ensure() would build one."""
        return self.layers[language].store.existing() is None

    async def build_at_start(self, language: str) -> str:
        """ensure(), in a thread, while the service starts (handler/local_invoker.py): the other runtimes and the
        web stack start beside it; one build at a time with those the package routes ask for meanwhile. At the
        service's own priority, not BUILD_NICE: the start's first run of that language waits for it, and what it
        shares the cores with then is the rest of the start (the other runtime's zygotes, the web stack's imports),
        which BUILD_NICE would put ahead of it tenfold."""
        async with self._lock:
            return await asyncio.to_thread(self.ensure, language)

    def current(self, language: str) -> str:
        layer = self.layers.get(language)
        return layer.store.current if layer else ""

    def installed(self, language: str) -> list[dict[str, str]]:
        layer = self.layers.get(language)
        return layer.list_installed(layer.store.current) if layer else []

    def retire(self, language: str) -> Callable[[str], None]:
        return self.layers[language].store.retire

    @property
    def building(self) -> bool:
        return self._lock.locked()

    async def rebuild(
        self,
        language: str,
        runtime,
        requested: Requested = None,
        record: Build | None = None,
        trigger: str = "update",
        switched: Callable[[str], None] | None = None,
    ) -> str:
        """Build a new layer (from the sources and `requested`, or the serving layer's requested packages) and
        switch the runtime to it. Concurrent calls wait their turn. The record (made by `recorder` when not
        given) follows the build; switched(path) runs once the runtime serves the new layer, before anything else
        can build."""
        store = self.layers[language].store
        if record is None and self.recorder is not None:
            record = self.recorder(language, trigger)
        async with self._lock:
            if record is not None:
                record.start()
                record.say(f"building the {language} layer")
            try:
                output = record.output if record else None
                loop = asyncio.get_running_loop()
                path = await loop.run_in_executor(self._builder, store.rebuild, requested, output)
            except Exception as exc:
                if record is not None:
                    record.say("the build failed; the old layer keeps serving")
                    record.finish(str(exc) if isinstance(exc, LayerBuildError) else f"{type(exc).__name__}: {exc}")
                raise
            store.use(path)
            old, store.current = store.current, path  # before the switch: the old one retires during it
            if record is not None:
                record.state, record.layer = SWITCHING, path
                record.say(f"built {path}; starting the runtime on it")
            try:
                await runtime.switch_layer(path)
            except Exception as exc:
                store.current = old
                store.retire(path)
                error = f"the new layer could not be started: {exc}"
                if record is not None:
                    record.say(f"{error}; the old layer keeps serving")
                    record.finish(error)
                raise LayerBuildError(error) from exc
            log.info("%s layer is now %s (was %s)", language, path, old or "none")
            if switched is not None:
                switched(path)
            if record is not None:
                record.say(f"the {language} runtime now serves {path}")
                record.finish()
            return path


def parse_interval(value: str) -> float:
    """dify-sandbox's PYTHON_DEPS_UPDATE_INTERVAL: "30m", "1h", "90s", plain seconds; "" or 0 is off."""
    value = (value or "").strip().lower()
    if not value:
        return 0.0
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    total, number = 0.0, ""
    for char in value:
        if char.isdigit() or char == ".":
            number += char
        elif char in units and number:
            total += float(number) * units[char]
            number = ""
        else:
            raise ValueError(f"not a duration: {value!r}")
    return total + (float(number) if number else 0.0)
