"""Renders the generated parts of the docs from the code: the settings reference and the command line's help.

    python docs/gen_reference.py           rewrite the generated parts of docs/configuration.md and docs/cli.md
    python docs/gen_reference.py --check   exit 1, naming the pages, when either is out of date

The settings come from the settings models themselves (handler/settings.py: the service's, which include the
runtimes' of runtimes/runtime_settings.py; runtimes/function/environment_model.py: a Lambda runtime function's), each
field with its type, default, description and who reads it; the help from `sandlot`'s own argument parser.
tests/test_docs.py fails when a page and what this renders differ.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import sys
import typing
from pathlib import Path

import annotated_types
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from handler.settings import Settings  # noqa: E402
from handler.settings_report import ordered_fields, plain  # noqa: E402
from runtimes.function.environment_model import FunctionEnvironment  # noqa: E402
from runtimes.runtime_settings import RuntimeSettings  # noqa: E402

CONFIGURATION = ROOT / "docs" / "configuration.md"
CLI = ROOT / "docs" / "cli.md"
HELP_COLUMNS = "100"  # argparse wraps the help to the terminal's width: one width, whatever the terminal

# Who reads a setting: from the model it belongs to, narrowed for the settings only one backend uses
RUNTIMES = "the runtimes: the service's `local` backend and each Lambda runtime function"
SERVICE = "the service (on Lambda, the API function)"
FUNCTION = "each Lambda runtime function"
LAYER_BUILDS = "the service, `local` backend: layer builds (`sandlot layers build`, package changes)"
LAMBDA_BACKEND = "the service, `lambda` backend (the API function on Lambda)"
READERS = {
    "PIP_MIRROR_URL": LAYER_BUILDS,
    "PYTHON_DEPS_UPDATE_INTERVAL": LAYER_BUILDS,
    "SANDLOT_PYTHON_REQUIREMENTS": LAYER_BUILDS,
    "SANDLOT_PIP_FIND_LINKS": LAYER_BUILDS,
    "SANDLOT_NODEJS_PACKAGE": LAYER_BUILDS,
    "SANDLOT_BUILD_UID": LAYER_BUILDS,
    "SANDLOT_PACKAGES_ALLOW_ANY_SPEC": LAYER_BUILDS,
    "SANDLOT_LAMBDA_PYTHON3_FUNCTION": LAMBDA_BACKEND,
    "SANDLOT_LAMBDA_NODEJS_FUNCTION": LAMBDA_BACKEND,
    "SANDLOT_LAMBDA_TIMEOUT": LAMBDA_BACKEND,
    "SANDLOT_LAMBDA_TENANCY": LAMBDA_BACKEND,
}
# A runtime function's default where it differs from the service's and the model cannot say it in words
FUNCTION_DEFAULTS = {
    "SANDLOT_DATA_DIR": "a directory of its own under the temp directory (Lambda's only writable place)",
}


def begin(name: str) -> str:
    return f"<!-- generated: {name}; `python docs/gen_reference.py` rewrites it, do not edit -->"


def end(name: str) -> str:
    return f"<!-- end of generated: {name} -->"


def type_text(info: FieldInfo) -> str:
    """The setting's type in words, with its bounds."""
    annotation = info.annotation
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        text = "one of " + ", ".join(f"`{value}`" for value in typing.get_args(annotation))
    elif origin is list:
        (item,) = typing.get_args(annotation)
        kind = {int: "integers", str: "names"}.get(item, "CIDRs" if "Network" in getattr(item, "__name__", "") else "")
        text = f"comma-separated {kind}".rstrip()
    else:
        text = {bool: "boolean (`true`, `false`)", int: "integer", float: "number", str: "text"}.get(
            annotation, str(annotation)
        )
    bounds = []
    for constraint in info.metadata:
        for attribute, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            if isinstance(constraint, getattr(annotated_types, attribute.capitalize())):
                bounds.append(f"{sign} {getattr(constraint, attribute)}")
    return text + (" " + ", ".join(bounds) if bounds else "")


