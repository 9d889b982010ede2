"""The service in a default container: Docker's default capabilities, namespaces and mounts refused.

Docker cannot run here, so the container is stood in for by tests/outer_filter.py:
the capability bounding set narrowed to Docker's default set and the calls
Docker's default seccomp profile refuses without CAP_SYS_ADMIN (unshare, setns,
mount, umount2, pivot_root, ...; clone with any CLONE_NEW* flag; clone3 with
ENOSYS) refused. The protections record says what is left.
`SANDLOT_TEST_CONTAINER=docker-default` starts every service of a test run in
the same stand-in (tests/service.py).
Neither namespaced jail can be built there, so runs are refused, saying why,
whatever SANDLOT_REQUIRE_SECCOMP says (opting out of seccomp never opts out of
the rest of the jail; the opt-out itself is shown where a mode can serve, in
tests/lambda/test_lambda_simulated.py).
"""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest
from conftest import needs_root
from service import DOCKER_DEFAULT, Service, standin, wait_for

NO_SECCOMP = [*DOCKER_DEFAULT, "--eperm", "seccomp,prctl:22"]


def contained(restriction: list[str], **env: str) -> Service:
    return Service(launcher=standin(restriction), NODEJS_PATH="/nonexistent/node", **env)


CLONE_PROBE = """
import ctypes, errno, os, threading
libc = ctypes.CDLL(None, use_errno=True)
SYS_CLONE, SYS_CLONE3, SIGCHLD = {"x86_64": (56, 435), "aarch64": (220, 435)}[os.uname().machine] + (17,)
def clone(flags):
    # aarch64 and x86_64 both take the flags first; a child exits at once
    pid = libc.syscall(SYS_CLONE, flags | SIGCHLD, 0, 0, 0, 0)
    if pid == 0:
        os._exit(0)
    if pid > 0:
        os.waitpid(pid, 0)
        return "ok"
    return errno.errorcode[ctypes.get_errno()]
flags = {"NEWNS": 0x20000, "NEWCGROUP": 0x2000000, "NEWUTS": 0x4000000, "NEWIPC": 0x8000000,
         "NEWUSER": 0x10000000, "NEWPID": 0x20000000, "NEWNET": 0x40000000}
print("plain", clone(0))
for name, flag in flags.items():
    print(name, clone(flag))
print("clone3", "ok" if libc.syscall(SYS_CLONE3, 0, 0) >= 0 else errno.errorcode[ctypes.get_errno()])
thread = threading.Thread(target=lambda: None)
thread.start()
thread.join()
print("thread", "ok")
print("unshare", "ok" if libc.unshare(0) >= 0 else errno.errorcode[ctypes.get_errno()])
"""


@needs_root
def test_the_stand_in_refuses_what_dockers_default_profile_refuses():
    """Namespaces through clone are refused flag by flag, clone3 answers ENOSYS (libc falls back to clone),
    plain processes and threads still start: what a process in a default container meets."""
    result = subprocess.run(
        [*standin(DOCKER_DEFAULT), sys.executable, "-c", CLONE_PROBE], capture_output=True, text=True, check=True
    )
    answers = dict(line.split() for line in result.stdout.splitlines())
    assert answers.pop("plain") == "ok" and answers.pop("thread") == "ok"
    assert answers.pop("clone3") == "ENOSYS"
    assert answers == {name: "EPERM" for name in answers} and len(answers) == 8, answers
    capabilities = subprocess.run(
        [*standin(DOCKER_DEFAULT), "grep", "CapBnd", "/proc/self/status"], capture_output=True, text=True, check=True
    )
    assert int(capabilities.stdout.split()[1], 16) == 0xA80425FB  # Docker's 14 default capabilities


def detail(svc: Service) -> dict:
    """The health detail once the runtime has started or failed to (the start-up log says which)."""
    assert wait_for(lambda: "python3 runtime" in svc.output(), timeout=120), svc.output()
    data = svc.detail()
    [started] = [
        line
        for line in map(json.loads, filter(lambda text: text.startswith("{"), svc.output().splitlines()))
        if line.get("logger") == "sandlot.api" and line.get("language") == "python3"
    ]
    assert started["platform"] == data["runtimes"]["python3"]["platform"]  # the start-up log shows the record
    return data


@needs_root
def test_a_default_container_shows_its_protections_record_and_never_serves_silently():
    svc = contained(DOCKER_DEFAULT).start(wait=False)
    try:
        python = detail(svc)["runtimes"]["python3"]
        record = python["platform"]
        assert record["euid"] == 0
        assert record["setuid"] is True and record["chroot"] is True  # CAP_SETUID, CAP_SYS_CHROOT stay
        assert record["seccomp"] is True and record["no_new_privs"] is True
        for name in ("user_namespaces", "mount_namespaces", "pid_namespaces", "net_namespaces"):
            assert record[name] is False and "unshare" in record["errors"][name], name
        envelope = svc.run("print(1)")
        if python["ready"]:
            assert envelope["data"]["stdout"] == "1\n"
        else:  # the jail that needs a mount namespace cannot be built: refused, and saying why
            assert envelope["code"] == -500 and envelope["message"] == python["error"]
            assert httpx.get(svc.url + "/health").status_code == 503
    finally:
        svc.stop()


@needs_root
@pytest.mark.parametrize("required", [True, False])
def test_without_seccomp_or_namespaces_runs_are_refused_whatever_the_opt_out(required):
    svc = contained(NO_SECCOMP, SANDLOT_REQUIRE_SECCOMP=str(required).lower()).start(wait=False)
    try:
        python = detail(svc)["runtimes"]["python3"]
        assert python["platform"]["seccomp"] is False
        assert python["platform"]["errors"]["seccomp"]
        envelope = svc.run("print(1)")
        assert envelope["code"] == -500 and envelope["message"] == python["error"]
        assert "user_namespaces" in envelope["message"] and "unshare" in envelope["message"]
        assert httpx.get(svc.url + "/health").status_code == 503
    finally:
        svc.stop()
