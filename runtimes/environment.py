"""A runtime function's configuration, from its own environment (the template sets it).

The same names as the service's settings where they mean the same thing; a
runtime function never imports handler/. One run at a time, always: a Lambda
instance serves one invocation at a time.
"""

from __future__ import annotations

import os
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from runtimes import tempdirs
from runtimes.config import RuntimeConfig, comma_list, default_python

# Where the image layout script puts the baked layers (infra/layout.py)
IMAGE_ROOT = "/opt/sandlot"


class ConfigError(ValueError):
    pass


class FunctionEnvironment(BaseSettings):
    model_config = SettingsConfigDict(case_sensitive=True, extra="ignore")

    WORKER_TIMEOUT: float = Field(15, gt=0)
    SANDLOT_MAX_TIMEOUT: float = Field(60, gt=0)
    SANDLOT_MEMORY_LIMIT_MB: int = Field(512, ge=16)
    SANDLOT_MAX_MEMORY_LIMIT_MB: int = Field(2048, ge=16)
    SANDLOT_OUTPUT_LIMIT_BYTES: int = Field(4 * 1024 * 1024, ge=1024)
    ENABLE_NETWORK: bool = True
    ENABLE_PRELOAD: bool = False
    SANDLOT_REQUIRE_SECCOMP: bool = True
    ALLOWED_SYSCALLS: Annotated[list[int], NoDecode] = []
    HTTP_PROXY: str = ""
    HTTPS_PROXY: str = ""
    SOCKS5_PROXY: str = ""
    PYTHON_PATH: str = Field(default_factory=default_python)
    NODEJS_PATH: str = "/usr/bin/node"
    SANDLOT_JAIL: Literal["auto", "full", "reduced"] = "auto"
    SANDLOT_DATA_DIR: str = ""  # "" = a directory of its own under the temp dir (the only writable place)
    SANDLOT_PYTHON_LAYER: str = os.path.join(IMAGE_ROOT, "layers", "python")
    SANDLOT_NODEJS_LAYER: str = os.path.join(IMAGE_ROOT, "layers", "nodejs")
    SANDLOT_PYTHON_PRELOAD: Annotated[list[str], NoDecode] = []
    SANDLOT_ZYGOTE_MAX_FORKS: int = Field(2000, ge=10)  # as the service's: how long runs share a zygote
    SANDLOT_ZYGOTE_MAX_AGE: float = Field(300, ge=0)

    @field_validator("ALLOWED_SYSCALLS", "SANDLOT_PYTHON_PRELOAD", mode="before")
    @classmethod
    def _comma_list(cls, value: Any) -> Any:
        return comma_list(value)

    @field_validator("ALLOWED_SYSCALLS")
    @classmethod
    def _syscalls_stay_closed(cls, value: list[int]) -> list[int]:
        from runtimes.jail.seccomp_policy import check_extra_syscalls

        check_extra_syscalls(value)
        return value

    def runtime_config(self) -> RuntimeConfig:
        proxies = {}
        for name, value, lower in (
            ("HTTP_PROXY", self.HTTP_PROXY, "http_proxy"),
            ("HTTPS_PROXY", self.HTTPS_PROXY, "https_proxy"),
            ("ALL_PROXY", self.SOCKS5_PROXY, "all_proxy"),
        ):
            if value:
                proxies[name] = proxies[lower] = value
        data_dir = self.SANDLOT_DATA_DIR or tempdirs.make("data")  # removed at stop (tempdirs.py)
        return RuntimeConfig(
            python_path=self.PYTHON_PATH,
            nodejs_path=self.NODEJS_PATH,
            data_dir=data_dir,
            python_layer=self.SANDLOT_PYTHON_LAYER if os.path.isdir(self.SANDLOT_PYTHON_LAYER) else "",
            nodejs_layer=self.SANDLOT_NODEJS_LAYER if os.path.isdir(self.SANDLOT_NODEJS_LAYER) else "",
            python_preload=tuple(self.SANDLOT_PYTHON_PRELOAD),
            workers=2,  # kept ready only where each run has a uid of its own: back-to-back runs find one
            default_timeout=self.WORKER_TIMEOUT,
            max_timeout=max(self.SANDLOT_MAX_TIMEOUT, self.WORKER_TIMEOUT),
            default_memory_mb=self.SANDLOT_MEMORY_LIMIT_MB,
            max_memory_mb=max(self.SANDLOT_MAX_MEMORY_LIMIT_MB, self.SANDLOT_MEMORY_LIMIT_MB),
            output_limit=self.SANDLOT_OUTPUT_LIMIT_BYTES,
            enable_preload=self.ENABLE_PRELOAD,
            require_seccomp=self.SANDLOT_REQUIRE_SECCOMP,
            extra_syscalls=tuple(self.ALLOWED_SYSCALLS),
            jail=self.SANDLOT_JAIL,
            one_run_at_a_time=True,
            zygote_max_forks=self.SANDLOT_ZYGOTE_MAX_FORKS,
            zygote_max_age=self.SANDLOT_ZYGOTE_MAX_AGE,
            run_env=proxies,
        )


def function_environment(environ: dict[str, str] | None = None) -> FunctionEnvironment:
    """The settings from environ (os.environ by default), or ConfigError naming what is wrong."""
    try:
        if environ is None:
            return FunctionEnvironment()
        return FunctionEnvironment(**{k: v for k, v in environ.items() if k in FunctionEnvironment.model_fields})
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"invalid setting: {problems}") from exc
