"""The languages Sandlot runs: one record each, the only place outside a language's own folder that names it.

Each record says what the rest of the code needs to know of a language: the name
Dify sends (`language` of a run request), where its code lives (the runtime class,
the in-child runner, the Lambda handler, the layer build, all under
runtimes/<folder>/), its dependency layer (the base file, the syntax of added
packages), the names of its settings and of its RuntimeConfig fields, the
example program of the admin page's try box, and whether it is the default of a
request that names none. handler/ and layers/ read these records; adding a
language adds its folder and a record here (docs/architecture.md, "Adding a
language"). tests/test_languages.py checks that no other module spells a
language's name and that every path below names something real.

Standard library only, and nothing imported by a path until asked for
(`runtime_class`, `layer_module`): the API function and a runtime function's
cold path import this module.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

# the project's root: where runtimes/ and layers/ sit side by side (a checkout, or site-packages)
ROOT = Path(__file__).parent.parent


@dataclass(frozen=True)
class Language:
    wire_name: str  # what Dify sends as a run request's `language`; also the API's and metrics' label
    folder: str  # runtimes/<folder>/ holds its code; layers/<folder>/ its base file; its layers' directory name
    runtime: str  # "module:Class", the JailedRuntime of its runs
    runner: str  # module run in a confined child (the code's interpreter side)
    lambda_handler: str  # awslambdaric's handler string of its runtime function (template.yaml, its Dockerfile)
    layer: str  # module of its layer build: build(), installed(), base_names(), managed_layer()
    base_file: str  # the layer's default base file, relative to ROOT
    packages: str  # the syntax of added packages: "pip" (PEP 508) or "npm" (layers/specs.py)
    path_setting: str  # the setting naming its interpreter (dify-sandbox's name)
    config_path: str  # RuntimeConfig's field for that interpreter
    config_layer: str  # RuntimeConfig's field for the layer in use
    layer_setting: str  # a runtime function's setting: where its image's baked layer is
    base_file_setting: str  # the service's setting overriding the base file
    lambda_function_setting: str  # the lambda backend's setting naming its runtime function
    extensions: tuple[str, ...]  # file suffixes `sandlot run` takes for this language
    example: str  # a program that prints something about the runtime (the admin page's try box)
    default: bool = False  # the language of a request (or route) that names none
    periodic_refresh: bool = False  # PYTHON_DEPS_UPDATE_INTERVAL rebuilds its layer (dify-sandbox's)

    def runtime_class(self) -> type:
        """The runtime class, imported now (the jail comes with it)."""
        module, _, name = self.runtime.partition(":")
        return getattr(importlib.import_module(module), name)

    def layer_module(self) -> ModuleType:
        return importlib.import_module(self.layer)

    def default_base_file(self) -> Path:
        return ROOT / self.base_file


PYTHON = Language(
    wire_name="python3",
    folder="python",
    runtime="runtimes.python.runtime:PythonRuntime",
    runner="runtimes.python.runner",
    lambda_handler="runtimes.python.lambda_function.handler",
    layer="runtimes.python.layer",
    base_file="layers/python/requirements.txt",
    packages="pip",
    path_setting="PYTHON_PATH",
    config_path="python_path",
    config_layer="python_layer",
    layer_setting="SANDLOT_PYTHON_LAYER",
    base_file_setting="SANDLOT_PYTHON_REQUIREMENTS",
    lambda_function_setting="SANDLOT_LAMBDA_PYTHON3_FUNCTION",
    extensions=(".py",),
    example="import sys\nprint(sys.version)",
    default=True,
    periodic_refresh=True,
)

NODEJS = Language(
    wire_name="nodejs",
    folder="nodejs",
    runtime="runtimes.nodejs.runtime:NodeRuntime",
    runner="runtimes.nodejs.runner",
    lambda_handler="runtimes.nodejs.lambda_function.handler",
    layer="runtimes.nodejs.layer",
    base_file="layers/nodejs/package.json",
    packages="npm",
    path_setting="NODEJS_PATH",
    config_path="nodejs_path",
    config_layer="nodejs_layer",
    layer_setting="SANDLOT_NODEJS_LAYER",
    base_file_setting="SANDLOT_NODEJS_PACKAGE",
    lambda_function_setting="SANDLOT_LAMBDA_NODEJS_FUNCTION",
    extensions=(".js", ".mjs", ".cjs"),
    example="console.log(process.version)",
)

LANGUAGES: tuple[Language, ...] = (PYTHON, NODEJS)  # in this order everywhere (help text, OpenAPI, metrics)
WIRE_NAMES: tuple[str, ...] = tuple(language.wire_name for language in LANGUAGES)
DEFAULT: Language = next(language for language in LANGUAGES if language.default)
_BY_WIRE_NAME = {language.wire_name: language for language in LANGUAGES}


def is_known(value: object) -> bool:
    """Whether a value (anything a request carries: a list, a dict) is a language's wire name."""
    return isinstance(value, str) and value in _BY_WIRE_NAME


def by_wire_name(name: str) -> Language:
    """The language Dify calls `name`; KeyError when there is none."""
    return _BY_WIRE_NAME[name]


def by_extension(suffix: str) -> Language | None:
    """The language of a file with this suffix (".py"), if any."""
    return next((language for language in LANGUAGES if suffix in language.extensions), None)
