"""Tenancy: the runtime functions under Lambda's tenant isolation, and the tenant ids the LambdaInvoker passes.

On the simulated Lambda (seccomp refused) the function serves only invocations that carry a tenant id of
their own, and an environment only its first tenant; tenants' runs meet in no environment. The invoker
passes a tenant id on every invoke, chosen by SANDLOT_LAMBDA_TENANCY. Each environment the emulation starts
for a tenant is a process of its own (here: a uid and temp directory of its own; on Lambda: a microVM).
"""

import ast
import itertools
import json
import os
import sys

import httpx
import pytest
from emulation import InvokeAPI
from functions import boto_client, boto_environment
from simulated import SYSTEM_PYTHON, lay_out_image, start_simulated, tenant_environments

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))

from service import API_KEY, IS_ROOT, Service  # noqa: E402
from test_cases import CASES, check  # noqa: E402
from test_lambda_runtime import error_of, result_of  # noqa: E402

from runtimes.payload import SHARED_TENANT  # noqa: E402

pytestmark = pytest.mark.skipif(not IS_ROOT, reason="needs root: the runtime functions own their uid")
simulation = pytest.mark.skipif(
    not os.access(SYSTEM_PYTHON, os.X_OK), reason=f"needs {SYSTEM_PYTHON} (any uid can run it)"
)
RUN = {"language": "python3", "code": "print(6 * 7)", "enable_network": True}


@pytest.fixture(scope="module")
def image():
    return lay_out_image()


@pytest.fixture(scope="module")
def strict(image):
    """RequireSeccomp true (the default), seccomp refused: tenant isolation is the boundary."""
    instance = start_simulated(image, "python3", uid=61051 + 30)
    assert instance.ready, instance.output()
    yield instance
    instance.stop()


# ---- the runtime function -------------------------------------------------------------------------------------


@simulation
def test_without_a_tenant_id_a_run_is_refused_naming_seccomp_and_tenancy(strict):
    error = error_of(strict, RUN)
    assert error["errorType"] == "TenantRefused"
    message = error["errorMessage"]
    assert "seccomp filter cannot be installed" in message and "no tenant id" in message
    assert "TenancyConfig PER_TENANT" in message and "RequireSeccomp=false" in message


@simulation
def test_the_shared_tenant_id_is_refused_where_there_is_no_filter(strict):
    invocation = strict.invoke(RUN, tenant_id=SHARED_TENANT)
    assert invocation.kind == "error"
    error = invocation.json()
    assert error["errorType"] == "TenantRefused" and "a tenant id of their own" in error["errorMessage"]


@simulation
def test_the_probe_reports_the_tenant_policy_it_relies_on(strict, image, python_function):
    assert result_of(strict, {"action": "probe"})["tenancy"] == {
        "boundary": "tenant isolation",
        "requires_tenant_id": True,
        "shared_tenant": False,
        "tenant": None,
    }
    lenient = start_simulated(image, "python3", uid=61051 + 31, SANDLOT_REQUIRE_SECCOMP="false")
    try:
        tenancy = result_of(lenient, {"action": "probe"})["tenancy"]
        assert tenancy["boundary"] == "none" and not tenancy["requires_tenant_id"] and not tenancy["shared_tenant"]
        assert result_of(lenient, RUN)["stdout"] == "42\n"  # the operator allowed runs without either
    finally:
        lenient.stop()
    tenancy = result_of(python_function, {"action": "probe"})["tenancy"]  # root: the filter is in force
    assert tenancy["boundary"] == "seccomp" and tenancy["shared_tenant"] is True


@simulation
def test_an_environment_serves_its_first_tenant_only_and_says_so(image):
    instance = start_simulated(image, "python3", uid=61051 + 32)
    try:
        invocation = instance.invoke(RUN, tenant_id="t:blue")
        assert invocation.kind == "response" and invocation.json()["stdout"] == "42\n", invocation.body
        assert result_of(instance, {"action": "probe"})["tenancy"]["tenant"] == "t:blue"
        refused = instance.invoke(RUN, tenant_id="t:green")  # what only a misdeployed function would see
        assert refused.kind == "error"
        error = refused.json()
        assert error["errorType"] == "TenantRefused"
        assert "serves tenant 't:blue' only and refuses tenant 't:green'" in error["errorMessage"]
        assert "PER_TENANT" in error["errorMessage"]
        assert instance.invoke(RUN).json()["errorType"] == "TenantRefused"  # no tenant: refused as before
        assert instance.invoke(RUN, tenant_id="t:blue").json()["stdout"] == "42\n"  # its own tenant still served
    finally:
        instance.stop()


LEAVE = """
import os, sys
marker = {marker!r}
places = ["/tmp", "/var/tmp", "/dev/shm", os.environ["TMPDIR"], os.environ.get("HOME", "/"), os.getcwd()]
wrote = []
for place in places:
    try:
        with open(os.path.join(place, marker), "w") as f:
            f.write("x")
        wrote.append(place)
    except OSError:
        pass
root = os.path.dirname(os.path.dirname(os.environ["TMPDIR"]))  # the environment's temp dir; the run's is below
data = [os.path.join(root, d) for d in os.listdir(root) if d.startswith("sandlot-data-")]
for d in data:  # the runtime's own files (its scratch: node snapshots, the runs' parent)
    try:
        open(os.path.join(d, marker), "w").write("planted")
        wrote.append("runtime files")
    except OSError:
        pass
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv("/bin/sleep", [marker, "300"])
    os._exit(0)
print(root, sorted(set(wrote)))
"""

