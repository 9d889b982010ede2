"""Logs: one JSON line per run with its facts, the request and trace ids, and no tenant data by default."""

from __future__ import annotations

import json
import logging
import re

import httpx
import pytest
from service import API_KEY, wait_for

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


def json_lines(output: str) -> list[dict]:
    lines = []
    for line in output.splitlines():
        if line.startswith("{"):
            lines.append(json.loads(line))
    return lines


def run_lines(output: str, request_id: str) -> list[dict]:
    return [line for line in json_lines(output) if line.get("request_id") == request_id and line.get("event") == "run"]


def logged_run_lines(service, request_id: str) -> list[dict]:
    """The request's run lines, once written: the middleware logs after the response has gone out."""
    wait_for(lambda: run_lines(service.output(), request_id))
    return run_lines(service.output(), request_id)


def test_one_json_line_per_run_with_its_facts_and_no_code_or_output(service):
    secret_code = "print('OUTPUT-MARK-' + 'x7'); import sys; print('ERR-MARK-z9', file=sys.stderr); sys.exit(4)"
    response = httpx.post(
        service.url + "/v1/sandbox/run",
        headers={"X-Api-Key": API_KEY, "X-Request-Id": "req-logs-1", "traceparent": TRACEPARENT},
        json={"language": "python3", "code": secret_code, "stdin": "STDIN-MARK-q3"},
        timeout=60,
    )
    assert response.headers["x-request-id"] == "req-logs-1"
    assert response.json()["data"]["exit_code"] == 4
    [line] = logged_run_lines(service, "req-logs-1")
    output = service.output()
    assert line["trace_id"] == TRACE_ID
    assert line["language"] == "python3"
    assert line["outcome"] == "error"
    assert line["exit_code"] == 4
    assert line["stdout_bytes"] == len("OUTPUT-MARK-x7\n")
    assert line["stderr_bytes"] == len("ERR-MARK-z9\n")
    assert line["duration"] > 0 and line["queue_wait"] >= 0
    assert line["level"] == "INFO" and line["time"]
    for mark in ("OUTPUT-MARK", "ERR-MARK", "STDIN-MARK", "'x7'"):
        assert mark not in output
    # every logged line is JSON, uvicorn's included (what child processes such as pip write is theirs)
    plain = re.compile(r"^(\d{4}-\d\d-\d\d[ T][\d:,.]+ )?(DEBUG|INFO|WARNING|ERROR|CRITICAL)[: ]")
    assert not [line for line in output.splitlines() if plain.match(line)]
    assert any(line.get("logger", "").startswith("uvicorn") for line in json_lines(output))


def test_a_request_id_is_made_when_missing_or_unfit(service):
    with service.client() as client:
        made = client.get("/v1/sandbox/health").headers["x-request-id"]
        unfit = client.get("/v1/sandbox/health", headers={"X-Request-Id": "bad id\twith spaces"}).headers
    assert len(made) == 32
    assert unfit["x-request-id"] != "bad id\twith spaces" and len(unfit["x-request-id"]) == 32


def test_refused_and_invalid_run_requests_get_their_line_too(service):
    httpx.post(
        service.url + "/v1/sandbox/run",
        headers={"X-Api-Key": API_KEY, "X-Request-Id": "req-logs-bad"},
        json={"language": "python3", "code": ""},
    )
    [line] = logged_run_lines(service, "req-logs-bad")
    assert line["outcome"] == "invalid" and line["status"] == 400 and line["language"] == "python3"


def test_plain_text_format_and_debug_payloads(narrow):
    response = httpx.post(
        narrow.url + "/v1/sandbox/run",
        headers={"X-Api-Key": API_KEY, "X-Request-Id": "req-text-1"},
        json={"language": "python3", "code": "print('DEBUG-MARK-' + 'k1')"},
        timeout=60,
    )
    assert response.headers["x-request-id"] == "req-text-1"

    def text_lines() -> list[str]:
        return [line for line in narrow.output().splitlines() if "request_id=req-text-1" in line]

    wait_for(text_lines)  # written after the response has gone out
    lines = text_lines()
    assert len(lines) == 1, lines
    assert not lines[0].startswith("{")
    assert "outcome=ok" in lines[0] and "language=python3" in lines[0]
    assert "DEBUG-MARK-k1" in lines[0]  # SANDLOT_LOG_DEBUG: the output is logged
    assert "print('DEBUG-MARK-' + 'k1')" in lines[0]  # and the code


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (TRACEPARENT, TRACE_ID),
        (TRACEPARENT.upper(), TRACE_ID),
        ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", None),  # all-zero trace id is invalid
        ("ff-" + TRACEPARENT[3:], None),  # version ff is invalid
        ("garbage", None),
        (None, None),
    ],
)
def test_traceparent_sets_the_trace_id_only_when_valid(header, expected):
    from handler.logs import trace_id_from

    got = trace_id_from(header)
    if expected:
        assert got == expected
    else:
        assert len(got) == 32 and got != TRACE_ID


def test_lines_outside_a_request_carry_no_ids(capsys):
    from handler.logs import configure

    configure("json")
    logging.getLogger("sandlot.test").info("hello", extra={"answer": 42})
    line = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert line["message"] == "hello" and line["answer"] == 42 and "request_id" not in line
    logging.getLogger().handlers.clear()
