"""The load script's short form: mixed benign and hostile runs from several clients at once give
exact results, no error but the designed 503, and leave nothing behind (bench/load.py for the long form)."""

from __future__ import annotations

import os
import sys

import pytest
import unprivileged
from service import IS_ROOT, require_namespaces

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))

import load  # noqa: E402


@pytest.mark.parametrize("mode", ["auto", "unprivileged", "container"])
def test_short_mixed_load_is_exact_and_leaves_nothing(mode):
    if mode == "unprivileged" and unprivileged.unavailable():
        pytest.skip(unprivileged.unavailable())
    require_namespaces(mode)  # under the stand-in switch `auto` is `container` as well
    if mode == "container" and not IS_ROOT:
        pytest.skip("the stand-in for a container narrows root's privileges")
    report = load.run(clients=4, seconds=8, mode=mode)
    assert report["total_runs"] >= 20, report
    assert set(report["runs"]) >= {"python product", "node product"}, report["runs"]
    assert report["wrong"] == {}, report["wrong_samples"]
    assert report["error_count"] == 0, report["errors"]
    assert report["leftovers"] == {"processes": [], "uid_processes": [], "mounts": [], "rules": ""}
