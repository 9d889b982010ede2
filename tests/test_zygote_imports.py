"""The zygote stays light: what it imports, every run inherits (its heap is each child's).

A fresh interpreter, started as the service starts a zygote (isolated, no site, the
zygote's import paths), imports exactly what a real zygote imports of ours: the
zygote's module (BOOTSTRAP's import), the language's runner module (the zygote's
import by name, zygote/runner.py), and the runner's config class (decoded from
the config file). Warm() imports nothing of ours; the layer's packages are not
ours to check. No asyncio, logging, inotify or pydantic, and nothing of the
service's side of the jail may be among them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from runtimes.jail.zygote_config import ZYGOTE_MODULE, import_paths

RUNNERS = {
    "runtimes.python.runner": "runtimes.python.runner_config",
    "runtimes.nodejs.runner": "runtimes.nodejs.runner_config",
}
FORBIDDEN_TOP = ("asyncio", "logging", "inotify_simple", "pydantic", "pydantic_core", "pydantic_settings")
FORBIDDEN_OURS = ("runtimes.jail.service", "runtimes.jail.tmp", "runtimes.jail.trees", "runtimes.config")

SCRIPT = """
import json, sys
sys.path[:0] = json.loads(sys.argv[1])
before = set(sys.modules)
import importlib
for name in json.loads(sys.argv[2]):
    importlib.import_module(name)
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def zygote_imports(runner: str) -> list[str]:
    names = [ZYGOTE_MODULE, runner, RUNNERS[runner]]
    command = [sys.executable, "-I", "-S", "-X", "utf8", "-c", SCRIPT, json.dumps(import_paths()), json.dumps(names)]
    out = subprocess.run(command, capture_output=True, text=True, check=True, env={}, cwd="/")
    return json.loads(out.stdout)


def forbidden(modules: list[str]) -> list[str]:
    return [
        m
        for m in modules
        if m.partition(".")[0] in FORBIDDEN_TOP or any(m == f or m.startswith(f + ".") for f in FORBIDDEN_OURS)
    ]


@pytest.mark.parametrize("runner", sorted(RUNNERS))
def test_the_zygote_imports_nothing_heavy_nor_of_the_service(runner):
    modules = zygote_imports(runner)
    assert runner in modules and ZYGOTE_MODULE in modules  # the check did import them
    found = forbidden(modules)
    assert not found, f"the {runner} zygote imports {found} ({len(modules)} modules: {modules})"


# what neither a zygote nor its runs need: ctypes.util (with subprocess's and shutil's kin) only finds pyseccomp's
# libraries, which load by soname (runtimes/linux/libseccomp.py); the probe's module is the service's
NOT_IN_A_ZYGOTE = ("ctypes.util", "tempfile", "shutil", "runtimes.linux.protections")


@pytest.mark.parametrize("runner", sorted(RUNNERS))
def test_the_zygote_imports_neither_ctypes_util_nor_the_probe(runner):
    modules = zygote_imports(runner)
    assert "pyseccomp" in modules
    assert not [m for m in NOT_IN_A_ZYGOTE if m in modules], modules


def test_the_service_side_imports_nothing_of_the_zygote():
    """The service builds the config and starts a zygote through the shared module, never through the zygote's."""
    script = (
        "import sys\n"
        "import runtimes.jail.service.runtime, runtimes.python.runtime, runtimes.nodejs.runtime\n"
        "print('\\n'.join(m for m in sys.modules if m.startswith('runtimes.jail.zygote.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [], f"the service imports {out.stdout.split()}"


def test_the_config_travels_typed():
    """What the service writes is what the zygote reads: the record, its runner's part of its own class."""
    from runtimes.jail import modes
    from runtimes.jail.zygote_config import Confinement, ZygoteConfig, ZygoteNetwork
    from runtimes.nodejs.runner_config import NodeRunnerConfig

    mode = modes.FULL
    config = ZygoteConfig(
        import_paths=("/a", "/b"),
        runner="runtimes.nodejs.runner",
        runner_config=NodeRunnerConfig(extra_syscalls=(1, 2), node="/usr/bin/node", snapshot_flags=("--x",)),
        confinement=Confinement(mode, 1, 2, 3, 4, 5, landlock=6, watched=True),
        tree={"binds": [["/usr", "/usr"]]},
        readable=("/",),
        connect_ports=(3128,),
        network=ZygoteNetwork(netns=True, ruleset="table inet x {}"),
        control_fd=7,
    )
    decoded = ZygoteConfig.decode(json.loads(config.to_json()))
    assert decoded == dataclasses.replace(config, tree=decoded.tree)
    assert type(decoded.runner_config) is NodeRunnerConfig
    assert dict(decoded.tree) == json.loads(json.dumps(config.tree))


NO_PROGRAMS = """
import json, subprocess, sys
sys.path[:0] = json.loads(sys.argv[1])

def refused(args, *rest, **options):
    raise AssertionError(f"started {args}")

subprocess.Popen = refused  # ctypes.util.find_library runs `ldconfig -p` (or gcc, ld) through it
import importlib
for name in json.loads(sys.argv[2]):
    importlib.import_module(name)
import ctypes.util
print(json.dumps([sys.modules["pyseccomp"]._libseccomp_path, ctypes.util.find_library.__module__]))
"""


@pytest.mark.parametrize("runner", sorted(RUNNERS))
def test_a_zygote_starts_no_program_to_find_libseccomp(runner):
    """pyseccomp finds its libraries with find_library, two `ldconfig -p` runs on every zygote's start (and a
    Lambda function's init): they are loaded by soname instead, and find_library is left as it was."""
    names = [ZYGOTE_MODULE, runner, RUNNERS[runner]]
    command = [sys.executable, "-I", "-S", "-c", NO_PROGRAMS, json.dumps(import_paths()), json.dumps(names)]
    out = subprocess.run(command, capture_output=True, text=True, env={}, cwd="/")
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout) == ["libseccomp.so.2", "ctypes.util"]


def test_the_zygotes_import_paths_are_found_without_loading_libseccomp():
    """The service (a Lambda function's process) names where the zygote finds pyseccomp without importing it."""
    script = (
        "import json, sys\n"
        "from runtimes.jail.zygote_config import import_paths\n"
        "print(json.dumps([import_paths(), 'pyseccomp' in sys.modules]))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    paths, imported = json.loads(out.stdout)
    import pyseccomp

    assert os.path.dirname(os.path.abspath(pyseccomp.__file__)) in paths and not imported