LOOK = """
import os
marker = {marker!r}
found = []
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    try:
        if marker.encode() in open(f"/proc/{{pid}}/cmdline", "rb").read():
            found.append("process " + pid)
    except OSError:
        pass
root = os.path.dirname(os.path.dirname(os.environ["TMPDIR"]))
places = ["/tmp", "/var/tmp", "/dev/shm", os.environ["TMPDIR"], os.environ.get("HOME", "/"), os.getcwd()]
for top in (root, {theirs!r}):
    places.append(top)
    try:
        places += [os.path.join(top, d) for d in os.listdir(top) if d.startswith("sandlot-data-")]
    except OSError:
        pass
for place in places:
    try:
        open(os.path.join(place, marker)).read()
        found.append(place)
    except OSError:
        pass
print(found)
"""


@simulation
def test_tenant_a_leaves_a_process_files_and_a_change_to_the_runtimes_files_and_b_sees_none(image):
    """Without Landlock either (the weakest platform): A's run plants all it can; B, served by the same
    function, is in another environment and finds nothing of it, not even by A's paths."""
    api = InvokeAPI()
    api.add_per_tenant("sim", tenant_environments(image, "python3", landlock=False), concurrency=2)
    client = boto_client(api)
    marker = "sandlot-left-by-a-" + os.urandom(6).hex()
    try:
        left = _invoke(client, "sim", "t:a", LEAVE.format(marker=marker))
        theirs, wrote = left["stdout"].split(" ", 1)
        assert "runtime files" in wrote and "/tmp" in wrote, left  # it did leave all of that
        seen = _invoke(client, "sim", "t:b", LOOK.format(marker=marker, theirs=theirs))
        assert seen["stdout"] == "[]\n", seen
        (a_pid,), (b_pid,) = ({pid for _, tenant, pid in api.calls if tenant == t} for t in ("t:a", "t:b"))
        assert a_pid != b_pid  # two environments
        # A's own next run comes back to A's environment (reused): no process or file of the earlier run there
        # either, but for what it planted among the runtime's own files (the zygote was replaced, the file
        # stays: without Landlock to refuse the write, a tenant's later runs may see it, as the README says)
        again = _invoke(client, "sim", "t:a", LOOK.format(marker=marker, theirs=theirs))
        assert all("sandlot-data-" in place for place in ast.literal_eval(again["stdout"])), again
        assert {pid for _, tenant, pid in api.calls if tenant == "t:a"} == {a_pid}
    finally:
        api.close()


# ---- the invoker ---------------------------------------------------------------------------------------------


def _invoke(client, name: str, tenant: str, code: str) -> dict:
    event = {"language": "python3", "code": code, "enable_network": True}
    response = client.invoke(FunctionName=name, Payload=json.dumps(event).encode(), TenantId=tenant)
    answer = json.loads(response["Payload"].read())
    assert "FunctionError" not in response, answer
    return answer


POLICIES = ["auto", "per-run", "header:X-Tenant"]


@pytest.fixture(scope="module", params=POLICIES)
def served(request, invoke_api):
    """`sandlot serve` with the lambda backend under each policy, in front of the root runtime functions."""
    service = Service(SANDLOT_BACKEND="lambda", SANDLOT_LAMBDA_TENANCY=request.param, **boto_environment(invoke_api))
    service.start()
    yield request.param, service
    service.stop()


TENANTS = itertools.cycle(["acme", "globex", "initech"])


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_serve_answers_every_shared_case_under_each_policy(served, invoke_api, case):
    policy, service = served
    body = {"language": case["language"], "code": case["code"], "enable_network": case["enable_network"]}
    if "timeout" in case:
        body["timeout"] = case["timeout"]
    headers = {"X-Api-Key": API_KEY, "X-Tenant": next(TENANTS)}
    before = len(invoke_api.calls)
    with httpx.Client(base_url=service.url, timeout=120) as client:
        envelope = client.post("/v1/sandbox/run", json=body, headers=headers).json()
    assert envelope["code"] == 0, envelope
    check(case["expect"], envelope["data"])
    (call,) = [c for c in invoke_api.calls[before:] if c[1] != SHARED_TENANT or policy == "auto"]
    tenant = call[1]
    assert tenant  # every invoke carries one (the emulation refuses any without, as Lambda does)
    expected = {"auto": SHARED_TENANT, "header:X-Tenant": f"t:{headers['X-Tenant']}"}.get(policy)
    if expected:
        assert tenant == expected  # root: the filter is in force, so auto shares
    else:
        assert tenant.startswith("run:")


