"""The settings described from the model itself: what is in force (`sandlot config`), in one order.

Every field of handler.settings.Settings (the runtimes' shared settings of
runtimes/runtime_settings.py and the service's own), whoever added it. The docs' reference
is rendered from the same order by docs/gen_reference.py.
"""

from __future__ import annotations

import os
import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pydantic.fields import FieldInfo

from handler.settings import Settings, _DifyYamlSource, load_settings

_SECRET = re.compile(r"KEY|SECRET|TOKEN|PASSWORD", re.IGNORECASE)
# dify-sandbox's own names come first, in its documentation's order; Sandlot's follow in the model's order
DIFY_SANDBOX_NAMES = (
    "API_KEY",
    "SANDBOX_PORT",
    "MAX_WORKERS",
    "MAX_REQUESTS",
    "WORKER_TIMEOUT",
    "ENABLE_NETWORK",
    "ENABLE_PRELOAD",
    "ALLOWED_SYSCALLS",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "SOCKS5_PROXY",
    "PIP_MIRROR_URL",
    "PYTHON_DEPS_UPDATE_INTERVAL",
    "PYTHON_PATH",
    "NODEJS_PATH",
)


def ordered_fields() -> list[tuple[str, FieldInfo]]:
    """Every setting (the runtimes' shared ones and the service's own), dify-sandbox's names first."""
    fields = Settings.model_fields
    first = [name for name in DIFY_SANDBOX_NAMES if name in fields]
    return [(name, fields[name]) for name in first + [name for name in fields if name not in first]]


def plain(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return ",".join(str(item) for item in value)
    return "" if value is None else str(value)


def masked(name: str, value: Any) -> str:
    """A value fit to print: secrets hidden, credentials in URLs hidden."""
    text = plain(value)
    if not text:
        return text
    if _SECRET.search(name):
        return f"*** ({len(text)} characters)"
    parts = urlsplit(text) if "://" in text else None
    if parts is not None and parts.password:
        netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
        return urlunsplit(parts._replace(netloc=netloc))
    return text


def settings_in_force(environ: dict[str, str] | None = None) -> list[dict[str, str]]:
    """Each setting's value (masked) and where it came from: environment, file or default."""
    environ = os.environ if environ is None else environ
    settings = load_settings()
    path = environ.get("SANDLOT_CONFIG", "conf/config.yaml")
    from_file = _DifyYamlSource(Settings, path)()
    rows = []
    for name, _ in ordered_fields():
        if name in environ:
            source = "environment"
        elif name in from_file:
            source = f"file {path}"
        else:
            source = "default"
        rows.append({"name": name, "value": masked(name, getattr(settings, name)), "source": source})
    return rows
