"""A runtime function's runtime configuration: where its image's layers are baked, and what its runtime is told.

Standard library only (with runtimes/config.py and the language records): read by the light reading of a
function's environment (environment.py) and by the settings model that checks it (environment_model.py) alike.
"""

from __future__ import annotations

import os

from runtimes.config import RuntimeConfig, runtime_config_of
from runtimes.languages import LANGUAGES, Language
from runtimes.linux import tempdirs

# Where the image layout script puts the baked layers (infra/layout.sh)
IMAGE_ROOT = "/opt/sandlot"


def baked_layer(language: Language) -> str:
    """Where a language's layer is baked into a runtime function's image: its setting's default."""
    return os.path.join(IMAGE_ROOT, "layers", language.folder)


def function_runtime_config(settings) -> RuntimeConfig:
    """What a runtime function's runtime is told (settings: FunctionSettings, or the model, FunctionEnvironment)."""
    baked = {language.config_layer: getattr(settings, language.layer_setting) for language in LANGUAGES}
    return runtime_config_of(
        settings,
        **{field: layer if os.path.isdir(layer) else "" for field, layer in baked.items()},
        workers=2,  # kept ready only where each run has a uid of its own: back-to-back runs find one
        data_dir=settings.SANDLOT_DATA_DIR or tempdirs.make("data"),  # removed at stop (tempdirs.py)
        one_run_at_a_time=True,
    )
