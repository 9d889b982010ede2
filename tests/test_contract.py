"""The seams' contract: one result model, one Unavailable, and handler/ kept off the jail."""

from __future__ import annotations

import ast
import asyncio
import json
import os

import pytest

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
    """The API talks to runtimes through the contract (runtimes.payload, runtimes.settings) only."""
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
