"""Service settings: dify-sandbox's names, from the environment and conf/config.yaml.

Environment wins over the file, the file over defaults. A bad value stops
start-up with a message naming the setting.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, IPvAnyNetwork, ValidationError, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict
from pydantic_settings.exceptions import SettingsError as _SourceError

from runtimes.config import RuntimeConfig, comma_list, default_data_dir, default_python

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
        try:
            data = yaml.safe_load(self.path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise SettingsError(f"{self.path}: not valid YAML: {exc}") from exc
        if not isinstance(data, dict):
            raise SettingsError(f"{self.path}: expected a mapping")
        values = {name: _dig(data, key) for key, name in _YAML_KEYS.items()}
        values.update({k: v for k, v in data.items() if isinstance(k, str) and k.isupper()})
        return {k: v for k, v in values.items() if v is not None}


class Settings(BaseSettings):
    model_config = SettingsConfigDict(case_sensitive=True, extra="ignore", populate_by_name=True)

    # dify-sandbox's settings
    API_KEY: str = Field(
        "", description="the `X-Api-Key` clients must send; `sandlot serve` prints a random one when unset"
    )
    SANDBOX_PORT: int = Field(8194, ge=1, le=65535, description="port")
    MAX_WORKERS: int = Field(4, ge=1, le=256, description="runs executing at once (also children kept ready)")
    MAX_REQUESTS: int = Field(50, ge=1, description="requests in flight; more get HTTP 503")
    WORKER_TIMEOUT: float = Field(15, gt=0, description="default run timeout, seconds")
    ENABLE_NETWORK: bool = Field(True, description="whether runs may ask for network")
    ENABLE_PRELOAD: bool = Field(False, description="run the request's `preload` (inside the jail, before the code)")
    ALLOWED_SYSCALLS: Annotated[list[int], NoDecode] = Field(
        [],
        description="comma-separated numbers added to the allow-list; start-up refuses what would reopen the "
        "jail: process creation, exec, ptrace, mount, namespaces, sockets, io_uring, memfd, SysV and POSIX IPC, "
        "inotify, and the calls the filter narrows by argument (kill, ioctl, fcntl, flock, pid-taking calls)",
    )
    HTTP_PROXY: str = Field("", description="handed to user code (visible to it)")
    HTTPS_PROXY: str = Field("", description="handed to user code (visible to it)")
    SOCKS5_PROXY: str = Field("", description="handed to user code as `ALL_PROXY` (visible to it)")
    PIP_MIRROR_URL: str = Field("", description="index used when building the Python layer")
    PYTHON_DEPS_UPDATE_INTERVAL: str = Field(
        "", description="rebuild the Python layer periodically (`30m`, `1h`, seconds); empty: never"
    )
    PYTHON_PATH: str = Field(
        default_factory=default_python,
        description="interpreter of the runs",
        json_schema_extra={"shown_default": "the service's interpreter"},
    )
    NODEJS_PATH: str = Field(
        "/usr/bin/node", description="node binary; without it nodejs runs get `-500` and Python still serves"
    )

    # Sandlot's own
    SANDLOT_BACKEND: Literal["local", "lambda"] = Field(
        "local", description="where runs execute: `local` runtimes, or `lambda` functions"
    )
    SANDLOT_HOST: str = Field("0.0.0.0", description="address to bind")
    SANDLOT_DATA_DIR: str = Field(
        default_factory=default_data_dir,
        description="where layers live (not under /tmp)",
        json_schema_extra={"shown_default": "/var/lib/sandlot (root), ~/.cache/sandlot"},
    )
    SANDLOT_PYTHON_REQUIREMENTS: str = Field(
        "",
        description="the Python layer's requirements (default `layers/python/requirements.txt`; "
        "`dependencies/python-requirements.txt` is honoured too)",
    )
    SANDLOT_PYTHON_PRELOAD: Annotated[list[str], NoDecode] = Field(
        [], description="comma-separated modules the Python zygote imports; empty: every module of the layer"
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
    SANDLOT_MAX_TIMEOUT: float = Field(60, gt=0, description="cap on a request's `timeout`, seconds")
    SANDLOT_MEMORY_LIMIT_MB: int = Field(512, ge=16, description="default `memory_limit_mb` of a run")
    SANDLOT_MAX_MEMORY_LIMIT_MB: int = Field(2048, ge=16, description="cap on a request's `memory_limit_mb`")
    SANDLOT_OUTPUT_LIMIT_BYTES: int = Field(4 * 1024 * 1024, ge=1024, description="stdout + stderr cap of a run")
    SANDLOT_MAX_BODY_BYTES: int = Field(5 * 1024 * 1024, ge=1024, description="request body cap")
    SANDLOT_QUEUE_TIMEOUT: float = Field(30, gt=0, description="longest wait for a worker before HTTP 503, seconds")
    SANDLOT_TMP_SIZE_MB: int = Field(
        64, ge=1, description="size of a run's `/tmp` (a tmpfs; in the chroot jail a directory the service caps)"
    )
    SANDLOT_TMP_FILES: int = Field(
        2048, ge=16, description="files in a run's `/tmp` (a tmpfs's inodes; in the chroot jail counted by the service)"
    )
    SANDLOT_REQUIRE_SECCOMP: bool = Field(True, description="refuse runs when the seccomp filter cannot be installed")
    SANDLOT_JAIL: Literal["auto", "full", "userns", "reduced", "chroot", "single"] = Field(
        "auto",
        description="jail mode: `full` (root: a uid per run), `userns` (user namespaces per run; `reduced` is its "
        "older name), `chroot` (root without namespaces, a container on default privileges: a uid per run in a "
        "materialized tree), `single` (one run at a time only, e.g. Lambda), `auto` (from the protections record)",
    )
    SANDLOT_UID_BASE: int = Field(
        1_500_000_000, ge=65536, le=4_000_000_000, description="first uid of the run uid blocks (1024 uids each)"
    )
    SANDLOT_ZYGOTE_MAX_FORKS: int = Field(2000, ge=10, description="forks before the zygote is replaced")
    SANDLOT_ZYGOTE_MAX_AGE: float = Field(
        300, ge=0, description="seconds before the zygote is replaced (fresh hash secret, addresses); 0: by forks only"
    )
    SANDLOT_EGRESS_ALLOW: Annotated[list[IPvAnyNetwork], NoDecode] = Field(
        [],
        description="comma-separated CIDRs runs with network may reach although refused by default (the host's "
        "own addresses, loopback, link-local, private and other special-purpose ranges are)",
    )
    SANDLOT_UNFILTERED_EGRESS: Literal["no-network", "allow", "refuse"] = Field(
        "no-network",
        description="runs asking for network where their egress cannot be filtered (no `NET_ADMIN` in a container; "
        "no pasta without root): `no-network` serves them without network, their socket calls failing with the "
        "reason; `allow` gives them the network unfiltered (the host's loopback, private networks and metadata "
        "address too); `refuse` answers them with `-500`",
    )
    SANDLOT_PASTA: str = Field(
        "pasta",
        description="without root: pasta (Debian package `passt`), command or path, which gives runs with network "
        "their way out of a network namespace of their own; empty or missing: runs with network are refused",
    )

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

    @field_validator("ALLOWED_SYSCALLS", "SANDLOT_PYTHON_PRELOAD", "SANDLOT_EGRESS_ALLOW", mode="before")
    @classmethod
    def _comma_list(cls, value: Any) -> Any:
        return comma_list(value)

    @field_validator("SANDLOT_DATA_DIR")
    @classmethod
    def _not_under_tmp(cls, value: str, info: ValidationInfo) -> str:
        if info.data.get("SANDLOT_BACKEND") == "lambda":
            return value  # no layers here; and the API function on Lambda imports no jail module
        from runtimes.tree import under_tmp

        if under_tmp(value):
            raise ValueError("must not be under /tmp: every run gets a /tmp of its own, which would hide the layers")
        return value

    @field_validator("PYTHON_DEPS_UPDATE_INTERVAL")
    @classmethod
    def _interval(cls, value: str) -> str:
        if value:
            from layers.manager import parse_interval

            parse_interval(value)
        return value

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
        return self.SANDLOT_BUILD_UID or self.SANDLOT_UID_BASE - 1

    @field_validator("ALLOWED_SYSCALLS")
    @classmethod
    def _syscalls_stay_closed(cls, value: list[int]) -> list[int]:
        if value:  # imported only then: pyseccomp loads libseccomp
            from runtimes.jail.seccomp_policy import check_extra_syscalls

            check_extra_syscalls(value)
        return value

    @classmethod
    def settings_customise_sources(
        cls, settings_cls, init_settings, env_settings, dotenv_settings, file_secret_settings
    ):
        config_path = os.environ.get("SANDLOT_CONFIG", "conf/config.yaml")
        return (init_settings, env_settings, _DifyYamlSource(settings_cls, config_path))

    def runtime_config(self, python_layer: str = "", nodejs_layer: str = "") -> RuntimeConfig:
        proxies = {}
        if self.HTTP_PROXY:
            proxies["HTTP_PROXY"] = proxies["http_proxy"] = self.HTTP_PROXY
        if self.HTTPS_PROXY:
            proxies["HTTPS_PROXY"] = proxies["https_proxy"] = self.HTTPS_PROXY
        if self.SOCKS5_PROXY:
            proxies["ALL_PROXY"] = proxies["all_proxy"] = self.SOCKS5_PROXY
        return RuntimeConfig(
            python_path=self.PYTHON_PATH,
            nodejs_path=self.NODEJS_PATH,
            data_dir=self.SANDLOT_DATA_DIR,
            python_layer=python_layer,
            nodejs_layer=nodejs_layer,
            python_preload=tuple(self.SANDLOT_PYTHON_PRELOAD),
            workers=self.MAX_WORKERS,
            default_timeout=self.WORKER_TIMEOUT,
            max_timeout=max(self.SANDLOT_MAX_TIMEOUT, self.WORKER_TIMEOUT),
            default_memory_mb=self.SANDLOT_MEMORY_LIMIT_MB,
            max_memory_mb=max(self.SANDLOT_MAX_MEMORY_LIMIT_MB, self.SANDLOT_MEMORY_LIMIT_MB),
            output_limit=self.SANDLOT_OUTPUT_LIMIT_BYTES,
            tmp_size_mb=self.SANDLOT_TMP_SIZE_MB,
            tmp_files=self.SANDLOT_TMP_FILES,
            enable_preload=self.ENABLE_PRELOAD,
            require_seccomp=self.SANDLOT_REQUIRE_SECCOMP,
            extra_syscalls=tuple(self.ALLOWED_SYSCALLS),
            jail=self.SANDLOT_JAIL,
            uid_base=self.SANDLOT_UID_BASE,
            zygote_max_forks=self.SANDLOT_ZYGOTE_MAX_FORKS,
            zygote_max_age=self.SANDLOT_ZYGOTE_MAX_AGE,
            run_env=proxies,
            egress_allow=tuple(str(n) for n in self.SANDLOT_EGRESS_ALLOW),
            pasta=self.SANDLOT_PASTA,
            unfiltered_egress=self.SANDLOT_UNFILTERED_EGRESS,
        )


def load_settings(**overrides: Any) -> Settings:
    """Settings from env and file, or SettingsError naming what is wrong."""
    try:
        return Settings(**overrides)
    except _SourceError as exc:
        raise SettingsError(f"invalid setting: {exc}") from exc
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'settings'}: {err['msg']}" for err in exc.errors()
        )
        raise SettingsError(f"invalid setting: {problems}") from exc
