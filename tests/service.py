"""A real Sandlot service process on a free port, for tests that go through HTTP."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

API_KEY = "test-key-" + os.urandom(6).hex()
# How many times slower than a real machine this one runs code: the hostile corpus' time bounds (a run's timeout,
# how soon the service ends it) are multiplied by it. 1 but in the emulated arm64 machine (infra/arm64/vm.py), whose
# software-emulated CPU runs about fifty times slower.
SLOWDOWN = float(os.environ.get("SANDLOT_TEST_SLOWDOWN", "1"))
IS_ROOT = os.geteuid() == 0
OUTER_FILTER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "outer_filter.py")
# A container on default privileges, stood in for by outer_filter.py: Docker's default capabilities and the
# rules of Docker's default seccomp profile (no namespaces, no mounts, clone without CLONE_NEW*, no clone3)
DOCKER_DEFAULT = ["--caps", "docker-default", "--profile", "docker-default"]
# The stand-in switch: SANDLOT_TEST_CONTAINER=docker-default starts every Service of a test run in it
STANDINS = {"": [], "docker-default": DOCKER_DEFAULT}
STANDIN = os.environ.get("SANDLOT_TEST_CONTAINER", "")
if STANDIN not in STANDINS:
    raise RuntimeError(f"SANDLOT_TEST_CONTAINER={STANDIN!r}: one of {', '.join(filter(None, STANDINS))}")


# What a test that asserts a jail with namespaces says under the stand-in switch, where it skips
NAMESPACES_ONLY = (
    f"SANDLOT_TEST_CONTAINER={STANDIN}: every service is the chroot jail there, without NET_ADMIN, and this "
    "asserts a jail with namespaces or nft egress rules (the chroot jail's own corpus: tests/test_container.py)"
)


def require_namespaces(mode: str = "") -> None:
    """In a fixture that builds a jail with namespaces (mode: one other than `container`): skip under the
    stand-in switch, where no namespace can be made."""
    if STANDIN and mode != "container":
        import pytest

        pytest.skip(NAMESPACES_ONLY)


def standin(restriction: list[str]) -> list[str]:
    """The launcher that starts a command under outer_filter.py's restriction (none: no launcher)."""
    return [sys.executable, OUTER_FILTER, *restriction, "--"] if restriction else []


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Service:
    def __init__(self, cwd: str | None = None, launcher: list[str] | None = None, **env: str):
        self.cwd = cwd
        # e.g. tests/outer_filter.py ... --: the service starts under it (default: the stand-in switch's)
        self.launcher = launcher if launcher is not None else standin(STANDINS[STANDIN])
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "API_KEY": API_KEY,
            "SANDLOT_HOST": "127.0.0.1",
            "SANDBOX_PORT": str(self.port),
            "SANDLOT_CONFIG": "/nonexistent/config.yaml",
            **env,
        }
        self.process: subprocess.Popen | None = None
        self.python = sys.executable  # tests/unprivileged.py: an interpreter another uid can run
        if self.launcher and IS_ROOT:
            import unprivileged  # it imports this module

            # in a default container layer builds run as their uid without a tree: it must be able to run pip
            self.python = unprivileged.venv_python()
            # a launcher may change the uid (--uid): the project from where any uid can read it (the checkout, or
            # a copy where the checkout is closed to others, as a clone in a mode-700 temp dir is)
            self.source = unprivileged.source()
        else:
            self.source = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the project it runs
        self.user: int | None = None  # start the service as this uid (and gid), no groups
        # the uid in the name: a log another uid's run left under this port (a killed run) cannot be opened
        self.log_path = f"/tmp/sandlot-test-{os.getuid()}-{self.port}.log"

    def start(self, wait: bool = True) -> Service:
        self.log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        identity = {"user": self.user, "group": self.user, "extra_groups": []} if self.user is not None else {}
        self.process = subprocess.Popen(
            [*self.launcher, self.python, "-m", "handler.cli", "serve"],
            env={**self.env, "PYTHONPATH": self.source},
            cwd=self.cwd,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            **identity,
        )
        if wait:
            try:
                self.wait_healthy()
            except BaseException:
                self.stop()  # a service that never became healthy must not outlive the test
                raise
        return self

    def wait_healthy(self, timeout: float = 0) -> None:
        # SANDLOT_TEST_HEALTHY_TIMEOUT: longer where a start takes minutes (the emulated arm64 machine)
        timeout = timeout or float(os.environ.get("SANDLOT_TEST_HEALTHY_TIMEOUT", 180))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"service exited with {self.process.returncode}:\n{self.output()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"service not healthy in {timeout}s:\n{self.output()}")

    def output(self) -> str:
        if not os.path.exists(self.log_path):
            return getattr(self, "final_output", "")
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def client(self, **kwargs) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"X-Api-Key": API_KEY}, timeout=60, **kwargs)

    def run(self, code: str, language: str = "python3", **fields) -> dict:
        """POST a run; return the whole envelope."""
        with self.client() as client:
            response = client.post("/v1/sandbox/run", json={"language": language, "code": code, **fields})
        return response.json()

    def detail_dependencies(self, language: str = "python3") -> list[dict]:
        with self.client() as client:
            return client.get("/v1/sandbox/dependencies", params={"language": language}).json()["data"]["dependencies"]

    def detail(self) -> dict:
        with self.client() as client:
            return client.get("/v1/sandbox/health").json()["data"]

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()
        if os.path.exists(self.log_path):
            self.final_output = self.output()
            os.unlink(self.log_path)


def wait_for(predicate, timeout=10.0):
    """Poll predicate until it holds or timeout passes; its last answer."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def descendants(pid: int) -> list[int]:
    """Every live process below pid, found through /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def processes_with_uid_in(first: int, last: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/status") as f:
                    for line in f:
                        if line.startswith("Uid:"):
                            if first <= int(line.split()[1]) <= last:
                                found.append(int(entry))
                            break
            except OSError:
                continue
    return found


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def uid_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Uid:"):
                return int(line.split()[1])
    raise LookupError(pid)


def expected_processes(svc) -> int:
    """What should live below the service: each running runtime's zygotes (Python's two, lean and preloaded)
    and its ready children (each the first process of its PID namespace, where runs have one); and without
    root the pasta of each zygote (the runs' way out of their network namespace)."""
    total = 0
    for rt in svc.detail()["runtimes"].values():
        if rt.get("zygote") == "running":  # none yet where the runtime is still starting (no pool)
            pasta = 1 if rt["protections"].get("network_namespace") and rt["protections"]["egress_filter"] else 0
            total += rt["zygotes"] * (1 + pasta) + rt["ready_children"]
    return total


def output(svc: Service, code: str, language: str = "python3", **fields) -> str:
    """What a run printed and its error lines, from an envelope that must say success."""
    envelope = svc.run(code, language=language, **fields)
    assert envelope["code"] == 0, envelope
    return envelope["data"]["stdout"] + envelope["data"]["error"]


def together(svc: Service, first, second, delay: float = 1.0) -> list[str]:
    """Two runs at once, the second posted `delay` seconds after the first; each a Python code, or
    (language, code). Their outputs (output())."""

    def post(index: int) -> str:
        run = (first, second)[index]
        language, code = run if isinstance(run, tuple) else ("python3", run)
        if index:
            time.sleep(delay)
        return output(svc, code, language=language, timeout=20)

    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(post, range(2)))
