"""The service's start: what it imports before serving, the pages it loads on first use, and a start's logs."""

from __future__ import annotations

import json
import os
import shutil
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
    assert not loaded_after(APP) & {*PAGES, "prometheus_client"}  # metrics: at the first scrape, or once started
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
    # the runtimes started from the environment's light reading, the settings model loaded while they started
    assert marks["settings"] < marks["settings model"] < marks["web stack"]


@pytest.mark.skipif(not IS_ROOT, reason="needs root: the jail's default mode")
def test_a_client_that_connects_while_the_service_starts_is_served_not_refused():
    """The port listens from the start, before the web stack is even imported: a connection made then waits in
    the backlog and its run is answered once the service serves (before, it was refused until uvicorn bound it)."""
    import socket
    import time

    service = Service()
    service.start(wait=False)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert time.monotonic() < deadline and service.process.poll() is None, service.output()
            try:
                conn = socket.create_connection(("127.0.0.1", service.port), timeout=60)
                break
            except OSError:
                time.sleep(0.001)
        early = service.output()
        body = json.dumps({"language": "python3", "code": "print('hi')"}).encode()
        conn.sendall(
            b"POST /v1/sandbox/run HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
            + f"X-Api-Key: {API_KEY}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
        conn.close()
    finally:
        service.stop()
    assert "Application startup complete" not in early  # connected while the service was still starting
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), answer[:500]
    assert json.loads(payload)["data"]["stdout"] == "hi\n"


def test_what_is_counted_before_the_metrics_load_is_counted_once_they_do():
    """prometheus-client loads after the start (or at a scrape): the responses and runs counted before are kept."""
    from handler.metrics import Metrics

    metrics = Metrics()
    metrics.inc("http_responses", "/health", "503")
    metrics.inc("runs", "python3", "ok")
    metrics.observe("run_duration", 0.02, "python3")
    metrics.observe("queue_wait", 0.001)
    assert not metrics._loaded  # counted while prometheus-client is not loaded
    text = metrics.exposition().body.decode()
    assert 'sandlot_http_responses_total{route="/health",status="503"} 1.0' in text
    assert 'sandlot_runs_total{language="python3",outcome="ok"} 1.0' in text
    assert 'sandlot_run_duration_seconds_count{language="python3"} 1.0' in text
    assert "sandlot_queue_wait_seconds_count 1.0" in text
    metrics.inc("runs", "python3", "ok")  # and after, directly
    assert 'sandlot_runs_total{language="python3",outcome="ok"} 2.0' in metrics.exposition().body.decode()


def test_the_runtimes_start_from_the_early_settings_without_loading_pydantic():
    """The runtimes (and their zygotes) start before the settings model and the web stack are loaded: what they
    need loads no pydantic, which the settings model then loads while their zygotes start."""
    code = (
        "from handler.cli import layer_manager, local_backend\nfrom handler.early_settings import early_settings\n"
        "settings = early_settings()\ninvoker, packages = local_backend(settings, layer_manager(settings))\n"
        "assert set(invoker.runtimes) == {'python3', 'nodejs'}"
    )
    import shutil
    import tempfile

    data = tempfile.mkdtemp(prefix="sandlot-test-", dir="/var/tmp")  # a data dir under /tmp is refused
    try:
        loaded = loaded_after(code, API_KEY=API_KEY, SANDLOT_DATA_DIR=data)
    finally:
        shutil.rmtree(data)
    assert not loaded & {"pydantic", "pydantic_core", "pydantic_settings", "starlette", "uvicorn"}


def test_an_interpreters_paths_are_asked_of_it_once_then_read_from_the_data_dir(tmp_path, monkeypatch):
    """A Python zygote's tree needs where the interpreter keeps its standard library: asked of the interpreter at
    the first start (another interpreter's start), kept in the data dir under the interpreter's identity."""
    from runtimes.config import default_python
    from runtimes.python import runtime

    python = default_python()
    runtime.interpreter_paths.cache_clear()
    asked = runtime.interpreter_paths(python, str(tmp_path))
    assert asked == runtime._ask_interpreter(python) and os.path.isdir(asked["stdlib"])
    runtime.interpreter_paths.cache_clear()

    def no_interpreter(*args, **kwargs):
        raise AssertionError(f"an interpreter was started: {args}")

    monkeypatch.setattr(runtime.subprocess, "run", no_interpreter)
    try:
        assert runtime.interpreter_paths(python, str(tmp_path)) == asked  # read, no interpreter started
        runtime.interpreter_paths.cache_clear()
        cache = tmp_path / runtime.PATHS_CACHE
        entries = json.loads(cache.read_text())
        gone = str(tmp_path / "gone")  # a standard library that is not there any more
        cache.write_text(json.dumps({key: {**paths, "stdlib": gone} for key, paths in entries.items()}))
        with pytest.raises(AssertionError, match="an interpreter was started"):  # a stale answer: asked again
            runtime.interpreter_paths(python, str(tmp_path))
    finally:
        runtime.interpreter_paths.cache_clear()


