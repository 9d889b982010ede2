"""Service settings: dify-sandbox's names, from the environment and conf/config.yaml.

Environment wins over the file, the file over defaults. A bad value stops
start-up with a message naming the setting. What the runtimes are told is
declared once, in runtimes/runtime_settings.py, which a Lambda runtime function's
settings share; this adds the API's own.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource
from pydantic_settings.exceptions import SettingsError as _SourceError

from handler.keys import KNOWN_KEYS, MIN_KEY_LENGTH, key_problems, weak_key_reason  # noqa: F401 - named here too
from handler.tenancy import TenancyPolicy
from runtimes.config import RuntimeConfig, runtime_config_of
from runtimes.runtime_settings import RuntimeSettings, describe_invalid

# dify-sandbox's config.yaml keys (dotted paths) -> our setting names
_YAML_KEYS = {
    "app.port": "SANDBOX_PORT",
    "app.key": "API_KEY",
    "max_workers": "MAX_WORKERS",
    "max_requests": "MAX_REQUESTS",
    "worker_timeout": "WORKER_TIMEOUT",
    "python_path": "PYTHON_PATH",
    "nodejs_path": "NODEJS_PATH",
    "enable_network": "ENABLE_NETWORK",
    "enable_preload": "ENABLE_PRELOAD",
    "allowed_syscalls": "ALLOWED_SYSCALLS",
    "python_pip_mirror_url": "PIP_MIRROR_URL",
    "python_deps_update_interval": "PYTHON_DEPS_UPDATE_INTERVAL",
    "proxy.socks5": "SOCKS5_PROXY",
    "proxy.http": "HTTP_PROXY",
    "proxy.https": "HTTPS_PROXY",
}


class SettingsError(ValueError):
    pass


_ALLOW_WEAK = "SANDLOT_ALLOW_INSECURE_API_KEY"


def parse_metrics_setting(value: str) -> tuple[str, str, int]:
    """("key"|"off"|"address", host, port) from SANDLOT_METRICS, or ValueError saying what is accepted."""
    if value in ("key", "off"):
        return value, "", 0
    host, sep, port = value.rpartition(":")
    if sep and port.isdigit() and 0 < int(port) < 65536:
        return "address", host.strip("[]") or "0.0.0.0", int(port)
    raise ValueError("must be `key`, `off` or HOST:PORT")


def _dig(data: dict, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(data, dict) or part not in data:
            return None
        data = data[part]
    return data


class _DifyYamlSource(PydanticBaseSettingsSource):
    """conf/config.yaml in dify-sandbox's shape, plus any of our own names at top level."""

    def __init__(self, settings_cls: type[BaseSettings], path: str):
        super().__init__(settings_cls)
        self.path = Path(path)

    def get_field_value(self, field, field_name):  # pragma: no cover - required by the base class
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        if not self.path.is_file():
            return {}
        import yaml  # only where a config file is given: most services start from the environment alone

        try:
            data = yaml.safe_load(self.path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise SettingsError(f"{self.path}: not valid YAML: {exc}") from exc
        if not isinstance(data, dict):
            raise SettingsError(f"{self.path}: expected a mapping")
        values = {name: _dig(data, key) for key, name in _YAML_KEYS.items()}
        values.update({k: v for k, v in data.items() if isinstance(k, str) and k.isupper()})
        return {k: v for k, v in values.items() if v is not None}


class Settings(RuntimeSettings):
    """The service's settings: the runtimes' (runtimes/runtime_settings.py) plus the API's own."""

    # dify-sandbox's settings
    API_KEY: str = Field(
        "",
        description="the `X-Api-Key` clients must send: 16 characters or more, not a known placeholder (start-up "
        "refuses those, `dify-sandbox` included); `sandlot serve` prints a random one when unset",
    )
    SANDBOX_PORT: int = Field(8194, ge=1, le=65535, description="port")
    MAX_WORKERS: int = Field(
        4,
        ge=1,
        le=256,
        description="runs executing at once; children kept ready for as many (up to twice while runs find none "
        "ready, one when idle)",
    )
    MAX_REQUESTS: int = Field(50, ge=1, description="requests in flight; more get HTTP 503")
    PIP_MIRROR_URL: str = Field("", description="index used when building the Python layer")
    PYTHON_DEPS_UPDATE_INTERVAL: str = Field(
        "", description="rebuild the Python layer periodically (`30m`, `1h`, seconds); empty: never"
    )

    # Sandlot's own
    SANDLOT_BACKEND: Literal["local", "lambda"] = Field(
        "local", description="where runs execute: `local` runtimes, or `lambda` functions"
    )
    SANDLOT_HOST: str = Field("0.0.0.0", description="address to bind")
    SANDLOT_PYTHON_REQUIREMENTS: str = Field(
        "",
        description="the Python layer's requirements (default `layers/python/requirements.txt`; "
        "`dependencies/python-requirements.txt` is honoured too)",
    )
    SANDLOT_PIP_FIND_LINKS: str = Field(
        "", description="a local wheelhouse (world-readable): build the Python layer with `--no-index`"
    )
    SANDLOT_NODEJS_PACKAGE: str = Field(
        "", description="the Node.js layer's package.json, its lock beside it (default `layers/nodejs/package.json`)"
    )
    SANDLOT_BUILD_UID: int = Field(0, ge=0, description="uid layer builds run as (0: `SANDLOT_UID_BASE - 1`)")
    SANDLOT_ADMIN_KEY: str = Field(
        "",
        description="the key of the package routes (`/v1/sandlot/`, `sandlot packages`) and of the `/admin` page; "
        "unset: those routes take `API_KEY` and the page is off (whoever holds the run key could change what every "
        "tenant imports)",
    )
    SANDLOT_PACKAGES_ALLOW_ANY_SPEC: bool = Field(
        False,
        description="let added packages be any one-line pip requirement or npm spec (URLs, paths, VCS links, pip "
        "options); by default only a name and a version constraint",
    )
    SANDLOT_MAX_BODY_BYTES: int = Field(5 * 1024 * 1024, ge=1024, description="request body cap")
    SANDLOT_ALLOW_INSECURE_API_KEY: bool = Field(
        False,
        description="serve with an `API_KEY` (or `SANDLOT_ADMIN_KEY`) that is empty, shorter than 16 characters, or "
        "a known placeholder such as Dify's `dify-sandbox`, logging a warning; by default start-up refuses it",
    )
    SANDLOT_QUEUE_TIMEOUT: float = Field(30, gt=0, description="longest wait for a worker before HTTP 503, seconds")

    # the lambda backend: the runtime functions (names or ARNs); boto3's own configuration for the rest
    SANDLOT_LAMBDA_PYTHON3_FUNCTION: str = Field(
        "", description="the python3 runtime function (name or ARN) of the `lambda` backend"
    )
    SANDLOT_LAMBDA_NODEJS_FUNCTION: str = Field(
        "", description="the nodejs runtime function (name or ARN) of the `lambda` backend"
    )
    SANDLOT_LAMBDA_TIMEOUT: float = Field(
        0, ge=0, description="the runtime functions' timeout, seconds; 0: `SANDLOT_MAX_TIMEOUT` + 10"
    )
    SANDLOT_LAMBDA_TENANCY: str = Field(
        "auto",
        description="the tenant id each invoke carries (the runtime functions are deployed PER_TENANT): `auto` (one "
        "shared id where a function reports its seccomp filter in force, else a fresh id per run), `per-run` (a "
        "fresh id, so an environment of its own, for every run), or `header:<Name>` (the tenant the request names "
        "in that header, or a direct invoke's `tenant_id`; a fresh id per run without it)",
    )

    # operations: metrics and logs
    SANDLOT_METRICS: str = Field(
        "key",
        description="`/metrics`: `key` (served behind the API key, as `X-Api-Key` or `Authorization: Bearer`), "
        "`off`, or `HOST:PORT` (served without a key on that address only)",
    )
    SANDLOT_LOG_FORMAT: Literal["json", "text"] = Field(
        "json", description="`json`: one JSON object a line (uvicorn's too); `text`: plain lines for a terminal"
    )
    SANDLOT_LOG_LEVEL: Literal["debug", "info", "warning", "error"] = Field("info", description="lowest level logged")
    SANDLOT_LOG_DEBUG: bool = Field(
        False, description="also log each run's code, stdin, stdout and stderr (tenants' data: for debugging only)"
    )

    def key_problems(self) -> list[str]:
        """Why the keys set cannot guard the service (API_KEY, and SANDLOT_ADMIN_KEY where set): empty where they
        can. An API_KEY left unset is not checked here: `sandlot serve` makes a random one."""
        return key_problems(self.API_KEY, self.SANDLOT_ADMIN_KEY)

    def check_keys(self) -> str | None:
        """SettingsError where a key is weak and the operator has not allowed it; where allowed, the warning to
        log once; None where the keys are fine."""
        problems = self.key_problems()
        if not problems:
            return None
        what = "; ".join(problems)
        if not self.SANDLOT_ALLOW_INSECURE_API_KEY:
            raise SettingsError(
                f"refusing to serve: {what}. Set a random key of {MIN_KEY_LENGTH} characters or more "
                f"(openssl rand -hex 24), or {_ALLOW_WEAK}=true to serve with this one anyway"
            )
        return f"{what}: serving anyway ({_ALLOW_WEAK}=true); anyone who can reach the port can run code"

    def keeps_layers(self) -> bool:
        return self.SANDLOT_BACKEND == "local"  # the lambda backend's layers are baked into the functions' images

    @field_validator("PYTHON_DEPS_UPDATE_INTERVAL")
    @classmethod
    def _interval(cls, value: str) -> str:
        if value:
            from layers.manager import parse_interval

            parse_interval(value)
        return value

    @field_validator("SANDLOT_LAMBDA_TENANCY")
    @classmethod
    def _tenancy(cls, value: str) -> str:
        TenancyPolicy.parse(value)
        return value

    @property
    def lambda_tenancy(self) -> TenancyPolicy:
        return TenancyPolicy.parse(self.SANDLOT_LAMBDA_TENANCY)

    @field_validator("SANDLOT_METRICS")
    @classmethod
    def _metrics(cls, value: str) -> str:
        parse_metrics_setting(value)
        return value

    @property
    def lambda_function_timeout(self) -> float:
        return self.SANDLOT_LAMBDA_TIMEOUT or max(self.SANDLOT_MAX_TIMEOUT, self.WORKER_TIMEOUT) + 10

    @property
    def build_uid(self) -> int:
        """SANDLOT_BUILD_UID, else the uid below the run blocks, or where that is not mapped (a container with a
        user namespace of its own) an id of the namespace's map that no user or group has (runtimes/linux/idmap.py)."""
        from runtimes.linux.idmap import build_uid

        return self.SANDLOT_BUILD_UID or build_uid(self.SANDLOT_UID_BASE)

    @classmethod
    def settings_customise_sources(
        cls, settings_cls, init_settings, env_settings, dotenv_settings, file_secret_settings
    ):
        config_path = os.environ.get("SANDLOT_CONFIG", "conf/config.yaml")
        return (init_settings, env_settings, _DifyYamlSource(settings_cls, config_path))

    def runtime_config(self, python_layer: str = "", nodejs_layer: str = "") -> RuntimeConfig:
        """The runtimes of this service: the layers in use, MAX_WORKERS children kept ready."""
        return runtime_config_of(self, python_layer=python_layer, nodejs_layer=nodejs_layer, workers=self.MAX_WORKERS)


def load_settings(**overrides: Any) -> Settings:
    """Settings from env and file, or SettingsError naming what is wrong."""
    try:
        return Settings(**overrides)
    except _SourceError as exc:
        raise SettingsError(f"invalid setting: {exc}") from exc
    except ValidationError as exc:
        raise SettingsError(f"invalid setting: {describe_invalid(exc)}") from exc
