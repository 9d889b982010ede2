"""The settings the runtimes start from, read before the settings model loads (`sandlot serve`'s start).

The model (handler/settings.py: pydantic-settings, pydantic) costs the service's start more than anything else
it loads before its zygotes can be spawned. So `sandlot serve` reads what the runtimes, their layers and the log
need from the environment first, each value by a rule stricter than the model's (runtimes/function/
environment.py's FIELDS and read_value: plain digits for numbers, the model's own words for booleans, a choice
spelled exactly, the same bounds), starts its zygotes from that, and loads the model while they start. The model
then checks every setting as before: a bad one stops the start with the same message, and the zygotes already
started are stopped first (cli._serve).

Where this reading cannot vouch for a value the model would read the same way (another spelling, a value out of
bounds, a syscall list, networks, an update interval, a config file, a weak key), it answers None, and the start
loads the model first, as before: its error, or its values, decide. tests/test_early_settings.py keeps this
reading and the model equal.
"""

from __future__ import annotations

import os
from typing import Any

from handler.keys import key_problems
from runtimes.config import RuntimeConfig, default_data_dir, runtime_config_of
from runtimes.function.environment import FIELDS as RUNTIME_FIELDS
from runtimes.function.environment import _Unsure, read_value
from runtimes.languages import LANGUAGES

_FUNCTION_ONLY = {language.layer_setting for language in LANGUAGES}  # a runtime function's baked layers

# name: (kind, default, bounds) as runtimes/function/environment.py's FIELDS: the runtimes' settings with the
# service's defaults, and the service's own that its start reads before the model (the others wait for it)
FIELDS: dict[str, tuple[object, object, dict[str, float]]] = {
    **{name: field for name, field in RUNTIME_FIELDS.items() if name not in _FUNCTION_ONLY},
    "SANDLOT_DATA_DIR": ("str", default_data_dir, {}),
    "MAX_WORKERS": ("int", 4, {"ge": 1, "le": 256}),
    "SANDBOX_PORT": ("int", 8194, {"ge": 1, "le": 65535}),
    "SANDLOT_HOST": ("str", "0.0.0.0", {}),
    "PIP_MIRROR_URL": ("str", "", {}),
    "PYTHON_DEPS_UPDATE_INTERVAL": ("model", "", {}),  # the model parses an interval
    "SANDLOT_BACKEND": (("local", "lambda"), "local", {}),
    "SANDLOT_PYTHON_REQUIREMENTS": ("str", "", {}),
    "SANDLOT_PIP_FIND_LINKS": ("str", "", {}),
    "SANDLOT_NODEJS_PACKAGE": ("str", "", {}),
    "SANDLOT_BUILD_UID": ("int", 0, {"ge": 0}),
    "SANDLOT_PACKAGES_ALLOW_ANY_SPEC": ("bool", False, {}),
    "SANDLOT_LOG_FORMAT": (("json", "text"), "json", {}),
    "SANDLOT_LOG_LEVEL": (("debug", "info", "warning", "error"), "info", {}),
}
KEYS = ("API_KEY", "SANDLOT_ADMIN_KEY", "SANDLOT_ALLOW_INSECURE_API_KEY")  # checked here too (below)


class EarlySettings:
    """The values FIELDS names, by the settings' names (as the model's attributes), and what the start reads of
    the model (runtime_config, build_uid)."""

    def __init__(self, values: dict[str, Any]):
        self.__dict__.update(values)

    @property
    def build_uid(self) -> int:
        from runtimes.linux.idmap import build_uid

        return self.SANDLOT_BUILD_UID or build_uid(self.SANDLOT_UID_BASE)

    def runtime_config(self, python_layer: str = "", nodejs_layer: str = "") -> RuntimeConfig:
        return runtime_config_of(self, python_layer=python_layer, nodejs_layer=nodejs_layer, workers=self.MAX_WORKERS)


def early_settings(environ: dict[str, str] | None = None, **overrides: str) -> EarlySettings | None:
    """The settings FIELDS names from environ (os.environ by default) and the command's options (overrides, as
    the model takes them), or None where the model must decide."""
    environ = {**(os.environ if environ is None else environ), **{k: str(v) for k, v in overrides.items()}}
    config = environ.get("SANDLOT_CONFIG", "conf/config.yaml")
    if os.path.isfile(config):  # the file's values (typed YAML, dify-sandbox's keys) are the model's to read
        return None
    values: dict[str, Any] = {}
    try:
        for name, (kind, default, bounds) in FIELDS.items():
            if name in environ:
                if kind == "model" and not isinstance(default, list):
                    if environ[name]:
                        raise _Unsure  # (an interval: the model parses it)
                    values[name] = default
                else:
                    values[name] = read_value(kind, environ[name], bounds)
            else:
                values[name] = default() if callable(default) else default
        allow_weak = read_value("bool", environ.get("SANDLOT_ALLOW_INSECURE_API_KEY", "false"), {})
    except _Unsure:
        return None
    if not allow_weak and key_problems(environ.get("API_KEY"), environ.get("SANDLOT_ADMIN_KEY", "")):
        return None  # refused: by the model's check, with its message, before anything starts
    from runtimes.linux.rootfs import under_tmp

    if values["SANDLOT_DATA_DIR"] and under_tmp(values["SANDLOT_DATA_DIR"]):
        return None  # the model's refusal (it would hide the layers), before a layer is built there
    return EarlySettings(values)
