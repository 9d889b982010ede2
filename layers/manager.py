"""The local backend's dependency layers: one store per language, rebuilt and switched on request.

update/refresh build a new layer directory (pip or npm, unprivileged), then ask
the runtime to start a zygote on it and retire the old one. A failed build or a
zygote that cannot start on the new layer leaves the old layer serving. The old
directory is removed once no zygote uses it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from layers.store import LayerBuildError, LayerStore

log = logging.getLogger("sandlot.layers")


@dataclass
class Layer:
    store: LayerStore
    list_installed: Callable[[str], list[dict[str, str]]]


class LayerManager:
    def __init__(self, layers: dict[str, Layer]):
        self.layers = layers
        self._locks = {language: asyncio.Lock() for language in layers}

    def ensure(self, language: str) -> str:
        """The layer to start on: built now if there is none for the current sources."""
        return self.layers[language].store.ensure()

    def current(self, language: str) -> str:
        layer = self.layers.get(language)
        return layer.store.current if layer else ""

    def installed(self, language: str) -> list[dict[str, str]]:
        layer = self.layers.get(language)
        return layer.list_installed(layer.store.current) if layer else []

    def retire(self, language: str) -> Callable[[str], None]:
        return self.layers[language].store.retire

    async def rebuild(self, language: str, runtime) -> str:
        """Build a new layer and switch the runtime to it. Concurrent calls wait their turn."""
        store = self.layers[language].store
        async with self._locks[language]:
            path = await asyncio.to_thread(store.rebuild)
            store.use(path)
            old, store.current = store.current, path  # before the switch: the old one retires during it
            try:
                await runtime.switch_layer(path)
            except Exception as exc:
                store.current = old
                store.retire(path)
                raise LayerBuildError(f"the new layer could not be started: {exc}") from exc
            log.info("%s layer is now %s (was %s)", language, path, old or "none")
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
