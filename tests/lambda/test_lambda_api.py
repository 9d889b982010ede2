"""The API function with real API Gateway event shapes, through Mangum and the whole app to the runtime functions."""

import base64
import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "infra"))
sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))

from events import http_api_v2, rest_api_v1  # noqa: E402
from service import API_KEY  # noqa: E402
from test_cases import CASES, check  # noqa: E402

KEY = {"X-Api-Key": API_KEY}


def body_of(response: dict):
    body = response["body"]
    if response.get("isBase64Encoded"):
        body = base64.b64decode(body).decode()
    return json.loads(body) if body else None


def post_v2(api_function, payload, headers=KEY, encode=False):
    raw = payload if isinstance(payload, str) else json.dumps(payload)
    return api_function.handler(http_api_v2("POST", "/v1/sandbox/run", raw, headers, encode=encode), None)


def test_health_through_http_api_v2(api_function):
    response = api_function.handler(http_api_v2("GET", "/health"), None)
    assert response["statusCode"] == 200 and body_of(response) == "ok"


def test_run_through_http_api_v2(api_function):
    response = post_v2(api_function, {"language": "python3", "code": "print(1 + 1)", "enable_network": True})
    assert response["statusCode"] == 200
    envelope = body_of(response)
    assert envelope["code"] == 0, envelope
    assert envelope["data"]["stdout"] == "2\n" and envelope["data"]["error"] == ""


def test_a_base64_encoded_body(api_function):
    response = post_v2(api_function, {"language": "nodejs", "code": "console.log('b64 é')"}, encode=True)
    assert body_of(response)["data"]["stdout"] == "b64 é\n"


def test_wrong_or_missing_key_is_401_with_an_empty_body(api_function):
    for headers in ({}, {"X-Api-Key": "wrong"}):
        response = post_v2(api_function, {"language": "python3", "code": "print(1)"}, headers)
        assert response["statusCode"] == 401 and response["body"] == ""


def test_client_errors_keep_dify_sandboxs_envelope(api_function):
    response = post_v2(api_function, "{not json")
    assert response["statusCode"] == 400 and body_of(response)["code"] == -400
    response = post_v2(api_function, {"language": "cobol", "code": "x"})
    assert response["statusCode"] == 400 and body_of(response)["message"] == "unsupported language"
    response = post_v2(api_function, {"language": "python3", "code": ""})
    assert response["statusCode"] == 400 and "code" in body_of(response)["message"]


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_shared_case_through_http_api_v2(api_function, case):
    body = {"language": case["language"], "code": case["code"], "enable_network": case["enable_network"]}
    if "timeout" in case:
        body["timeout"] = case["timeout"]
    response = post_v2(api_function, body)
    envelope = body_of(response)
    assert response["statusCode"] == 200 and envelope["code"] == 0, envelope
    check(case["expect"], envelope["data"])


def test_run_and_dependencies_through_rest_api_v1(api_function):
    event = rest_api_v1("POST", "/v1/sandbox/run", json.dumps({"language": "python3", "code": "print(3)"}), KEY)
    response = api_function.handler(event, None)
    assert response["statusCode"] == 200 and body_of(response)["data"]["stdout"] == "3\n"
    event = rest_api_v1("GET", "/v1/sandbox/dependencies", None, KEY, query={"language": "python3"})
    names = {d["name"].lower() for d in body_of(api_function.handler(event, None))["data"]["dependencies"]}
    assert "requests" in names


def test_layer_updates_say_the_layer_is_baked_into_the_image(api_function):
    event = http_api_v2("POST", "/v1/sandbox/dependencies/update", json.dumps({"language": "python3"}), KEY)
    envelope = body_of(api_function.handler(event, None))
    assert envelope["code"] == -500 and "rebuild the image" in envelope["message"]


def test_direct_invoke_answers_with_the_envelope(api_function):
    envelope = api_function.handler({"language": "python3", "code": "print('direct')"}, None)
    assert envelope == {"code": 0, "message": "success", "data": envelope["data"]}
    assert envelope["data"]["stdout"] == "direct\n"
    envelope = api_function.handler({"language": "python3"}, None)
    assert envelope["code"] == -400 and envelope["data"] is None
    envelope = api_function.handler(["not", "a", "request"], None)
    assert envelope["code"] == -400


def test_a_direct_invoke_may_name_its_tenant(api_function, invoke_api):
    """With SANDLOT_LAMBDA_TENANCY=header:<Name>, a direct invoke's `tenant_id` counts as that header would;
    under another policy it is not the caller's to choose."""
    from handler.tenancy import TenancyPolicy

    event = {"language": "python3", "code": "print('mine')", "tenant_id": "acme"}
    assert api_function.handler(event, None)["data"]["stdout"] == "mine\n"
    assert invoke_api.calls[-1][1] == "shared"  # auto, where the filter is in force: acme's name is not used
    saved = api_function.invoker.tenancy
    api_function.invoker.tenancy = TenancyPolicy("header", "X-Tenant")
    try:
        assert api_function.handler(event, None)["data"]["stdout"] == "mine\n"
        assert invoke_api.calls[-1][1] == "t:acme"
    finally:
        api_function.invoker.tenancy = saved
    envelope = api_function.handler({**event, "tenant_id": 7}, None)
    assert envelope["code"] == -400 and "tenant_id" in envelope["message"]


def test_importing_the_api_function_needs_no_jail():
    """It ships as a zip: no libseccomp, no ctypes wrappers, no node."""
    code = (
        "import sys, handler.lambda_function\n"
        "bad = sorted(m for m in sys.modules if m in ('pyseccomp', 'ctypes', 'layers.manager')"
        " or m.startswith(('runtimes.jail', 'layers.isolation', 'layers.jailer')))\n"
        "print(bad)\n"
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "SANDLOT_CONFIG": "/nonexistent/config.yaml",
        "API_KEY": API_KEY,  # the function's init refuses an empty key
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
        "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    }
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
