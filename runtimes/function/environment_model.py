"""A runtime function's settings as a model (pydantic): the declaration and the full check of its environment.

Imported only where a value needs the model's word (environment.py hands it what its light reading cannot vouch
for) and by the docs' reference: never on a function's cold path.
"""

from __future__ import annotations

from pydantic import Field

from runtimes.config import RuntimeConfig
from runtimes.function.function_config import baked_layer, function_runtime_config
from runtimes.languages import NODEJS, PYTHON
from runtimes.runtime_settings import RuntimeSettings


class FunctionEnvironment(RuntimeSettings):
    """A runtime function's settings (its environment: template.yaml sets it), the declaration and the full check.

    What a function's init reads is runtimes/function/environment.py's light reading of the same names (no pydantic on
    the cold path); it hands every value it cannot vouch for to this model, whose error is the operator's."""

    SANDLOT_DATA_DIR: str = ""  # "" = a directory of its own under the temp dir (the only writable place)
    SANDLOT_PYTHON_LAYER: str = Field(baked_layer(PYTHON), description="the Python layer baked into the image")
    SANDLOT_NODEJS_LAYER: str = Field(baked_layer(NODEJS), description="the Node.js layer baked into the image")

    def keeps_layers(self) -> bool:
        return False  # baked into the image; the data dir holds only the runtime's own scratch

    def runtime_config(self) -> RuntimeConfig:
        return function_runtime_config(self)