def default_text(info: FieldInfo) -> str:
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    if "shown_default" in extra:
        return str(extra["shown_default"])
    if info.default is PydanticUndefined:
        return "none"
    text = plain(info.default)
    return f"`{text}`" if text else "empty"


def _sentence(text: str) -> str:
    text = " ".join(text.split())
    return (text[:1].upper() + text[1:]).rstrip(".") + "." if text else ""


def _entry(name: str, info: FieldInfo, reader: str, note: str = "") -> list[str]:
    lines = [f"#### `{name}`", ""]
    if info.description:
        lines += [_sentence(info.description), ""]
    lines += [f"- Type: {type_text(info)}", f"- Default: {default_text(info)}", f"- Read by: {reader}"]
    if note:
        lines.append(f"- {note}")
    return lines + [""]


def settings_reference() -> str:
    """Every field of the settings models, grouped by who reads it."""
    runtime = [(name, info) for name, info in ordered_fields() if name in RuntimeSettings.model_fields]
    service = [(name, info) for name, info in ordered_fields() if name not in RuntimeSettings.model_fields]
    function_own = [
        (name, info) for name, info in FunctionEnvironment.model_fields.items() if name not in Settings.model_fields
    ]
    lines = [
        "### Settings of the runtimes",
        "",
        "The service and the Lambda runtime functions read these alike (`runtimes/runtime_settings.py`).",
        "",
    ]
    for name, info in runtime:
        note = ""
        function_info = FunctionEnvironment.model_fields[name]
        if default_text(function_info) != default_text(info):
            note = "On a Lambda runtime function the default is " + FUNCTION_DEFAULTS.get(
                name, default_text(function_info)
            )
        lines += _entry(name, info, RUNTIMES, note)
    lines += ["### Settings of the service", "", "The HTTP service's own (`handler/settings.py`).", ""]
    for name, info in service:
        lines += _entry(name, info, READERS.get(name, SERVICE))
    lines += [
        "### Settings of a Lambda runtime function",
        "",
        "A runtime function's own, besides the runtimes' settings (`runtimes/function/environment.py`);",
        "`template.yaml` sets its environment.",
        "",
    ]
    for name, info in function_own:
        lines += _entry(name, info, FUNCTION)
    return "\n".join(lines).rstrip() + "\n"


def _help(path: list[str]) -> str:
    from handler import cli

    out = io.StringIO()
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_COLUMNS
    try:
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            cli.main([*path, "--help"])
    finally:
        if previous is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = previous
    return out.getvalue().rstrip() + "\n"


def _subcommands(text: str) -> list[str]:
    """The subcommands a help text lists under its positional arguments ("{a,b,c}")."""
    section = text.split("positional arguments:", 1)[-1]
    match = re.search(r"^\s+\{([\w,-]+)\}", section, re.MULTILINE)
    return match.group(1).split(",") if match else []


def cli_reference() -> str:
    """`sandlot --help` and every subcommand's, as the parser prints them."""
    lines: list[str] = []

    def add(path: list[str]) -> None:
        text = _help(path)
        lines.extend([f"### `{' '.join(['sandlot', *path])}`", "", "```text", text.rstrip(), "```", ""])
        for sub in _subcommands(text):
            add([*path, sub])

    add([])
    return "\n".join(lines).rstrip() + "\n"


GENERATED = {CONFIGURATION: ("settings", settings_reference), CLI: ("cli", cli_reference)}


def with_generated(page: str, name: str, body: str) -> str:
    """The page with its generated part replaced by body."""
    start, stop = page.index(begin(name)), page.index(end(name))
    return page[: start + len(begin(name))] + "\n\n" + body + "\n" + page[stop:]


def rendered(path: Path) -> str:
    name, render = GENERATED[path]
    return with_generated(path.read_text(), name, render())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="rewrite, or check, the generated parts of the docs")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when a page is out of date")
    args = parser.parse_args(argv)
    stale = []
    for path in GENERATED:
        text = rendered(path)
        if text != path.read_text():
            stale.append(path)
            if not args.check:
                path.write_text(text)
    if args.check and stale:
        print("out of date: " + ", ".join(str(p.relative_to(ROOT)) for p in stale), file=sys.stderr)
        print("run: python docs/gen_reference.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
