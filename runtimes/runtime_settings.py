"""The runtimes' settings: one definition for the service and the runtime functions.

The HTTP service (handler/settings.py) and a Lambda runtime function
(runtimes/function/environment.py, which reads them without this model on its cold path,
runtimes/function/environment_model.py being its declaration and its full check) run the
same runtimes, so what the runtimes are told (limits, network, seccomp, jail
mode, egress, zygote life) is declared once here, with dify-sandbox's names
where it has one, and mapped to a RuntimeConfig once (runtimes/config.py's
`runtime_config_of`). Each side adds only what is its own: the service its
port, admission and backend; a function its baked layers. Nothing here imports
the jail at import time: the API function on Lambda (a zip, no libseccomp)
loads the service's settings.
"""

from __future__ import annotations

import os
from typing import Annotated, Any, Literal

from pydantic import Field, IPvAnyNetwork, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from runtimes.config import (
    JAIL_MODES,
    comma_list,
    default_data_dir,
    default_python,
    proxy_environment,
)


def describe_invalid(exc: ValidationError) -> str:
    """A settings validation error as one line naming each setting and what is wrong with it."""
    return "; ".join(f"{'.'.join(str(p) for p in err['loc']) or 'settings'}: {err['msg']}" for err in exc.errors())


class RuntimeSettings(BaseSettings):
    """What the runtimes are told, wherever they run."""

    model_config = SettingsConfigDict(case_sensitive=True, extra="ignore", populate_by_name=True)

    # dify-sandbox's settings
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
    PYTHON_PATH: str = Field(
        default_factory=default_python,
        description="interpreter of the runs",
        json_schema_extra={"shown_default": "the service's interpreter"},
    )
    NODEJS_PATH: str = Field(
        "/usr/bin/node", description="node binary; without it nodejs runs get `-500` and Python still serves"
    )

    # Sandlot's own
    SANDLOT_DATA_DIR: str = Field(
        default_factory=default_data_dir,
        description="where layers live (not under /tmp)",
        json_schema_extra={"shown_default": "/var/lib/sandlot (root), ~/.cache/sandlot"},
    )
    SANDLOT_PYTHON_PRELOAD: Annotated[list[str], NoDecode] = Field(
        [], description="comma-separated modules the Python zygote imports; empty: every module of the layer"
    )
    SANDLOT_MAX_TIMEOUT: float = Field(60, gt=0, description="cap on a request's `timeout`, seconds")
    SANDLOT_MEMORY_LIMIT_MB: int = Field(512, ge=16, description="default `memory_limit_mb` of a run")
    SANDLOT_MAX_MEMORY_LIMIT_MB: int = Field(2048, ge=16, description="cap on a request's `memory_limit_mb`")
    SANDLOT_OUTPUT_LIMIT_BYTES: int = Field(4 * 1024 * 1024, ge=1024, description="stdout + stderr cap of a run")
    SANDLOT_TMP_SIZE_MB: int = Field(
        64, ge=1, description="size of a run's `/tmp` (a tmpfs; in the chroot jail a directory the service caps)"
    )
    SANDLOT_TMP_FILES: int = Field(
        2048, ge=16, description="files in a run's `/tmp` (a tmpfs's inodes; in the chroot jail counted by the service)"
    )
    SANDLOT_REQUIRE_SECCOMP: bool = Field(
        True,
        description="refuse runs when the seccomp filter cannot be installed (a Lambda runtime function then "
        "serves only invocations that carry a tenant id: see the docs' AWS Lambda page, Tenancy and RequireSeccomp)",
    )
    SANDLOT_JAIL: Literal[JAIL_MODES] = Field(  # type: ignore[valid-type]
        "auto",
        description="jail mode: `full` (root: a uid per run), `userns` (user namespaces per run; `reduced` is its "
        "older name), `chroot` (root without namespaces, a container on default privileges: a uid per run in a "
        "materialized tree), `single` (one run at a time only, e.g. Lambda), `landlock` (no root, no "
        "namespaces: runs share the service's uid, each in a Landlock domain of its own), `auto` (from the "
        "protections record)",
    )
    SANDLOT_UID_BASE: int = Field(
        1_500_000_000, ge=65536, le=4_000_000_000, description="first uid of the run uid blocks (1024 uids each)"
    )
    SANDLOT_ZYGOTE_MAX_FORKS: int = Field(2000, ge=10, description="forks before the zygote is replaced")
    SANDLOT_ZYGOTE_MAX_AGE: float = Field(
        300, ge=0, description="seconds before the zygote is replaced (fresh hash secret, addresses); 0: by forks only"
    )
    SANDLOT_ZYGOTE_START_TIMEOUT: float = Field(
        60,
        gt=0,
        description="seconds a zygote may take to start before it is given up and tried again (the preloaded Python "
        "zygote imports the whole layer: raise it on a slow or emulated machine)",
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
    SANDLOT_PROXY_EGRESS: Literal["auto", "on", "off"] = Field(
        "auto",
        description="runs asking for network where their egress cannot be filtered, with a proxy configured "
        "(`HTTP_PROXY`, `HTTPS_PROXY`, `SOCKS5_PROXY`): `auto` lets them reach only the proxy's TCP port "
        "(Landlock ABI 4+; the proxy's address handed to them resolved; no UDP, no DNS) unless "
        "`SANDLOT_UNFILTERED_EGRESS=allow`; `on` also then; `off` never",
    )
    SANDLOT_PASTA: str = Field(
        "pasta",
        description="without root: pasta (Debian package `passt`), command or path, which gives runs with network "
        "their way out of a network namespace of their own; empty or missing: runs with network are refused",
    )

    @field_validator("ALLOWED_SYSCALLS", "SANDLOT_PYTHON_PRELOAD", "SANDLOT_EGRESS_ALLOW", mode="before")
    @classmethod
    def _comma_list(cls, value: Any) -> Any:
        return comma_list(value)

    @field_validator("ALLOWED_SYSCALLS")
    @classmethod
    def _syscalls_stay_closed(cls, value: list[int]) -> list[int]:
        if value:  # imported only then: pyseccomp loads libseccomp
            from runtimes.jail.policy.allowlist import check_extra_syscalls

            check_extra_syscalls(value)
        return value

    def allowed_syscalls_in_force(self) -> dict[str, Any]:
        """ALLOWED_SYSCALLS as this machine reads them (the health detail): its architecture, and each number's
        call there. A number is another call on another architecture (57 is fork on x86_64, close on aarch64)."""
        added: dict[str, str] = {}
        if self.ALLOWED_SYSCALLS:  # imported only then: pyseccomp loads libseccomp
            from runtimes.jail.policy.allowlist import extra_syscall_names

            added = {str(n): name for n, name in extra_syscall_names(self.ALLOWED_SYSCALLS).items()}
        return {"architecture": os.uname().machine, "added": added}

    def keeps_layers(self) -> bool:
        """Whether layers are built and kept in SANDLOT_DATA_DIR (then it must outlive runs: not under /tmp)."""
        return True

    @model_validator(mode="after")
    def _data_dir_outlives_runs(self) -> RuntimeSettings:
        if self.keeps_layers() and self.SANDLOT_DATA_DIR:
            from runtimes.linux.rootfs import under_tmp

            if under_tmp(self.SANDLOT_DATA_DIR):
                raise ValueError(
                    "SANDLOT_DATA_DIR must not be under /tmp: every run gets a /tmp of its own, which would hide "
                    "the layers"
                )
        return self

    def proxies(self) -> dict[str, str]:
        """The proxy variables handed to user code, in both spellings tools read."""
        return proxy_environment(self)
