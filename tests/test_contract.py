"""The seams' contract: one result model, one Unavailable, and handler/ kept off the jail."""

from __future__ import annotations

import ast
import asyncio
import json
import os

import pytest
from test_settings import pydantic_imported_by

from runtimes.payload import RunOutcome, RunRequest, RunResult, Unavailable, fit_result

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _imports(path: str) -> set[str]:
    with open(path) as f:
        tree = ast.parse(f.read())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_handler_imports_nothing_of_the_jail():
    """The API talks to runtimes through the contract (runtimes.payload, runtimes.runtime_settings) only."""
    offenders = {}
    for name in sorted(os.listdir(os.path.join(ROOT, "handler"))):
        if name.endswith(".py"):
            jail = sorted(m for m in _imports(os.path.join(ROOT, "handler", name)) if m.startswith("runtimes.jail"))
            if jail:
                offenders[name] = jail
    assert not offenders


def test_handler_has_one_unavailable():
    import handler.invoker

    assert not hasattr(handler.invoker, "SandboxUnavailable")
    assert handler.invoker.Unavailable is Unavailable


def _result(**fields) -> RunResult:
    base = {"stdout": "", "stderr": "", "error": "", "exit_code": 0, "outcome": "ok"}
    return RunResult.model_validate({**base, **fields})


def test_the_wire_format_is_dify_sandboxs_plus_duration_truncated_and_outcome():
    wire = _result(stdout="2\n", duration=0.01).to_wire()
    assert wire == {
        "stdout": "2\n",
        "stderr": "",
        "error": "",
        "exit_code": 0,
        "duration": 0.01,
        "truncated": False,
        "outcome": "ok",
    }
    assert json.loads(json.dumps(wire)) == wire
    with pytest.raises(ValueError):
        RunResult.model_validate({"stdout": "", "stderr": "", "error": "", "exit_code": 0, "outcome": "fine"})


@pytest.mark.parametrize("ascii_only", [True, False])
def test_a_result_cut_to_fit_says_so_in_its_outcome(ascii_only):
    result = _result(stdout="é" * 100_000, stderr="tail", exit_code=0)
    cut = fit_result(result, 50_000, ascii_only)
    assert len(json.dumps(cut.to_wire(), ensure_ascii=ascii_only).encode()) <= 50_000
    assert cut.outcome == RunOutcome.OUTPUT_LIMIT and cut.truncated and cut.exit_code == -1
    assert "error: output limit exceeded" in cut.error and cut.stdout and set(cut.stdout) == {"é"}
    assert fit_result(_result(stdout="small"), 50_000, ascii_only) == _result(stdout="small")


class _Broken:
    async def run(self, request):
        raise OSError(24, "Too many open files")


class _Refusing:
    async def run(self, request):
        raise Unavailable("the python3 runtime is starting")


def test_the_local_invoker_maps_what_a_runtime_raises_at_its_seam():
    from handler.local_invoker import LocalInvoker

    request = RunRequest(language="python3", code="print(1)")
    with pytest.raises(Unavailable, match="the python3 runtime failed: OSError: .*Too many open files"):
        asyncio.run(LocalInvoker({"python3": _Broken()}).invoke(request))
    with pytest.raises(Unavailable, match="starting"):
        asyncio.run(LocalInvoker({"python3": _Refusing()}).invoke(request))
    with pytest.raises(Unavailable, match="no runtime for python3"):
        asyncio.run(LocalInvoker({}).invoke(request))


