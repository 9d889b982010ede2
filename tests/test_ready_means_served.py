"""Ready means a run can be served: under a platform that refuses exactly one step a jail's children take,
the service either serves with that step dropped (a cosmetic one: the hostname), or picks the next mode that
works, and says so; it is never healthy while every run fails.

Stand-in: tests/outer_filter.py refusing one call with EPERM (as podman's seccomp profile refuses sethostname
to a container without CAP_SYS_ADMIN, issue 30 point 5), the service started as root, or as an arbitrary
uid with no capabilities and no_new_privs (`podman run --user 1000990000:0 --cap-drop=all
--security-opt no-new-privileges`).
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
from conftest import needs_root
from service import Service, standin

# call refused -> (the mode chosen as root, what the health detail then says of it)
AS_ROOT = {
    "sethostname": "full",  # cosmetic: dropped, the run's hostname is the container's
    "pivot_root": "chroot",  # neither namespaced jail can enter its tree: the chroot one
    "mount": "chroot",
    "setns": "full",  # the zygote forks its children into their PID namespace through clone instead
}


UID = 1000990000  # what OpenShift's restricted-v2 picks


def served(service: Service) -> dict:
    detail = service.detail()["runtimes"]
    for language in ("python3", "nodejs"):
        code = "print(6 * 7)" if language == "python3" else "console.log(6 * 7)"
        envelope = service.run(code, language=language)
        assert (envelope.get("data") or {}).get("stdout") == "42\n", (language, envelope, service.output()[-3000:])
    return detail


@needs_root
@pytest.mark.parametrize("call", sorted(AS_ROOT))
def test_as_root_one_refused_step_never_leaves_a_healthy_service_that_fails_runs(call):
    service = Service(launcher=standin(["--pid-namespace", "--eperm", call]), MAX_WORKERS="2").start()
    try:
        detail = served(service)
        assert {rt["protections"]["mode"] for rt in detail.values()} == {AS_ROOT[call]}
        if call == "sethostname":
            for runtime in detail.values():
                assert runtime["protections"]["hostname"] == "the container's"
                assert "sethostname" in runtime["protections"]["hostname_reason"]
    finally:
        service.stop()


@needs_root
def test_an_arbitrary_uid_without_capabilities_under_a_profile_refusing_sethostname_serves():
    """Issue 30 point 5: the userns mode was chosen and /health said ready, yet every run got `could not
    confine a run: the child exited`, since its child's sethostname was refused."""
    data = tempfile.mkdtemp(prefix="sandlot-restricted-", dir="/var/tmp")  # its emptyDir
    os.chown(data, UID, 0)
    service = Service(
        launcher=standin(["--pid-namespace", "--caps", "", "--uid", str(UID), "--eperm", "sethostname"]),
        SANDLOT_DATA_DIR=data,
        MAX_WORKERS="2",
    )
    try:
        service.start()
        detail = served(service)
        assert {rt["protections"]["mode"] for rt in detail.values()} == {"userns"}
        assert all(rt["protections"]["hostname"] == "the container's" for rt in detail.values())
    finally:
        service.stop()
        shutil.rmtree(data, ignore_errors=True)


@needs_root
def test_a_step_no_probe_tries_still_keeps_the_service_from_reporting_ready():
    """The last guard: a runtime is ready only once a child has been fully confined. Here every child's
    first step (setsid) is refused, which no probe tries: /health answers 503 with the children's reason."""
    import time

    import httpx

    service = Service(launcher=standin(["--pid-namespace", "--eperm", "setsid"]), MAX_WORKERS="2").start(wait=False)
    try:
        deadline, detail = time.monotonic() + 120, {}
        while time.monotonic() < deadline:
            assert service.process.poll() is None, service.output()
            try:
                detail = service.detail()["runtimes"]["python3"]
            except (httpx.HTTPError, KeyError, TypeError):
                detail = {}
            if "could not confine a run" in (detail.get("error") or "") or "fork failed" in (detail.get("error") or ""):
                break
            time.sleep(0.3)
        assert not detail.get("ready"), detail
        assert httpx.get(service.url + "/health", timeout=5).status_code == 503
        assert service.run("print(1)")["code"] == -500
    finally:
        service.stop()