GC_DURING_START = """
import gc, json, sys
import handler.cli as cli
import uvicorn

seen = {}
web_stack = cli._import_web_stack


def watched():
    seen["importing"] = gc.isenabled()
    web_stack()


async def serve(self, sockets=None):  # instead of serving: what the collector is once the app is built
    seen["serving"] = gc.isenabled()
    seen["frozen"] = gc.get_freeze_count()


cli._import_web_stack = watched
uvicorn.Server.serve = serve
code = cli.main(["serve"])
print(json.dumps({**seen, "after": gc.isenabled(), "code": code}))
"""


def test_the_start_makes_its_objects_without_collections_and_serves_with_them_frozen():
    """No garbage collection walks the modules while the start imports them (a tenth of their CPU); once the app is
    built the collector is on again, what the start made frozen (never walked: it lives as long as the service)."""
    svc = Service()
    out = subprocess.run(
        [sys.executable, "-c", GC_DURING_START],
        cwd=ROOT,
        env={**svc.env, "PYTHONPATH": ROOT},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.splitlines()[-1])
    assert seen["importing"] is False and seen["serving"] is True and seen["after"] is True
    assert seen["frozen"] > 10_000


def test_a_container_finds_the_images_answers_for_the_tree_without_asking_again(tmp_path, monkeypatch):
    """The libraries ldd finds and the interpreter's paths are asked while the image is built (its trees' specs)
    and kept in the image (rootfs.IMAGE_CACHE) under a key its containers compute alike: a container's new volume
    (its own cache empty) asks neither ldd nor the interpreter again; a file changed since is asked again."""
    from runtimes.config import default_python
    from runtimes.linux import rootfs
    from runtimes.python import runtime

    image = tmp_path / "image-cache"
    image.mkdir()
    monkeypatch.setattr(rootfs, "IMAGE_CACHE", str(image))
    elf = tmp_path / "lib.so"
    shutil.copy(os.path.realpath(sys.executable), elf)  # an ELF file of this test's own, whose time it may change
    python = default_python()
    runtime.interpreter_paths.cache_clear()
    rootfs._ldd_memo.clear()
    built = tmp_path / "build-volume"  # the image build's data dir, gone with the build
    libraries = rootfs.shared_libraries([str(elf)], cache_dir=str(built))
    paths = runtime.interpreter_paths(python, str(built))
    assert libraries and {"ldd-cache.json", runtime.PATHS_CACHE} <= set(os.listdir(image))
    runtime.interpreter_paths.cache_clear()
    rootfs._ldd_memo.clear()
    monkeypatch.setattr(rootfs, "image_cache_writable", lambda: False)  # read, not written, here

    def nothing_started(*args, **kwargs):
        raise AssertionError(f"a process was started: {args}")

    monkeypatch.setattr(rootfs.subprocess, "run", nothing_started)
    monkeypatch.setattr(runtime.subprocess, "run", nothing_started)
    try:
        volume = str(tmp_path / "new-volume")
        assert rootfs.shared_libraries([str(elf)], cache_dir=volume) == libraries
        assert runtime.interpreter_paths(python, volume) == paths
        rootfs._ldd_memo.clear()
        os.utime(elf, ns=(0, 0))  # another file at that path: not the image's answer
        with pytest.raises(AssertionError, match="a process was started"):
            rootfs.shared_libraries([str(elf)], cache_dir=volume)
    finally:
        runtime.interpreter_paths.cache_clear()
        rootfs._ldd_memo.clear()


def test_an_ldd_that_found_nothing_is_asked_again_not_kept(tmp_path, monkeypatch):
    """ldd answering nothing for a layer's shared objects (it failed: killed, or its loader unreadable) is not
    kept as their answer, in memory or in a cache: the next tree asks again, and its runs get the libraries the
    objects load (kept, the layer's .so files would fail to load in every run until one of them changed)."""
    from runtimes.linux import rootfs

    monkeypatch.setattr(rootfs, "IMAGE_CACHE", str(tmp_path / "no-image-cache"))
    elf = tmp_path / "lib.so"
    shutil.copy(os.path.realpath(sys.executable), elf)
    run = rootfs.subprocess.run
    monkeypatch.setattr(
        rootfs.subprocess, "run", lambda argv, **kw: subprocess.CompletedProcess(argv, 1, stdout="", stderr="")
    )
    rootfs._ldd_memo.clear()
    try:
        assert rootfs.shared_libraries([str(elf)], cache_dir=str(tmp_path)) == []
        monkeypatch.setattr(rootfs.subprocess, "run", run)
        found = rootfs.shared_libraries([str(elf)], cache_dir=str(tmp_path))
        assert any("libc.so" in path for path in found), found
    finally:
        rootfs._ldd_memo.clear()
