"""The Lambda emulation itself: tenant isolation as Lambda documents it, through real boto3 and awslambdaric."""

import os

import pytest
from botocore.exceptions import ClientError
from emulation import FunctionInstance, InvokeAPI
from functions import boto_client

HERE = os.path.dirname(os.path.abspath(__file__))


def _who(tenant: str | None = None) -> FunctionInstance:
    instance = FunctionInstance("misbehaving.who", {"PATH": "/usr/bin:/bin", "PYTHONPATH": HERE}, name="who", cwd=HERE)
    return instance.start()


@pytest.fixture(scope="module")
def api():
    api = InvokeAPI()
    api.add_per_tenant("isolated", _who, concurrency=4, keep=2)
    classic = _who()
    api.add("classic", [classic])
    yield api
    api.close()
    classic.stop()


@pytest.fixture(scope="module")
def client(api):
    return boto_client(api, retries={"total_max_attempts": 1}, parameter_validation=False)


def invoke(client, name: str, tenant: str | None = None) -> dict:
    import json

    extra = {"TenantId": tenant} if tenant is not None else {}
    response = client.invoke(FunctionName=name, Payload=b"{}", **extra)
    assert "FunctionError" not in response
    return json.loads(response["Payload"].read())


def error_code(call) -> str:
    with pytest.raises(ClientError) as info:
        call()
    return info.value.response["Error"]["Code"]


def test_each_tenant_gets_environments_of_its_own_and_the_function_sees_its_id(api, client):
    blue = invoke(client, "isolated", "blue")
    assert blue["tenant_id"] == "blue"  # X-Amz-Tenant-Id -> Lambda-Runtime-Aws-Tenant-Id -> context.tenant_id
    assert invoke(client, "isolated", "blue")["pid"] == blue["pid"]  # reused for the same tenant
    green = invoke(client, "isolated", "green")
    assert green["tenant_id"] == "green" and green["pid"] != blue["pid"]
    assert {"blue", "green"} <= set(api.environments("isolated"))


def test_a_per_tenant_function_refuses_an_invoke_without_a_tenant_id(client):
    assert error_code(lambda: invoke(client, "isolated")) == "InvalidParameterValueException"


def test_a_function_without_tenant_isolation_refuses_a_tenant_id(client):
    assert error_code(lambda: invoke(client, "classic", "blue")) == "InvalidParameterValueException"
    assert invoke(client, "classic")["tenant_id"] is None


@pytest.mark.parametrize("bad", ["", "a?b", "x" * 257, "é"])
def test_a_tenant_id_outside_lambdas_format_is_refused(client, bad):
    refused = ("ValidationException", "InvalidParameterValueException")  # "" may not even be sent
    assert error_code(lambda: invoke(client, "isolated", bad)) in refused


def test_idle_environments_beyond_those_kept_are_reclaimed(api, client):
    pids = [invoke(client, "isolated", f"tenant-{n}")["pid"] for n in range(4)]
    assert len(set(pids)) == 4
    for thread in api.stopping:
        thread.join(10)
    live = sum(len(envs) for envs in api.environments("isolated").values())
    assert live <= 2
    assert not os.path.exists(f"/proc/{pids[0]}")
