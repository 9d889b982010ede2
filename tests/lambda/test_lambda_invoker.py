"""The LambdaInvoker through real boto3 against the Invoke API emulation, in front of the real runtime functions."""

import asyncio
import os
import sys
import threading
import time

import httpx
import pytest
from emulation import FunctionInstance
from functions import boto_environment

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))

from service import Service  # noqa: E402
from test_cases import CASES, check  # noqa: E402

from handler import run_path  # noqa: E402
from handler.lambda_invoker import LambdaInvoker  # noqa: E402
from handler.tenancy import TenancyPolicy  # noqa: E402
from runtimes.payload import RunRequest  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def lambda_service(invoke_api):
    """`sandlot serve` with the lambda backend, pointed at the emulation."""
    service = Service(SANDLOT_BACKEND="lambda", **boto_environment(invoke_api)).start()
    yield service
    service.stop()


def comparable(envelope: dict) -> dict:
    data = dict(envelope["data"] or {})
    data.pop("duration", None)
    return {**envelope, "data": data}


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_serve_with_the_lambda_backend_answers_as_the_local_one(lambda_service, service, case):
    body = {"language": case["language"], "code": case["code"], "enable_network": case["enable_network"]}
    if "timeout" in case:
        body["timeout"] = case["timeout"]
    remote, local = lambda_service.run(**body), service.run(**body)
    assert remote["code"] == 0, remote
    check(case["expect"], remote["data"])
    # py-zoneinfo prints the current time; a local service on another interpreter (the container stand-in's
    # venv) names other stdlib paths and lines in its tracebacks
    same_python = case["language"] != "python3" or service.python == sys.executable
    if case["id"] not in ("py-zoneinfo",) and same_python:
        assert comparable(remote) == comparable(local)


def test_health_detail_reports_each_functions_protections(lambda_service):
    detail = lambda_service.detail()
    assert detail["backend"] == "lambda"
    python = detail["runtimes"]["python3"]
    assert python["function"] == "sandlot-python3" and python["ready"]
    assert python["platform"]["euid"] == os.geteuid() and "seccomp" in python["protections"]


def test_dependencies_come_from_the_function(lambda_service):
    names = {d["name"].lower() for d in lambda_service.detail_dependencies("python3")}
    assert "requests" in names


def test_throttling_gives_the_503_envelope(lambda_service):
    slow = threading.Thread(
        target=lambda_service.run, args=("import time; time.sleep(3)",), kwargs={"timeout": 10}, daemon=True
    )
    slow.start()
    time.sleep(0.5)  # the single python instance is busy now
    with lambda_service.client() as client:
        response = client.post("/v1/sandbox/run", json={"language": "python3", "code": "print(1)"})
    slow.join()
    assert response.status_code == 503
    assert response.json() == {"code": -503, "message": "Too many requests", "data": None}


def test_a_request_over_lambdas_payload_limit_is_a_clear_400(invoke_api):
    svc = Service(SANDLOT_BACKEND="lambda", SANDLOT_MAX_BODY_BYTES=str(8 << 20), **boto_environment(invoke_api))
    svc.start()
    try:
        with svc.client() as client:
            body = {"language": "python3", "code": "1", "stdin": "x" * (7 << 20)}
            response = client.post("/v1/sandbox/run", json=body)
    finally:
        svc.stop()
    assert response.status_code == 400
    assert "too large for Lambda" in response.json()["message"]


@pytest.fixture(scope="module")
def misbehaving(invoke_api):
    def starter(name: str):
        def start(tenant: str) -> FunctionInstance:
            env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": HERE}
            return FunctionInstance(f"misbehaving.{name}", env, name=name, timeout=2, cwd=HERE).start()

        return start

    for name in ("sleeps", "raises", "answers_garbage", "errors_without_the_header"):
        invoke_api.add_per_tenant(name, starter(name))
    yield  # the Invoke API stops the environments it started


def envelope_from(invoke_api, function_name: str) -> dict:
    env = boto_environment(invoke_api)
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        # per-run: these functions are not Sandlot's and have no probe to ask
        invoker = LambdaInvoker({"python3": function_name}, function_timeout=2, tenancy=TenancyPolicy("per-run"))
        invoker.connect()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    request = {"language": "python3", "code": "print(1)"}
    return asyncio.run(run_path.run(request, True, invoker.invoke)).body


def test_function_errors_timeouts_and_malformed_payloads_are_500s_saying_which(invoke_api, misbehaving):
    envelope = envelope_from(invoke_api, "sleeps")
    assert envelope["code"] == -500 and "timed out" in envelope["message"] and "Task timed out" in envelope["message"]
    envelope = envelope_from(invoke_api, "raises")
    assert envelope["code"] == -500 and "ValueError: something broke" in envelope["message"]
    envelope = envelope_from(invoke_api, "answers_garbage")
    assert envelope["code"] == -500 and "malformed payload" in envelope["message"]
    # SAM local: an error payload without the FunctionError header still says its own reason
    envelope = envelope_from(invoke_api, "errors_without_the_header")
    assert envelope["code"] == -500 and "serves tenant 't1' only" in envelope["message"], envelope
    envelope = envelope_from(invoke_api, "no-such-function")
    assert envelope["code"] == -500 and "ResourceNotFoundException" in envelope["message"]


def test_one_attempt_only_a_slow_run_is_never_executed_twice(invoke_api, misbehaving):
    before = invoke_api.invocations
    envelope_from(invoke_api, "sleeps")
    assert invoke_api.invocations == before + 1


def test_the_run_request_travels_unchanged():
    request = RunRequest(language="python3", code="print(1)", timeout=2, stdin="é")
    assert request.to_payload() == {
        "language": "python3",
        "code": "print(1)",
        "preload": "",
        "enable_network": False,
        "timeout": 2,
        "stdin": "é",
    }


def test_a_service_without_functions_is_not_ready(invoke_api):
    env = {k: v for k, v in boto_environment(invoke_api).items() if "SANDLOT_LAMBDA" not in k}
    service = Service(SANDLOT_BACKEND="lambda", **env).start(wait=False)
    try:
        time.sleep(3)
        assert httpx.get(service.url + "/health").status_code == 503
    finally:
        service.stop()
