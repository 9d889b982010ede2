"""The behavioural cases of run_cases.json, through the real HTTP API."""

import json
import os
import re

import pytest
from service import IS_ROOT

with open(os.path.join(os.path.dirname(__file__), "cases", "run_cases.json")) as f:
    CASES = json.load(f)["cases"]

SERVED = {"python3", "nodejs"}


def check(expect: dict, data: dict) -> None:
    for key, value in expect.items():
        if key in ("stdout_equals", "stderr_equals", "error_equals"):
            assert data[key.removesuffix("_equals")] == value, key
        elif key in ("stdout_contains", "stderr_contains", "error_contains"):
            for part in value:
                assert part in data[key.removesuffix("_contains")], (key, part)
        elif key == "error_contains_any":
            assert any(part in data["error"] for part in value), key
        elif key == "error_contains_ci":
            for part in value:
                assert part.lower() in data["error"].lower(), (key, part)
        elif key == "stdout_not_contains":
            for part in value:
                assert part not in data["stdout"], (key, part)
        elif key == "stdout_regex":
            assert re.fullmatch(value, data["stdout"]), key
        elif key == "stdout_length":
            assert len(data["stdout"]) == value, key
        elif key == "error_contains_stderr":
            assert data["stderr"] in data["error"], key
        elif key == "exit_code":
            assert data["exit_code"] == value, key
        elif key == "exit_code_nonzero":
            assert data["exit_code"] != 0, key
        else:
            raise AssertionError(f"unknown expectation {key}")


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_case(service, case):
    if case["language"] not in SERVED:
        pytest.skip(f"{case['language']} runtime is not built yet (issue: Node.js runs)")
    if case.get("requires") == "root" and not IS_ROOT:
        pytest.skip("needs root: the chroot is only in force as root")
    body = {"language": case["language"], "code": case["code"], "enable_network": case["enable_network"]}
    if "timeout" in case:
        body["timeout"] = case["timeout"]
    envelope = service.run(**body)
    assert envelope["code"] == 0, envelope
    check(case["expect"], envelope["data"])