def test_a_result_is_the_wire_models_shape():
    """payload.RunResult (plain, what a run gives) and run_models.RunResult (its wire schema, the check of answers
    from outside) name the same fields in the same order with the same defaults, and travel alike."""
    import dataclasses

    from runtimes import run_models

    plain = {f.name: f.default for f in dataclasses.fields(RunResult)}
    wire = {name: info.default for name, info in run_models.RunResult.model_fields.items()}
    assert list(plain) == list(wire)
    assert {k: v for k, v in plain.items() if v is not dataclasses.MISSING} == {
        k: v for k, v in wire.items() if repr(v) != "PydanticUndefined"
    }
    fields = {"stdout": "é\n", "stderr": "x", "error": "process exited with code 1\n", "exit_code": 1}
    fields |= {"duration": 0.5, "outcome": "error", "truncated": True}
    assert RunResult(**fields).to_wire() == run_models.RunResult(**fields).to_wire() == _result(**fields).to_wire()
    assert _result(**fields, unknown="ignored") == RunResult(**fields)


REQUESTS = [
    {"language": "python3", "code": "print(1)"},
    {"language": "nodejs", "code": "1", "preload": "x", "enable_network": True, "timeout": 2.5, "stdin": "é"},
    {"language": "python3", "code": "1", "timeout": 3, "memory_limit_mb": 64, "enable_network": False},
    {"language": "python3", "code": ""},
    {"language": "python3"},
    {"language": "ruby", "code": "1"},
    {"language": 3, "code": "1"},
    {"language": "python3", "code": "1", "extra": 1},
    {"language": "python3", "code": "1", "timeout": 0},
    {"language": "python3", "code": "1", "timeout": -1.5},
    {"language": "python3", "code": "1", "timeout": float("nan")},
    {"language": "python3", "code": "1", "timeout": float("inf")},
    {"language": "python3", "code": "1", "timeout": True},
    {"language": "python3", "code": "1", "timeout": "2"},
    {"language": "python3", "code": "1", "memory_limit_mb": 1.0},
    {"language": "python3", "code": "1", "memory_limit_mb": 0},
    {"language": "python3", "code": "1", "memory_limit_mb": True},
    {"language": "python3", "code": "1", "enable_network": 1},
    {"language": "python3", "code": "1", "enable_network": "true"},
    {"language": "python3", "code": b"1"},
    {"language": "python3", "code": "1", "stdin": None},
    {"language": "python3", "code": "1", "preload": None},
    {"language": "python3", "code": "1", "timeout": None, "memory_limit_mb": None},
    {"code": "1"},
    [],
    "print(1)",
]


@pytest.mark.parametrize("network_allowed", [True, False])
@pytest.mark.parametrize("data", REQUESTS, ids=range(len(REQUESTS)))
def test_a_functions_request_is_read_as_the_model_reads_it(data, network_allowed):
    """A runtime function reads its event without pydantic (read_request): the same request, or the same error."""
    from runtimes.payload import InvalidRequest, parse_request, read_request

    try:
        expected = parse_request(data, network_allowed).to_payload()
    except InvalidRequest as exc:
        expected = (str(exc), exc.http_status)
    try:
        got = read_request(data, network_allowed).to_payload()
    except InvalidRequest as exc:
        got = (str(exc), exc.http_status)
    assert got == expected
    if isinstance(got, dict):
        assert {k: type(v) for k, v in got.items()} == {k: type(v) for k, v in expected.items()}


def test_a_functions_first_run_imports_no_pydantic():
    """A fresh environment's first run (init, the event read, the result built and fitted) imports no pydantic:
    it cost that cold path about 70 ms of CPU."""
    script = (
        "import sys\n"
        "import runtimes.function.runtime_function, runtimes.python.runtime, runtimes.nodejs.runtime\n"
        "from runtimes.jail.service.outcome import Outcome\n"
        "from runtimes.payload import fit_result, read_request\n"
        "request = read_request({'language': 'python3', 'code': 'print(1)', 'enable_network': True}, True)\n"
        "outcome = Outcome(b'1\\n', b'', False, 0, False, False, 0.01)\n"
        "wire = fit_result(outcome.to_result(), 6_000_000).to_wire()\n"
        "assert wire['stdout'] == '1\\n' and wire['outcome'] == 'ok', wire\n"
    )
    assert pydantic_imported_by(script) == []
