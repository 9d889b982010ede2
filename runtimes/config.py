"""What the runtimes need to know, independent of where the settings came from.

The HTTP service builds it from its settings; a Lambda runtime function builds
it from its environment. Nothing here reads the environment itself.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

MIB = 1024 * 1024

# SANDLOT_JAIL's values: modes.CHOICES (runtimes/jail/modes.py, which decides what each gives on this platform);
# not imported from there, so that loading the settings loads no jail module (tests/test_settings.py keeps them equal)
JAIL_MODES = ("auto", "full", "userns", "reduced", "chroot", "single", "landlock")


def comma_list(value: object) -> object:
    """A setting given as "a, b,c" (environment, file) as a list; anything else as it is."""
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    return value


def default_data_dir() -> str:
    if os.geteuid() == 0:
        return "/var/lib/sandlot"
    return os.path.join(os.path.expanduser("~"), ".cache", "sandlot")


def default_python() -> str:
    """The interpreter itself, not a venv's wrapper around it."""
    return os.path.realpath(getattr(sys, "_base_executable", sys.executable))


@dataclass
class RuntimeConfig:
    python_path: str = field(default_factory=default_python)
    nodejs_path: str = "/usr/bin/node"
    data_dir: str = field(default_factory=default_data_dir)
    python_layer: str = ""  # built layer directory ("" = none)
    python_preload: tuple[str, ...] = ()  # modules the zygote imports; () = every one the layer provides
    nodejs_layer: str = ""  # built layer directory holding node_modules ("" = none)
    workers: int = 4  # children kept ready per runtime
    default_timeout: float = 15.0
    max_timeout: float = 60.0
    default_memory_mb: int = 512
    max_memory_mb: int = 2048
    output_limit: int = 4 * MIB
    tmp_size_mb: int = 64
    tmp_files: int = 2048
    max_open_files: int = 256
    max_threads: int = 64
    max_file_mb: int = 64
    enable_preload: bool = False
    require_seccomp: bool = True
    extra_syscalls: tuple[int, ...] = ()
    jail: str = "auto"  # auto, or a mode's name: see runtimes/jail/modes.py
    # One run at a time and nothing of it left before the next (a Lambda instance, `sandlot run --local`):
    # the serial schedule (runtimes/jail/service/serial.py); a platform without a uid or namespaces per run may
    # serve then, and only then.
    one_run_at_a_time: bool = False
    uid_base: int = 1_500_000_000
    uid_count: int = 1024
    zygote_max_forks: int = 2000
    zygote_max_age: float = 300.0  # seconds; 0: replaced by forks only
    zygote_start_timeout: float = 60.0  # seconds a zygote may take to be ready
    run_env: dict[str, str] = field(default_factory=dict)  # proxies handed to user code
    egress_allow: tuple[str, ...] = ()  # networks runs may reach although private
    pasta: str = "pasta"  # userns without root: the runs' way out (runtimes/linux/pasta.py); "": none
    # runs asking for network where egress cannot be filtered: no-network | allow | refuse
    # (jail/policy/network_access.py)
    unfiltered_egress: str = "no-network"
    # where egress cannot be filtered and a proxy is configured: runs reach only its port (jail/policy/proxy_egress.py)
    proxy_egress: str = "auto"

    def environment(self) -> dict[str, str]:
        """The whole environment of a run: nothing of the service's own."""
        return {"LANG": "C.UTF-8", "HOME": "/tmp", "TMPDIR": "/tmp", **self.run_env}

    def clamp_timeout(self, requested: float | None) -> float:
        value = self.default_timeout if requested is None else requested
        return max(0.001, min(float(value), self.max_timeout))

    def clamp_memory(self, requested: int | None) -> int:
        value = self.default_memory_mb if requested is None else requested
        return max(16, min(int(value), self.max_memory_mb))


def proxy_environment(settings) -> dict[str, str]:
    """The proxy variables handed to user code, in both spellings tools read (settings: the runtimes' settings,
    runtime_settings.py's model or a runtime function's light reading of them, function/environment.py)."""
    found = {}
    for name, value in (("HTTP_PROXY", settings.HTTP_PROXY), ("HTTPS_PROXY", settings.HTTPS_PROXY)):
        if value:
            found[name] = found[name.lower()] = value
    if settings.SOCKS5_PROXY:
        found["ALL_PROXY"] = found["all_proxy"] = settings.SOCKS5_PROXY
    return found


def runtime_config_of(
    settings,
    *,
    python_layer: str = "",
    nodejs_layer: str = "",
    workers: int = 4,
    data_dir: str | None = None,
    one_run_at_a_time: bool = False,
) -> RuntimeConfig:
    """The one mapping of the runtimes' settings (by their names, runtime_settings.py) to what the runtimes read;
    the caller says what the settings cannot (layers in use, children kept ready, one run at a time)."""
    return RuntimeConfig(
        python_path=settings.PYTHON_PATH,
        nodejs_path=settings.NODEJS_PATH,
        data_dir=settings.SANDLOT_DATA_DIR if data_dir is None else data_dir,
        python_layer=python_layer,
        nodejs_layer=nodejs_layer,
        python_preload=tuple(settings.SANDLOT_PYTHON_PRELOAD),
        workers=workers,
        default_timeout=settings.WORKER_TIMEOUT,
        max_timeout=max(settings.SANDLOT_MAX_TIMEOUT, settings.WORKER_TIMEOUT),
        default_memory_mb=settings.SANDLOT_MEMORY_LIMIT_MB,
        max_memory_mb=max(settings.SANDLOT_MAX_MEMORY_LIMIT_MB, settings.SANDLOT_MEMORY_LIMIT_MB),
        output_limit=settings.SANDLOT_OUTPUT_LIMIT_BYTES,
        tmp_size_mb=settings.SANDLOT_TMP_SIZE_MB,
        tmp_files=settings.SANDLOT_TMP_FILES,
        enable_preload=settings.ENABLE_PRELOAD,
        require_seccomp=settings.SANDLOT_REQUIRE_SECCOMP,
        extra_syscalls=tuple(settings.ALLOWED_SYSCALLS),
        jail=settings.SANDLOT_JAIL,
        one_run_at_a_time=one_run_at_a_time,
        uid_base=settings.SANDLOT_UID_BASE,
        zygote_max_forks=settings.SANDLOT_ZYGOTE_MAX_FORKS,
        zygote_max_age=settings.SANDLOT_ZYGOTE_MAX_AGE,
        zygote_start_timeout=settings.SANDLOT_ZYGOTE_START_TIMEOUT,
        run_env=proxy_environment(settings),
        egress_allow=tuple(str(network) for network in settings.SANDLOT_EGRESS_ALLOW),
        pasta=settings.SANDLOT_PASTA,
        unfiltered_egress=settings.SANDLOT_UNFILTERED_EGRESS,
        proxy_egress=settings.SANDLOT_PROXY_EGRESS,
    )
