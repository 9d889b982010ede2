"""A runtime function's configuration, from its own environment (the template sets it).

The runtimes' settings are the service's own (runtimes/settings.py: the same
names, defaults and checks, mapped to a RuntimeConfig the same way); a function
adds only where its baked layers are, and keeps its data in its temp directory,
the only writable place on Lambda. A runtime function never imports handler/.
One run at a time, always: a Lambda instance serves one invocation at a time.
"""

from __future__ import annotations

import os

from pydantic import Field, ValidationError

from runtimes import tempdirs
from runtimes.config import RuntimeConfig
from runtimes.settings import RuntimeSettings, describe_invalid

# Where the image layout script puts the baked layers (infra/layout.sh)
IMAGE_ROOT = "/opt/sandlot"


class ConfigError(ValueError):
    pass


class FunctionEnvironment(RuntimeSettings):
    SANDLOT_DATA_DIR: str = ""  # "" = a directory of its own under the temp dir (the only writable place)
    SANDLOT_PYTHON_LAYER: str = Field(
        os.path.join(IMAGE_ROOT, "layers", "python"), description="the Python layer baked into the image"
    )
    SANDLOT_NODEJS_LAYER: str = Field(
        os.path.join(IMAGE_ROOT, "layers", "nodejs"), description="the Node.js layer baked into the image"
    )

    def keeps_layers(self) -> bool:
        return False  # baked into the image; the data dir holds only the runtime's own scratch

    def runtime_config(self) -> RuntimeConfig:
        return self.to_runtime_config(
            python_layer=self.SANDLOT_PYTHON_LAYER if os.path.isdir(self.SANDLOT_PYTHON_LAYER) else "",
            nodejs_layer=self.SANDLOT_NODEJS_LAYER if os.path.isdir(self.SANDLOT_NODEJS_LAYER) else "",
            workers=2,  # kept ready only where each run has a uid of its own: back-to-back runs find one
            data_dir=self.SANDLOT_DATA_DIR or tempdirs.make("data"),  # removed at stop (tempdirs.py)
            one_run_at_a_time=True,
        )


def function_environment(environ: dict[str, str] | None = None) -> FunctionEnvironment:
    """The settings from environ (os.environ by default), or ConfigError naming what is wrong."""
    try:
        if environ is None:
            return FunctionEnvironment()
        return FunctionEnvironment(**{k: v for k, v in environ.items() if k in FunctionEnvironment.model_fields})
    except ValidationError as exc:
        raise ConfigError(f"invalid setting: {describe_invalid(exc)}") from exc
