"""What the service starts a zygote with: one typed record, and how it travels.

Shared vocabulary of both sides (beside modes.py and protocol.py): the service
builds a `ZygoteConfig` (service/runtime.py), writes it to an unlinked file
(`config_file`) and execs the zygote on `command(...)` (zygote_start.py); the zygote
reads the file in `BOOTSTRAP`, decodes the record (`ZygoteConfig.decode`) and reads it
by attribute (zygote/loop.py, zygote/confine.py, the runners). Nothing here
imports either side: the service never imports the zygote's modules, and the
zygote nothing of the service's (tests/test_zygote_imports.py).

The record is a frozen stdlib dataclass, not a pydantic model: the zygote
stays light, and its heap is what every run inherits. Its parts:

- `Confinement`: how every child of the zygote is confined (zygote/confine.py);
- `ZygoteNetwork`: the runs' own network namespace (userns without root);
- `RunnerConfig`: what the language runner's `prepare()` is given; each
  language declares a subclass of its own (runtimes/python/runner_config.py,
  runtimes/nodejs/runner_config.py), named in the file by module and class so
  that the zygote decodes it without knowing the languages.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, Any, ClassVar

from runtimes.jail.modes import Mode
from runtimes.jail.zygote_start import BOOTSTRAP, ZYGOTE_MODULE, command, header, import_paths  # noqa: F401


def _tuples(value: Any) -> Any:
    """JSON has lists only: the record's sequences are tuples again (frozen records compare and hash)."""
    return tuple(value) if isinstance(value, list) else value


def _decode_flat(cls: type, data: Mapping) -> Any:
    """A flat record (strings, numbers, flags, tuples) from its dict; keys it does not know are an error."""
    return cls(**{key: _tuples(value) for key, value in data.items()})


@dataclass(frozen=True)
class RunnerConfig:
    """What every language runner is given (runner.prepare); a language's subclass adds its own fields."""

    require_seccomp: bool = True  # refuse to run without the allow-list filter
    extra_syscalls: tuple[int, ...] = ()  # allowed on top of the allow-list (the operator's)
    seccomp: bool = True  # the platform's record found seccomp possible at all (policy/seccomp.prepared)
    refuse_links: bool = False  # link(2) refused: runs share the tree's files where the kernel lets anyone link them

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> RunnerConfig:
        return _decode_flat(cls, data)


@dataclass(frozen=True)
class Confinement:
    """How to confine a child; the same for every child of one zygote (zygote/confine.py)."""

    mode: Mode
    tmp_size_bytes: int
    tmp_files: int
    max_open_files: int
    max_threads: int
    max_file_bytes: int
    landlock: int = 0  # Landlock ABI to use, 0 for none
    tmp_huge_pages: bool = False  # set by the zygote when this kernel's tmpfs takes huge=within_size
    time_namespace: bool = False  # a time namespace per run, its clocks from zero (timens.py)
    bounding_set_dropped: bool = False  # set by the zygote when its children inherit its empty bounding set
    # What the platform's record found possible at all (protections.py): where a call is refused it is not
    # made, since some platforms (Lambda, reportedly) kill a caller of a refused call with SIGSYS instead of
    # failing it. A mode that needs one of them is refused before any zygote starts (modes.py).
    dumpable: bool = True  # PR_SET_DUMPABLE (the zygote's)
    pdeathsig: bool = True  # PR_SET_PDEATHSIG
    no_new_privs: bool = True  # PR_SET_NO_NEW_PRIVS
    seccomp: bool = True  # a seccomp filter (the signal fence, the runner's allow-list)
    hostname: bool = True  # sethostname in the run's UTS namespace (cosmetic: skipped where refused)
    # its /tmp is a directory the service caps (tmp/caps.py): the run is dumpable to its own uid, whose ids the
    # service takes to read its /proc fd table and maps for files whose names went (tmp/held.py)
    watched: bool = False

    @classmethod
    def from_dict(cls, data: Mapping) -> Confinement:
        return cls(**{**data, "mode": Mode.from_dict(data["mode"])})

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "mode": self.mode.to_dict()}


@dataclass(frozen=True)
class ZygoteNetwork:
    """userns without root: the runs' network namespace (linux/pasta.py's NamespaceNetwork, as the zygote needs it)."""

    netns: bool = False  # unshare a network namespace of its own
    ruleset: str = ""  # the egress rules to install in it before pasta attaches ("": none, pasta is not asked)


@dataclass(frozen=True)
class ZygoteConfig:
    """Everything a zygote is started with, from the current layer and settings."""

    import_paths: tuple[str, ...]  # where it finds this package and pyseccomp (BOOTSTRAP), hidden once warm
    runner: str  # the runner's module name (runtimes.python.runner, runtimes.nodejs.runner)
    runner_config: RunnerConfig  # the runner's part: a language's own subclass
    confinement: Confinement
    tree: Mapping | None = None  # the pivot mode: the tree to build (linux/rootfs.TreeSpec.to_dict())
    tree_root: str = ""  # pivot: the tree's mount point; chroot: the materialized tree to chroot into
    readable: tuple[str, ...] | None = None  # the landlock mode: what a run may read and execute
    connect_ports: tuple[int, ...] | None = None  # proxy egress: TCP connect to these ports only
    zygote_uid: int = -1  # userns as root: the uid the zygote drops to
    network: ZygoteNetwork | None = None
    # the serial schedule's first-run zygote (runtime.first_run_apart): it forks one child, for one run, and is
    # replaced; it skips what only pays back over many forks (the full collection, the huge pages: warmheap.py)
    single_fork: bool = False
    control_fd: int = -1  # its end of the control channel (set by the service as it starts it)

    FORMAT: ClassVar[str] = "runner_config_type"  # the file's key naming the runner's config class

    def to_dict(self) -> dict:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        kind = type(self.runner_config)
        data.update(
            runner_config=self.runner_config.to_dict(),
            confinement=self.confinement.to_dict(),
            network=dataclasses.asdict(self.network) if self.network else None,
            tree=dict(self.tree) if self.tree is not None else None,
        )
        data[self.FORMAT] = f"{kind.__module__}:{kind.__qualname__}"
        return data

    @classmethod
    def decode(cls, data: Mapping) -> ZygoteConfig:
        """The record from the file's dict; the runner's part decoded by its own class (a small module)."""
        data = dict(data)
        module, _, name = data.pop(cls.FORMAT, f"{__name__}:RunnerConfig").partition(":")
        runner_type: type[RunnerConfig] = getattr(importlib.import_module(module), name)
        network = data.get("network")
        fields = {key: _tuples(value) for key, value in data.items()}
        fields.update(
            runner_config=runner_type.from_dict(data["runner_config"]),
            confinement=Confinement.from_dict(data["confinement"]),
            network=ZygoteNetwork(**network) if network is not None else None,
        )
        return cls(**fields)

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict()).encode()

    def with_control(self, fd: int) -> ZygoteConfig:
        return dataclasses.replace(self, control_fd=fd)


# ---- how the service starts a zygote on it (the command: zygote_start.py, light, for a zygote started ahead too) ---


def config_file(config: ZygoteConfig) -> IO[bytes]:
    """An unlinked file holding config, positioned at its start, for command()'s descriptor."""
    import tempfile  # the service's only: not in the zygote's imports

    file = tempfile.TemporaryFile()  # noqa: SIM115 - the caller passes its descriptor on, then closes it
    file.write(header(config.import_paths))
    file.write(config.to_json())
    file.seek(0)
    return file
