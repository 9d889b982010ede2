"""The service in a default container: Docker's default capabilities, namespaces and mounts refused.

Docker cannot run here, so the container is stood in for by tests/outer_filter.py:
the capability bounding set narrowed to Docker's default set and the calls
Docker's default seccomp profile refuses without CAP_SYS_ADMIN (unshare, setns,
mount, umount2, pivot_root) refused. The protections record says what is left.
Neither namespaced jail can be built there, so runs are refused, saying why,
whatever SANDLOT_REQUIRE_SECCOMP says (opting out of seccomp never opts out of
the rest of the jail; the opt-out itself is shown where a mode can serve, in
tests/lambda/test_lambda_simulated.py).
"""

from __future__ import annotations

import json
import os
import sys

import httpx
import pytest
from conftest import needs_root
from service import Service, wait_for

HERE = os.path.dirname(os.path.abspath(__file__))
DOCKER_DEFAULT = ["--caps", "docker-default", "--eperm", "unshare,setns,mount,umount2,pivot_root"]
NO_SECCOMP = ["--caps", "docker-default", "--eperm", "unshare,setns,mount,umount2,pivot_root,seccomp,prctl:22"]


def contained(restriction: list[str], **env: str) -> Service:
    launcher = [sys.executable, os.path.join(HERE, "outer_filter.py"), *restriction, "--"]
    return Service(launcher=launcher, NODEJS_PATH="/nonexistent/node", **env)


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
