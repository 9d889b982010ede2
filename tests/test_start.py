"""The service's start: what it imports before serving, the pages it loads on first use, and a start's logs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import httpx
import pytest
from service import API_KEY, IS_ROOT, Service, wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# what neither `import handler.cli` nor a served start loads: the admin page (jinja2), the package routes, the
# OpenAPI document, the settings report, YAML without a config file
PAGES = ("handler.admin", "handler.packages_api", "handler.openapi", "handler.settings_report", "jinja2", "yaml")


def loaded_after(code: str, **env: str) -> set[str]:
    """The modules a fresh interpreter holds after `code` (its last line prints nothing)."""
    script = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**os.environ, "SANDLOT_CONFIG": "/nonexistent/config.yaml", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return set(json.loads(out.stdout.splitlines()[-1]))


def test_importing_the_command_loads_neither_the_web_stack_nor_the_settings_nor_the_pages():
    loaded = loaded_after("import handler.cli")
    assert not loaded & {*PAGES, "starlette", "uvicorn", "pydantic", "pydantic_settings", "prometheus_client"}


APP = """
from handler.app import create_app
from handler.settings import load_settings

class Invoker:
    async def start(self): pass
    async def stop(self): pass
    def ready(self): return True
    def status(self): return {}

app = create_app(load_settings(API_KEY="k", SANDLOT_ADMIN_KEY="a"), Invoker())
"""


def test_the_app_routes_the_pages_without_importing_them_and_loads_them_at_their_first_request():
    assert not loaded_after(APP) & set(PAGES)
    asked = APP + (
        "import warnings; warnings.simplefilter('ignore')\nfrom starlette.testclient import TestClient\n"
        "client = TestClient(app)\n"
        "assert '/v1/sandbox/run' in client.get('/openapi.json').json()['paths']\n"
        "assert 'Sign in' in client.get('/admin').text\n"
        "assert client.get('/v1/sandlot/packages', headers={'X-Api-Key': 'a'}).status_code in (200, 503)\n"
    )
    loaded = loaded_after(asked)
    assert {"handler.admin", "handler.openapi", "handler.packages_api", "jinja2"} <= loaded


def test_the_pages_routes_are_the_real_ones_in_their_order():
    """PAGE_ROUTES stands in for the routes the page modules make: the same paths and methods, in the same order
    (Starlette takes the first that matches)."""
    import asyncio

    from handler.app import PAGE_ROUTES, Pages
    from handler.metrics import Metrics
    from handler.settings import load_settings

    class Api:
        invoker = object()

    async def made():
        return Pages(load_settings(API_KEY="k"), Api(), None, Metrics()).real_routes()

    real = asyncio.run(made())
    assert [(route.path, tuple(sorted(route.methods - {"HEAD"}))) for route in real] == [
        (path, tuple(sorted(methods))) for path, methods in PAGE_ROUTES
    ]


@pytest.mark.skipif(not IS_ROOT, reason="needs root: the jail's default mode")
def test_a_start_hit_at_once_logs_no_error_and_says_when_each_runtime_was_ready():
    """Health checks and runs that come while the runtimes start wait or get 503 from /health: a normal start,
    logged at INFO, not at ERROR."""
    service = Service()
    service.start(wait=False)
    answers: dict[str, dict] = {}

    def run(language: str, code: str) -> None:
        while True:
            try:
                answers[language] = httpx.post(
                    service.url + "/v1/sandbox/run",
                    headers={"X-Api-Key": API_KEY},
                    json={"language": language, "code": code},
                    timeout=120,
                ).json()
                return
            except httpx.TransportError:
                if service.process.poll() is not None:
                    return

    def health() -> None:
        while len(answers) < 2 and service.process.poll() is None:
            try:
                httpx.get(service.url + "/health", timeout=5)
                httpx.get(service.url + "/v1/sandbox/health", headers={"X-Api-Key": API_KEY}, timeout=5)
            except httpx.TransportError:
                pass

    threads = [
        threading.Thread(target=run, args=("python3", "print('hi')")),
        threading.Thread(target=run, args=("nodejs", "console.log('hi')")),
        threading.Thread(target=health),
    ]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert answers["python3"]["data"]["stdout"] == "hi\n", answers
        assert answers["nodejs"]["data"]["stdout"] == "hi\n", answers
        wait_for(lambda: "started (seconds after exec)" in service.output())
    finally:
        service.stop()
    lines = [json.loads(line) for line in service.output().splitlines() if line.startswith("{")]
    assert not [line for line in lines if line["level"] in ("ERROR", "CRITICAL")]
    ready = {line.get("language") for line in lines if "runtime ready" in line["message"]}
    assert ready == {"python3", "nodejs"}
    [marks] = [line["start_marks"] for line in lines if "start_marks" in line]
    assert {"settings", "web stack", "app", "runtimes started", "python3 ready", "nodejs ready"} <= set(marks)
