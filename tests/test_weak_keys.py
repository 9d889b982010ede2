"""No working default secret: start-up refuses a key that is empty, short, or one anyone knows (the placeholders
this repository ships, Dify's `dify-sandbox`), unless SANDLOT_ALLOW_INSECURE_API_KEY says so outright; the
Kubernetes manifests hold no key and do not start without the operator's Secret."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest
import yaml
from service import Service

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WEAK = {
    "empty": "",
    "short": "fifteen-chars-k",  # 15 characters
    "dify-default": "dify-sandbox",
    "kubernetes-placeholder": "replace-me-with-a-long-random-key",
    "config-example": "change-me",
    "events-placeholder": "replace-with-your-api-key",
}


def serve(**env: str) -> subprocess.CompletedProcess:
    """`sandlot serve` as far as it goes: a refusal exits before any layer is built (in a second or two); a service
    that is still up after 30 s was not refused, and is ended."""
    svc = Service(**env)
    try:
        return subprocess.run(
            [sys.executable, "-m", "handler.cli", "serve", "--port", str(svc.port)],
            env=svc.env,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"not refused: still serving after 30 s\n{exc.stderr}")


def refused_in_one_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode != 0, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("sandlot:")]
    assert len(lines) == 1, result.stderr
    assert "SANDLOT_ALLOW_INSECURE_API_KEY=true" in lines[0]
    return lines[0]


@pytest.mark.parametrize("kind", list(WEAK))
def test_a_weak_api_key_stops_start_up_with_a_one_line_message(kind):
    line = refused_in_one_line(serve(API_KEY=WEAK[kind]))
    assert "refusing to serve: API_KEY is " in line
    if kind == "short":
        assert "15 characters" in line and WEAK[kind] not in line  # a private key is not echoed
    elif kind == "dify-default":
        assert "SANDBOX_API_KEY" in line  # where a Dify install sets it


def test_the_placeholders_the_repository_ships_are_all_refused():
    with open(os.path.join(ROOT, "conf", "config.yaml.example")) as f:
        example = yaml.safe_load(f)["app"]["key"]
    assert example in WEAK.values()
    events = os.path.join(ROOT, "infra", "events")
    for name in os.listdir(events):
        with open(os.path.join(events, name)) as f:
            assert "replace-with-your-api-key" in f.read() or "api-key" not in name


def test_a_weak_admin_key_is_refused_too():
    line = refused_in_one_line(serve(SANDLOT_ADMIN_KEY="admin"))
    assert "SANDLOT_ADMIN_KEY is 5 characters long" in line


def test_the_lambda_api_function_refuses_a_weak_key_at_init():
    env = {**Service().env, "API_KEY": "dify-sandbox", "AWS_DEFAULT_REGION": "us-east-1"}
    result = subprocess.run(
        [sys.executable, "-c", "import handler.lambda_function"], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert "refusing to serve: API_KEY is 'dify-sandbox'" in result.stderr


def test_with_the_opt_in_a_weak_key_serves_and_is_warned_about_once():
    svc = Service(API_KEY="dify-sandbox", SANDLOT_ALLOW_INSECURE_API_KEY="true").start()
    try:
        assert httpx.get(svc.url + "/v1/sandbox/health", headers={"X-Api-Key": "dify-sandbox"}).status_code == 200
        warnings = [line for line in svc.output().splitlines() if "SANDLOT_ALLOW_INSECURE_API_KEY" in line]
        assert len(warnings) == 1 and "WARNING" in warnings[0].upper()
        body = {"language": "python3", "code": "print(1 + 1)", "preload": "", "enable_network": False}
        reply = httpx.post(svc.url + "/v1/sandbox/run", json=body, headers={"X-Api-Key": "dify-sandbox"}, timeout=60)
        assert reply.json()["data"]["stdout"] == "2\n"
    finally:
        svc.stop()


@pytest.mark.parametrize("variant", ("default", "restricted"))
def test_the_manifests_hold_no_key_and_need_the_operators_secret(variant):
    path = os.path.join(ROOT, "infra", "kubernetes", variant, "sandlot.yaml")
    with open(path) as f:
        text = f.read()
    kinds = [doc["kind"] for doc in yaml.safe_load_all(text)]
    assert "Secret" not in kinds
    assert "replace-me" not in text and "stringData" not in text
    (deployment,) = [doc for doc in yaml.safe_load_all(text) if doc["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    key = {e["name"]: e for e in container["env"]}["API_KEY"]
    assert "value" not in key
    ref = key["valueFrom"]["secretKeyRef"]
    assert ref["name"] == "sandlot-api-key" and ref["key"] == "api-key" and ref.get("optional", False) is False
    assert "kubectl create secret generic sandlot-api-key --from-literal=api-key=" in text