def test_against_a_root_runtime_with_seccomp_auto_reuses_environments(invoke_api):
    service = Service(SANDLOT_BACKEND="lambda", **boto_environment(invoke_api)).start()
    try:
        before = len(invoke_api.calls)
        for n in range(4):
            assert service.run(f"print({n})")["data"]["stdout"] == f"{n}\n"
        calls = [c for c in invoke_api.calls[before:] if c[0] == "sandlot-python3"]
        assert len(calls) == 4
        assert {tenant for _, tenant, _ in calls} == {SHARED_TENANT}
        assert len({pid for _, _, pid in calls}) == 1  # one warm environment served them all
        tenancy = service.detail()["runtimes"]["python3"]["tenancy"]
        assert tenancy["ids"].startswith("shared") and tenancy["function"]["boundary"] == "seccomp"
    finally:
        service.stop()


@pytest.fixture(scope="module")
def simulated_api(image):
    """The python3 runtime function on the simulated Lambda (seccomp refused, RequireSeccomp true), PER_TENANT."""
    api = InvokeAPI()
    api.add_per_tenant("sandlot-python3", tenant_environments(image, "python3"), concurrency=2, keep=3)
    yield api
    api.close()


def _runs_through(api: InvokeAPI, policy: str, tenants: list[str | None]) -> list[tuple[str, int]]:
    """`sandlot serve` under policy sends one run per entry (with that X-Tenant header, or none); the (tenant id,
    environment) each run's invoke got."""
    env = {k: v for k, v in boto_environment(api).items() if "NODEJS" not in k}
    service = Service(SANDLOT_BACKEND="lambda", SANDLOT_LAMBDA_TENANCY=policy, **env).start()
    try:
        before = len(api.calls)
        with httpx.Client(base_url=service.url, timeout=120) as client:
            for n, tenant in enumerate(tenants):
                headers = {"X-Api-Key": API_KEY, **({"X-Tenant": tenant} if tenant else {})}
                body = {"language": "python3", "code": f"print({n})", "enable_network": True}
                envelope = client.post("/v1/sandbox/run", json=body, headers=headers).json()
                assert envelope["code"] == 0 and envelope["data"]["stdout"] == f"{n}\n", envelope
    finally:
        service.stop()
    calls = api.calls[before:]
    assert all(tenant for _, tenant, _ in calls)  # every invoke carries one
    return [(tenant, pid) for _, tenant, pid in calls if tenant != SHARED_TENANT]  # the probe's are not runs


@simulation
@pytest.mark.parametrize("policy", ["auto", "per-run"])
def test_on_the_simulated_lambda_no_two_runs_share_a_tenant_id_or_an_environment(simulated_api, policy):
    runs = _runs_through(simulated_api, policy, [None, "acme", None, "acme"])
    assert len(runs) == 4
    assert len({tenant for tenant, _ in runs}) == 4 and all(tenant.startswith("run:") for tenant, _ in runs)
    assert len({pid for _, pid in runs}) == 4  # per run: each its own environment


@simulation
def test_on_the_simulated_lambda_per_tenant_runs_share_only_with_the_same_header(simulated_api):
    runs = _runs_through(simulated_api, "header:X-Tenant", ["acme", "acme", "globex", None, None, "acme/../x"])
    ids = [tenant for tenant, _ in runs]
    assert ids[0] == ids[1] == "t:acme" and ids[2] == "t:globex"
    assert ids[3].startswith("run:") and ids[4].startswith("run:") and ids[3] != ids[4]  # never the shared one
    assert ids[5].startswith("t:acme/../x")  # Lambda's format allows it: kept readable, still its own
    assert len(set(ids)) == 5
    assert runs[0][1] == runs[1][1]  # acme's second run reused acme's environment
    assert len({pid for _, pid in runs[1:]}) == 5


@simulation
def test_auto_asks_again_when_a_function_refuses_the_shared_id_and_resends_the_run(simulated_api):
    """A stale record (the function had its filter when asked; a new deployment has not): the run sent with the
    shared id is refused before anything of it ran, the probe is asked again, and the run goes once more with
    an id of its own."""
    import asyncio

    from handler.lambda_invoker import LambdaInvoker
    from runtimes.payload import RunRequest

    env = boto_environment(simulated_api)
    saved = dict(os.environ)
    os.environ.update({k: v for k, v in env.items() if k.startswith("AWS_")})
    try:
        invoker = LambdaInvoker({"python3": "sandlot-python3"}, function_timeout=30)
        invoker.connect()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    invoker.platform["python3"] = {"tenancy": {"shared_tenant": True}}  # what an earlier probe said
    invoker._probed_at["python3"] = 0.0
    before = len(simulated_api.calls)
    result = asyncio.run(invoker.invoke(RunRequest(language="python3", code="print(5)", enable_network=True)))
    assert result.stdout == "5\n"
    tenants = [tenant for _, tenant, _ in simulated_api.calls[before:]]
    assert tenants[:2] == [SHARED_TENANT, SHARED_TENANT]  # the refused run, then the probe
    assert len(tenants) == 3 and tenants[2].startswith("run:")
    assert invoker.platform["python3"]["tenancy"]["boundary"] == "tenant isolation"
