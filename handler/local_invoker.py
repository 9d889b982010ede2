"""The LocalInvoker: the runtimes in this process's care (the embedded default) and their layers.

Its seam: a runtime's refusal is already the contract's Unavailable; anything
else a runtime raises while running a request (an OSError of the jail's
machinery, a bug) is logged with its traceback and becomes Unavailable naming
it, so that a client gets the -500 envelope and the service keeps serving.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from layers.manager import LayerManager, parse_interval
from layers.store import LayerBuildError
from runtimes.languages import LANGUAGES
from runtimes.payload import InvalidRequest, RunResult, Throttled, Unavailable

if TYPE_CHECKING:  # pydantic's model (runtimes/payload.py): the runtimes start before pydantic is loaded
    from runtimes.payload import RunRequest

log = logging.getLogger("sandlot.invoker")


class LocalInvoker:
    """Runtimes on this machine, one per language, started with the service."""

    def __init__(
        self,
        runtimes: dict,
        layers: LayerManager | None = None,
        update_interval: str = "",
        build_at_start: frozenset[str] = frozenset(),
    ):
        """build_at_start: the languages whose layer the service's start found missing (an operator's additions
        on a new volume): each is built as its runtime starts (_start), not before the service serves."""
        self.runtimes = runtimes
        self.layers = layers
        self.build_at_start = build_at_start
        self._interval = parse_interval(update_interval)
        self._periodic: asyncio.Task | None = None

    async def start(self) -> None:
        """Every runtime at once, each serving as soon as it is up: a run waits for its own runtime only (the
        Python zygote is ready well before Node's startup snapshot is built)."""
        for language, runtime in self.runtimes.items():
            if self.layers is not None and language in self.layers.layers:
                runtime.on_layer_unused.append(self.layers.retire(language))
        await asyncio.gather(*(self._start(language, runtime) for language, runtime in self.runtimes.items()))
        if self._interval and self.layers is not None:
            self._periodic = asyncio.create_task(self._refresh_periodically())

    async def _start(self, language: str, runtime) -> None:
        if self.layers is not None and language in self.build_at_start:
            await self._build_layer(language, runtime)
        try:
            await runtime.start()
        except Exception:  # noqa: BLE001 - one runtime's failure must not keep the others down
            log.exception("the %s runtime failed to start", language)

    async def _build_layer(self, language: str, runtime) -> None:
        """The runtime's layer, built before it starts, beside the other runtimes' start and the web stack's import:
        its runs wait for it as for any start (within their timeout); if it cannot be built they are refused for
        good, saying why, and the service serves the other languages."""
        try:
            runtime.set_layer(await self.layers.build_at_start(language))
        except Exception as exc:  # noqa: BLE001 - the service stays up: that language's runs say why
            runtime.refused = f"the {language} layer could not be built: {type(exc).__name__}: {exc}"
            logging.getLogger("sandlot.layers").error("%s runs refused: %s", language, runtime.refused)

    async def stop(self) -> None:
        if self._periodic is not None:
            self._periodic.cancel()
        for runtime in self.runtimes.values():
            await runtime.stop()

    async def invoke(self, request: RunRequest) -> RunResult:
        runtime = self.runtimes.get(request.language)
        if runtime is None:
            raise Unavailable(f"no runtime for {request.language} on this service")
        try:
            return await runtime.run(request)
        except (Unavailable, Throttled, InvalidRequest):
            raise
        except Exception as exc:  # noqa: BLE001 - the seam: a -500 naming it, never a crashed request
            log.exception("the %s runtime failed a run", request.language)
            raise Unavailable(f"the {request.language} runtime failed: {type(exc).__name__}: {exc}") from exc

    def ready(self) -> bool:
        """Every runtime this machine can have is serving (a missing node only refuses nodejs runs)."""
        installed = [r for r in self.runtimes.values() if not r.missing()]
        return bool(installed) and all(r.ready for r in installed)

    def status(self) -> dict:
        return {language: {**runtime.status(), "layer": runtime.layer()} for language, runtime in self.runtimes.items()}

    async def dependencies(self, language: str) -> list[dict[str, str]]:
        return self.layers.installed(language) if self.layers is not None else []

    async def update_dependencies(self, language: str) -> None:
        """Rebuild the language's layer and switch to it; LayerBuildError leaves the old one serving."""
        if self.layers is None or language not in self.layers.layers:
            raise LayerBuildError(f"no dependency layer for {language} on this service")
        await self.layers.rebuild(language, self.runtimes[language])

    async def _refresh_periodically(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            for language in LANGUAGES:
                if not language.periodic_refresh:
                    continue
                try:
                    await self.update_dependencies(language.wire_name)
                except LayerBuildError as exc:
                    log.error(
                        "periodic refresh of the %s layer failed; the old layer keeps serving: %s",
                        language.wire_name,
                        exc,
                    )
