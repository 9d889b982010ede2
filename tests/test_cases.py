"""The behavioural cases of run_cases.json, through the real HTTP API."""

import json
import os

import pytest
from cases.expect import check
from service import IS_ROOT

with open(os.path.join(os.path.dirname(__file__), "cases", "run_cases.json")) as f:
    CASES = json.load(f)["cases"]

SERVED = {"python3", "nodejs"}


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
