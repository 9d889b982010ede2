"""The service as a container's pid 1 (handler/pid_one.py): an init in front of it reaps what is handed to
pid 1, forwards a stop, and exits as the service exits.

A container is stood in for by a PID namespace of its own (`unshare --pid --fork --mount-proc`), whose pid
1 is `sandlot serve` (as in Docker, Dify's compose file, Kubernetes and Fargate without an init); with the
default container's restrictions too (tests/outer_filter.py: the chroot jail Dify's compose file gets).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading

import pytest
from conftest import needs_root
from service import DOCKER_DEFAULT, Service, descendants, parent_of, standin, wait_for

pytestmark = needs_root  # a PID namespace of its own, as root: what a container is to the service

CONTAINER = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(line.split(":\t", 1) for line in f.read().splitlines() if ":\t" in line)


def _cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode(errors="replace")


def _stat(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def _zombies(root: int) -> list[int]:
    """Zombies below root (runs are in PID namespaces of their own: found by parent, not namespace)."""
    found = []
    for pid in descendants(root):
        try:
            if _stat(pid)[0] == "Z":
                found.append(pid)
        except OSError:
            continue
    return found


def _pid_one(launcher_pid: int) -> int:
    """The host pid of the namespace's pid 1: unshare's only child."""
    assert wait_for(lambda: any(parent_of(p) == launcher_pid for p in descendants(launcher_pid)), 10)
    return next(p for p in descendants(launcher_pid) if parent_of(p) == launcher_pid)


def _busy_children(root: int, parents: list[int]) -> list[int]:
    """Children of parents that have burnt CPU: runs, not ready children."""
    busy = []
    for pid in descendants(root):
        try:
            fields = _stat(pid)
        except OSError:
            continue
        if int(fields[1]) in parents and int(fields[11]) + int(fields[12]) > 20:
            busy.append(pid)
    return busy


def _pidfds(pids: list[int]) -> list[int]:
    """Pidfds of those still there (readable once each has ended)."""
    found = []
    for pid in pids:
        try:
            found.append(os.pidfd_open(pid))
        except ProcessLookupError:
            continue
    return found


def _python_zygotes(service: int) -> list[int]:
    return [p for p in descendants(service) if parent_of(p) == service and "python.runner" in _cmdline(p)]


@pytest.mark.parametrize("container", ["privileged", "default"])
def test_a_zygote_killed_mid_run_leaves_no_zombie_and_the_service_stops_cleanly(container):
    launcher = [*CONTAINER, *(standin(DOCKER_DEFAULT) if container == "default" else [])]
    svc = Service(launcher=launcher, MAX_WORKERS="2")
    svc.start()
    try:
        pid_one = _pid_one(svc.process.pid)
        assert "pid_one.py" in _cmdline(pid_one)  # the init, not the service
        (service,) = [p for p in descendants(pid_one) if parent_of(p) == pid_one]
        assert "handler.cli serve" in _cmdline(service)

        answers: list[dict] = []
        flights = [
            threading.Thread(target=lambda: answers.append(svc.run("while True: pass", timeout=30))) for _ in range(2)
        ]
        for flight in flights:
            flight.start()
        zygotes = _python_zygotes(service)
        assert wait_for(lambda: len(_busy_children(service, zygotes)) == 2, 15)  # both runs started
        for zygote in zygotes:
            os.kill(zygote, signal.SIGKILL)  # its runs and ready children die and go to pid 1
        for flight in flights:
            flight.join(30)
        assert [a["data"]["exit_code"] for a in answers] == [137, 137], answers
        # handed to pid 1 and reaped there: before the init, each stayed a zombie of the service's
        assert wait_for(lambda: not _zombies(pid_one), 10), _zombies(pid_one)
        assert wait_for(lambda: svc.run("print(6 * 7)").get("data", {}).get("stdout") == "42\n", 30)

        tree = _pidfds([pid_one, *descendants(pid_one)])
        os.kill(pid_one, signal.SIGTERM)  # `docker stop`: to pid 1, which passes it on
        # the service shut down gracefully (uvicorn then re-raises the SIGTERM), and its init exited as it did
        assert svc.process.wait(30) == 128 + signal.SIGTERM, svc.output()
        assert "Application shutdown complete" in svc.output()
        assert all(select.select([fd], [], [], 5)[0] for fd in tree)  # the service's zygotes too
        for fd in tree:
            os.close(fd)
    finally:
        svc.stop()


def _script(code: str, before: str = "") -> str:
    return f"import os, signal, sys, time\nfrom handler import pid_one\n{before}\npid_one.front()\n{code}"


def _as_pid_one(code: str, *, before: str = "", timeout: float = 20) -> subprocess.CompletedProcess:
    """`code` after pid_one.front(), as pid 1 of a PID namespace of its own (in the service's child)."""
    return subprocess.run(
        [*CONTAINER, sys.executable, "-c", _script(code, before)],
        env={**os.environ, "PYTHONPATH": ROOT},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_pid_one_exits_with_the_services_status():
    assert _as_pid_one("assert os.getpid() == 2 and os.getppid() == 1\nsys.exit(7)").returncode == 7
    killed = _as_pid_one("os.kill(os.getpid(), signal.SIGKILL)")
    assert killed.returncode == 128 + signal.SIGKILL


def test_pid_one_forwards_a_stop_sent_at_once():
    """SIGTERM to pid 1 reaches the service even if it comes before the init waits for signals."""
    result = _as_pid_one(
        "signal.signal(signal.SIGTERM, lambda *_: (print('stopping', flush=True), sys.exit(3)))\n"
        "os.kill(1, signal.SIGTERM)\n"
        "time.sleep(15)\n"
    )
    assert (result.returncode, result.stdout) == (3, "stopping\n"), result.stderr


def test_pid_one_started_with_sigchld_ignored_still_sees_the_service_end():
    """An ignored SIGCHLD survives exec: the kernel would reap the service unseen and pid 1 would wait forever."""
    result = _as_pid_one("sys.exit(7)", before="signal.signal(signal.SIGCHLD, signal.SIG_IGN)")
    assert result.returncode == 7, result.stderr


def test_signals_that_do_not_stop_a_container_stay_ignored():
    """As for a pid 1 without handlers (the service itself, before): SIGHUP, SIGUSR1, SIGUSR2, SIGQUIT."""
    result = _as_pid_one(
        "for signum in (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT):\n"
        "    os.kill(1, signum)\n"
        "time.sleep(0.5)\n"
        "print('serving')\n"
    )
    assert (result.returncode, result.stdout) == (0, "serving\n"), result.stderr


def test_a_ctrl_c_to_the_foreground_group_reaches_the_service_once():
    """`docker run -it` and Ctrl-C: the terminal signals pid 1's process group; the service is in one of its
    own, so it gets the signal once, passed on (uvicorn takes a second SIGINT as "exit now")."""
    code = (
        "received = []\n"
        "signal.signal(signal.SIGINT, lambda *_: received.append(1))\n"
        "print(os.getpgid(0) != os.getpgid(1), flush=True)\n"
        "time.sleep(2)\n"
        "print(len(received), flush=True)\n"
    )
    process = subprocess.Popen(
        [*CONTAINER, sys.executable, "-c", _script(code)],
        env={**os.environ, "PYTHONPATH": ROOT},
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert process.stdout.readline() == "True\n"
        os.killpg(os.getpgid(_pid_one(process.pid)), signal.SIGINT)  # what the terminal does
        assert process.stdout.readline() == "1\n"
        assert process.wait(10) == 0
    finally:
        process.kill()


def test_pid_one_reaps_orphans_the_service_never_waits_for():
    result = _as_pid_one(
        "for _ in range(5):\n"
        "    if os.fork() == 0:\n"
        "        if os.fork() == 0:\n"
        "            os._exit(0)\n"  # the grandchild: orphaned at once, handed to pid 1
        "        os._exit(0)\n"
        "    os.wait()\n"
        "time.sleep(1)\n"
        "zombies = [p for p in os.listdir('/proc') if p.isdigit()\n"
        "           and open(f'/proc/{p}/stat').read().rsplit(')', 1)[1].split()[0] == 'Z']\n"
        "print(len(zombies))\n"
    )
    assert (result.returncode, result.stdout) == (0, "0\n"), result.stderr


def test_anywhere_else_no_init():
    """Outside a container (or behind `docker run --init`), serve forks nothing: the service is the process."""
    code = (
        "import os\nfrom handler import pid_one\npid_one.front()\n"
        "try:\n    os.waitpid(-1, os.WNOHANG)\nexcept ChildProcessError:\n    print('no child')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True, text=True, timeout=20
    )
    assert result.stdout == "no child\n", result.stderr
