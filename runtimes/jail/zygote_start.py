"""How the service starts a zygote's process, and a zygote's interpreter started ahead of its config.

Standard library only, and light: a runtime function's early hook (runtimes/function/early.py) starts the
zygote's interpreter from here as the function's own interpreter starts, before awslambdaric and the
function's modules are imported, so that the zygote's interpreter start and imports (about 45 ms of CPU,
most of a zygote's start) run beside them instead of after them.

The zygote's command (`command`) runs BOOTSTRAP: it reads its import paths (the first line of its config
descriptor), imports the zygote's module, and only then reads the rest of the descriptor, the config
(zygote_config.py's ZygoteConfig, as JSON), up to its end. The service's usual start (supervisor.py) gives
it an unlinked file holding both; a zygote started ahead (`start_ahead`) gets a pipe, the import paths
written into it at once and the config once the runtime has chosen its mode and built it. Nothing in the
zygote is done differently either way: the same argv, environment, working directory and descriptors, and
everything it does with its config (its confinement, its tree, its runner's preparation) happens only once
the config is read, as before. A zygote started ahead is used only by a start whose interpreter,
environment, runner and import paths are the very ones it was started with (`take_ahead`); otherwise it is
killed (`discard_ahead`), and so is one nobody took once the runtime has started. Should the process that
started it die first, its end of the pipe closes and the zygote exits without a config.
"""

from __future__ import annotations

import json
import os
import socket

ZYGOTE_MODULE = "runtimes.jail.zygote.loop"  # what BOOTSTRAP imports (ps and the tests know zygotes by it)

# The zygote's configuration comes on an inherited descriptor (an unlinked file or a pipe), not in its argv: argv
# stays in the process's memory (sys.orig_argv, the stack), which every run inherits. The first line: the import
# paths; the rest: the config, read once the zygote's module is imported (an empty rest: no config, exit).
BOOTSTRAP = (
    "import json, os, sys\n"
    "with os.fdopen(int(sys.argv[1]), 'rb') as f:\n"
    "    sys.path[:0] = json.loads(f.readline())\n"
    f"    from {ZYGOTE_MODULE} import main\n"
    "    config = f.read()\n"
    "if config:\n"
    "    main(json.loads(config))\n"
)


def import_paths() -> tuple[str, ...]:
    """Where the zygote finds this package and pyseccomp before it confines itself (the service's call). Found
    without importing pyseccomp, which loads libseccomp: a Lambda function's process may need none of it."""
    import importlib.util

    import runtimes

    paths = [os.path.dirname(os.path.dirname(os.path.abspath(runtimes.__file__)))]
    found = importlib.util.find_spec("pyseccomp")
    if found is None or found.origin is None:
        raise ImportError("pyseccomp is not installed")
    seccomp_dir = os.path.dirname(os.path.abspath(found.origin))
    if seccomp_dir not in paths:
        paths.append(seccomp_dir)
    return tuple(paths)


def header(paths: tuple[str, ...]) -> bytes:
    """The config descriptor's first line: the import paths."""
    return json.dumps(list(paths)).encode() + b"\n"


def command(python: str, config_fd: int, runner: str) -> list[str]:
    """The argv that starts a zygote (isolated mode, no site, UTF-8), its configuration on config_fd; the
    runner's module name last, unused, so that ps tells the zygotes of each language apart."""
    return [python, "-I", "-S", "-X", "utf8", "-c", BOOTSTRAP, str(config_fd), runner]


def popen(python: str, env: dict[str, str], runner: str, config_fd: int, control_fd: int):
    """The zygote's process, as every zygote is started (the same call for the usual start and one ahead)."""
    import subprocess

    return subprocess.Popen(
        command(python, config_fd, runner),
        env=env,
        cwd="/",
        stdin=subprocess.DEVNULL,
        pass_fds=[control_fd, config_fd],
        close_fds=True,
    )


class Ahead:
    """A zygote's process started ahead of its config: its import paths read, its config to come on a pipe."""

    def __init__(self, python: str, env: dict[str, str], runner: str, paths: tuple[str, ...]):
        self.key = (python, dict(env), runner, tuple(paths))
        self.control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        read_end, self.config_fd = os.pipe2(os.O_CLOEXEC)
        try:
            os.write(self.config_fd, header(paths))  # far below a pipe's buffer: never blocks
            self.process = popen(python, env, runner, read_end, theirs.fileno())
        except BaseException:
            self.control.close()
            os.close(self.config_fd)
            raise
        finally:
            os.close(read_end)
            self.control_fd = theirs.fileno()  # its number in the zygote (pass_fds keeps it)
            theirs.close()

    def matches(self, python: str, env: dict[str, str], runner: str, paths: tuple[str, ...]) -> bool:
        return self.key == (python, dict(env), runner, tuple(paths)) and self.process.poll() is None

    def send(self, config: bytes) -> None:
        """The config, then the pipe's end (the zygote reads up to it). Raises OSError if the zygote is gone."""
        fd, self.config_fd = self.config_fd, -1
        try:
            view = memoryview(config)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)

    def close_inherited(self) -> None:
        """In a child forked from the process that started it (the platform probe's): not its end to hold."""
        self.control.close()
        if self.config_fd >= 0:
            os.close(self.config_fd)

    def discard(self) -> None:
        self.control.close()
        if self.config_fd >= 0:
            os.close(self.config_fd)
            self.config_fd = -1
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


_ahead: Ahead | None = None


def start_ahead(python: str, env: dict[str, str], runner: str) -> None:
    """Start a zygote's interpreter now, for the first start (take_ahead) that asks for this very one."""
    global _ahead
    if _ahead is None:
        _ahead = Ahead(python, env, runner, import_paths())


def take_ahead(python: str, env: dict[str, str], runner: str, paths: tuple[str, ...]) -> Ahead | None:
    """The zygote started ahead, if it was started with exactly these (then it is the caller's), else None (and
    any other started ahead is killed: nobody else would take it)."""
    global _ahead
    ahead, _ahead = _ahead, None
    if ahead is None:
        return None
    if ahead.matches(python, env, runner, paths):
        return ahead
    ahead.discard()
    return None


def discard_ahead() -> bool:
    """Kill a zygote started ahead that nobody took (the runtime started without it, or refused to start).
    True if there was one."""
    global _ahead
    ahead, _ahead = _ahead, None
    if ahead is not None:
        ahead.discard()
    return ahead is not None


def close_inherited() -> None:
    """In a forked child (no exec) of the process that started one ahead: its descriptors are not the child's."""
    if _ahead is not None:
        _ahead.close_inherited()
