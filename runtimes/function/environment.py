"""A runtime function's configuration, from its own environment (the template sets it).

The runtimes' settings are the service's own (runtimes/runtime_settings.py: the same
names, defaults and checks, mapped to a RuntimeConfig the same way, by
runtimes/config.py's runtime_config_of); a function adds only where its baked
layers are (environment_model.py's FunctionEnvironment declares them too), and
keeps its data in its temp directory, the only writable place on Lambda. A
runtime function never imports handler/. One run at a time, always: a Lambda
instance serves one invocation at a time.

Standard library only: reading the settings is on the cold path of every fresh
environment (a per-run tenant's, a new tenant's), and building the pydantic
model there cost about a third of what the function's init adds to a bare
function's. So the function reads them here, each value by a rule stricter
than the model's (FIELDS: plain digits for numbers, the model's own words for
booleans, a choice spelled exactly), and gives whatever is set that it cannot
vouch for (another spelling, a value out of bounds, a syscall list or networks,
which only the model checks) to the model: that value is then either the
model's or its error, the operator's clear error at init, as before.
tests/test_settings.py keeps FIELDS and the model equal (names, defaults,
bounds, choices) and checks that both read a corpus of values alike.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

from runtimes.config import JAIL_MODES, RuntimeConfig, comma_list, default_python
from runtimes.function.function_config import baked_layer, function_runtime_config
from runtimes.languages import LANGUAGES

if TYPE_CHECKING:
    from runtimes.function.environment_model import FunctionEnvironment

_TRUE = frozenset(("1", "true", "t", "yes", "y", "on"))  # pydantic's words, any case
_FALSE = frozenset(("0", "false", "f", "no", "n", "off"))
_DIGITS = re.compile(r"[0-9]{1,18}")
_DECIMAL = re.compile(r"[0-9]{1,15}(\.[0-9]{1,15})?")

# name: (kind, default, bounds); kind: a type's name, or the tuple of a choice's values. Kept equal to
# FunctionEnvironment's fields by tests/test_settings.py.
FIELDS: dict[str, tuple[object, object, dict[str, float]]] = {
    "WORKER_TIMEOUT": ("float", 15, {"gt": 0}),
    "ENABLE_NETWORK": ("bool", True, {}),
    "ENABLE_PRELOAD": ("bool", False, {}),
    "ALLOWED_SYSCALLS": ("model", [], {}),  # the model's check (the seccomp policy's) when any is set
    "HTTP_PROXY": ("str", "", {}),
    "HTTPS_PROXY": ("str", "", {}),
    "SOCKS5_PROXY": ("str", "", {}),
    "PYTHON_PATH": ("str", default_python, {}),
    "NODEJS_PATH": ("str", "/usr/bin/node", {}),
    "SANDLOT_DATA_DIR": ("str", "", {}),
    "SANDLOT_PYTHON_PRELOAD": ("list", [], {}),
    "SANDLOT_MAX_TIMEOUT": ("float", 60, {"gt": 0}),
    "SANDLOT_MEMORY_LIMIT_MB": ("int", 512, {"ge": 16}),
    "SANDLOT_MAX_MEMORY_LIMIT_MB": ("int", 2048, {"ge": 16}),
    "SANDLOT_OUTPUT_LIMIT_BYTES": ("int", 4 * 1024 * 1024, {"ge": 1024}),
    "SANDLOT_TMP_SIZE_MB": ("int", 64, {"ge": 1}),
    "SANDLOT_TMP_FILES": ("int", 2048, {"ge": 16}),
    "SANDLOT_REQUIRE_SECCOMP": ("bool", True, {}),
    "SANDLOT_JAIL": (JAIL_MODES, "auto", {}),
    "SANDLOT_UID_BASE": ("int", 1_500_000_000, {"ge": 65536, "le": 4_000_000_000}),
    "SANDLOT_ZYGOTE_MAX_FORKS": ("int", 2000, {"ge": 10}),
    "SANDLOT_ZYGOTE_MAX_AGE": ("float", 300, {"ge": 0}),
    "SANDLOT_ZYGOTE_START_TIMEOUT": ("float", 60, {"gt": 0}),
    "SANDLOT_EGRESS_ALLOW": ("model", [], {}),  # networks: the model's parsing when any is set
    "SANDLOT_UNFILTERED_EGRESS": (("no-network", "allow", "refuse"), "no-network", {}),
    "SANDLOT_PROXY_EGRESS": (("auto", "on", "off"), "auto", {}),
    "SANDLOT_PASTA": ("str", "pasta", {}),
    **{language.layer_setting: ("str", baked_layer(language), {}) for language in LANGUAGES},
}


class ConfigError(ValueError):
    pass


class _Unsure(Exception):
    """A value this reading does not vouch for: the model decides."""


def _within(value: float, bounds: dict[str, float]) -> float:
    for bound, limit in bounds.items():
        if not {"gt": value > limit, "ge": value >= limit, "le": value <= limit}[bound]:
            raise _Unsure
    return value


def read_value(kind: object, value: str, bounds: dict[str, float]) -> object:
    """One setting's value from its environment string, or _Unsure: only what the model reads the same way."""
    if kind == "str":
        return value
    if kind == "bool":
        word = value.lower()
        if word in _TRUE or word in _FALSE:
            return word in _TRUE
    elif kind == "int":
        if _DIGITS.fullmatch(value):
            return _within(int(value), bounds)
    elif kind == "float":
        if _DECIMAL.fullmatch(value):
            return _within(float(value), bounds)
    elif kind == "list":
        return comma_list(value)
    elif kind == "model":
        if not comma_list(value):
            return []
    elif isinstance(kind, tuple) and value in kind:
        return value
    raise _Unsure


class FunctionSettings:
    """The runtimes' settings and a function's own, read without the model (attributes by the settings' names)."""

    def __init__(self, values: dict[str, object]):
        self.__dict__.update(values)

    def runtime_config(self) -> RuntimeConfig:
        return function_runtime_config(self)


def function_environment(environ: dict[str, str] | None = None) -> FunctionSettings | FunctionEnvironment:
    """The settings from environ (os.environ by default), or ConfigError naming what is wrong."""
    environ = os.environ if environ is None else environ
    settings = light_environment(environ)
    return _checked_by_the_model(environ) if settings is None else settings


def light_environment(environ: dict[str, str] | None = None) -> FunctionSettings | None:
    """The settings as read without the model, or None where a value needs the model (function_environment)."""
    environ = os.environ if environ is None else environ
    values = {}
    try:
        for name, (kind, default, bounds) in FIELDS.items():
            if name in environ:
                values[name] = read_value(kind, environ[name], bounds)
            else:
                values[name] = default() if callable(default) else default
    except _Unsure:
        return None
    return FunctionSettings(values)


def _checked_by_the_model(environ) -> FunctionEnvironment:
    from pydantic import ValidationError

    from runtimes.function.environment_model import FunctionEnvironment
    from runtimes.runtime_settings import describe_invalid

    try:
        return FunctionEnvironment(**{k: v for k, v in environ.items() if k in FunctionEnvironment.model_fields})
    except ValidationError as exc:
        raise ConfigError(f"invalid setting: {describe_invalid(exc)}") from exc
