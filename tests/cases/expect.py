"""What a case of run_cases.json expects of a run's result (its `expect` keys: the file's `expect_keys`). Plain
Python, no test framework: tests/test_cases.py and infra/arm64/vm.py (the cases through an emulated arm64
machine's forwarded port, from the host's own python3) both check with it."""

import re


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
