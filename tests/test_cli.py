"""The `sandlot` command: run a file through a service or locally, health's exit code, config's sources."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from service import API_KEY, Service

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAM = "import sys\nprint('out:', sys.stdin.read())\nprint('to stderr', file=sys.stderr)\nsys.exit(7)\n"


def sandlot(*args: str, stdin: str | None = None, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "handler.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "API_KEY": API_KEY, "SANDLOT_CONFIG": "/nonexistent/config.yaml", **env},
        timeout=180,
    )


@pytest.fixture
def program(tmp_path):
    path = tmp_path / "prog.py"
    path.write_text(PROGRAM)
    (tmp_path / "input.txt").write_text("hello")
    return path


def test_run_through_a_service_prints_the_streams_and_exits_with_the_runs_code(service, program):
    out = sandlot("run", str(program), "--url", service.url, "--stdin", str(program.parent / "input.txt"))
    assert out.stdout == "out: hello\n"
    assert out.stderr.startswith("to stderr\n")
    assert out.returncode == 7


def test_run_locally_gives_the_same_result(program):
    out = sandlot("run", "--local", str(program), "--stdin", str(program.parent / "input.txt"))
    assert out.stdout == "out: hello\n", out.stderr
    assert out.stderr.startswith("to stderr\n")
    assert out.returncode == 7


def test_run_reads_code_from_stdin_and_guesses_nodejs_from_the_extension(service, tmp_path):
    out = sandlot("run", "-", "--language", "python3", "--url", service.url, stdin="print(6 * 7)")
    assert (out.stdout, out.returncode) == ("42\n", 0)
    script = tmp_path / "prog.js"
    script.write_text("console.log('node ok'); process.exit(3)")
    out = sandlot("run", str(script), "--url", service.url)
    assert (out.stdout, out.returncode) == ("node ok\n", 3)


def test_run_reports_a_timeout_and_a_refusal(service):
    out = sandlot("run", "-", "--language", "python3", "--timeout", "0.5", "--url", service.url, stdin="while 1: pass")
    assert out.returncode == 124 and "error: timeout" in out.stderr
    out = sandlot("run", "-", "--language", "python3", "--url", service.url, stdin="print(1)", API_KEY="wrong")
    assert out.returncode == 125 and "key" in out.stderr
    out = sandlot("run", "unknown.txt", "--url", service.url)
    assert out.returncode == 2 and "--language" in out.stderr
    out = sandlot("run", "missing.py", "--url", service.url)
    assert out.returncode == 2 and "cannot read missing.py" in out.stderr


def test_health_exits_zero_on_a_ready_service_and_shows_protections(service):
    out = sandlot("health", "--url", service.url)
    assert out.returncode == 0, out.stdout
    assert out.stdout.startswith("ready")
    assert "python3: ready" in out.stdout and "seccomp" in out.stdout


def test_health_exits_non_zero_on_a_service_that_is_not_ready():
    # a layer that cannot be read keeps the Python runtime down: /health answers 503
    svc = Service(PYTHON_PATH="/nonexistent/python3", NODEJS_PATH="/nonexistent/node").start(wait=False)
    try:
        for _ in range(600):
            out = sandlot("health", "--url", svc.url)
            if "not ready" in out.stdout:
                break
        assert out.returncode == 1 and out.stdout.startswith("not ready"), out.stdout + svc.output()
    finally:
        svc.stop()
    out = sandlot("health", "--url", svc.url)  # nothing listens any more
    assert out.returncode == 1 and out.stdout.startswith("unreachable")


def test_config_shows_sources_and_masks_secrets(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("app:\n  port: 9000\nmax_workers: 3\n")
    out = sandlot(
        "config",
        "--json",
        SANDLOT_CONFIG=str(config),
        MAX_WORKERS="2",
        HTTP_PROXY="http://user:pa55word@proxy.example:3128",
    )
    assert out.returncode == 0, out.stderr
    rows = {row["name"]: row for row in json.loads(out.stdout)}
    assert rows["MAX_WORKERS"] == {"name": "MAX_WORKERS", "value": "2", "source": "environment"}
    assert rows["SANDBOX_PORT"]["value"] == "9000" and rows["SANDBOX_PORT"]["source"] == f"file {config}"
    assert rows["WORKER_TIMEOUT"]["source"] == "default"
    assert API_KEY not in out.stdout and rows["API_KEY"]["value"].startswith("***")
    assert "pa55word" not in out.stdout and rows["HTTP_PROXY"]["value"] == "http://user:***@proxy.example:3128"
