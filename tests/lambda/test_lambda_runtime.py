"""The runtime functions as Lambda runs them: the real awslambdaric process against the Runtime API emulation."""

import json
import os
import signal
import subprocess
import sys

import pytest
from functions import FAKE_CREDENTIALS, OWN_UID, start_function

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))

from service import IS_ROOT, descendants, wait_for  # noqa: E402
from test_cases import CASES, check  # noqa: E402

pytestmark = pytest.mark.skipif(not IS_ROOT, reason=OWN_UID)

LIMIT = 6_291_456


def result_of(function, event) -> dict:
    invocation = function.invoke(event)
    assert invocation.kind == "response", (invocation.kind, invocation.body[:2000], function.output()[-3000:])
    assert len(invocation.body) <= LIMIT
    return invocation.json()


def error_of(function, event) -> dict:
    invocation = function.invoke(event)
    assert invocation.kind == "error", invocation.body[:2000]
    return invocation.json()


def test_hello(functions):
    for language, code in (("python3", "print('hello')"), ("nodejs", "console.log('hello')")):
        result = result_of(functions[language], {"language": language, "code": code})
        assert result["stdout"] == "hello\n" and result["exit_code"] == 0 and result["error"] == ""


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_shared_case(functions, case):
    if case.get("requires") == "root" and not IS_ROOT:
        pytest.skip("needs root: the chroot is only in force as root")
    event = {"language": case["language"], "code": case["code"], "enable_network": case["enable_network"]}
    if "timeout" in case:
        event["timeout"] = case["timeout"]
    check(case["expect"], result_of(functions[case["language"]], event))


def test_non_ascii_output_comes_back_exact(python_function):
    result = result_of(python_function, {"language": "python3", "code": "print('héllo 世界 🙂')"})
    assert result["stdout"] == "héllo 世界 🙂\n"


def test_output_that_would_not_fit_lambdas_response_says_so(python_function):
    # 2 million 'é' is under the 4 MiB output cap, but twelve megabytes once escaped as \u00e9
    code = "import sys; sys.stdout.write('é' * 2_000_000); sys.stderr.write('tail')"
    result = result_of(python_function, {"language": "python3", "code": code})
    assert result["exit_code"] == -1 and result["truncated"] is True
    assert "error: output limit exceeded" in result["error"]
    assert set(result["stdout"]) <= {"é"} and len(result["stdout"]) > 500_000


def test_the_next_invocation_after_a_cut_result_is_fine(python_function):
    result_of(python_function, {"language": "python3", "code": "print('x' * 5_000_000)"})
    assert result_of(python_function, {"language": "python3", "code": "print(7)"})["stdout"] == "7\n"


def test_probe_returns_the_protections_record(functions):
    for language, function in functions.items():
        probe = result_of(function, {"action": "probe"})
        assert probe["language"] == language
        assert set(probe["platform"]) >= {"seccomp", "no_new_privs", "dumpable", "setuid", "chroot", "writable"}
        assert probe["platform"]["euid"] == os.geteuid()
        assert probe["one_run_at_a_time"] is True


def test_dependencies_lists_the_baked_layer(python_function):
    names = {d["name"].lower() for d in result_of(python_function, {"action": "dependencies"})["dependencies"]}
    assert {"requests", "httpx", "jinja2"} <= names


def test_bad_requests_are_function_errors_saying_what_is_wrong(python_function):
    error = error_of(python_function, {"language": "python3"})
    assert error["errorType"] == "InvalidRequest" and "code" in error["errorMessage"]
    error = error_of(python_function, {"language": "nodejs", "code": "1"})
    assert error["errorType"] == "InvalidRequest" and "python3" in error["errorMessage"]
    error = error_of(python_function, {"action": "nothing"})
    assert error["errorType"] == "InvalidRequest"
    error = error_of(python_function, ["not", "a", "request"])
    assert error["errorType"] == "InvalidRequest"


def test_network_rule_is_checked_in_the_runtime_too(tmp_path):
    function = start_function("python3", ENABLE_NETWORK="false")
    try:
        error = error_of(function, {"language": "python3", "code": "print(1)", "enable_network": True})
        assert error["errorType"] == "InvalidRequest" and "network is disabled" in error["errorMessage"]
        assert result_of(function, {"language": "python3", "code": "print(1)"})["stdout"] == "1\n"
    finally:
        function.stop()


def test_init_failure_goes_to_the_init_error_endpoint():
    function = start_function("nodejs", NODEJS_PATH="/nonexistent/node")
    try:
        function.process.wait(30)
        error = function.api.init_error
        assert error is not None, function.output()
        assert "node is not installed at /nonexistent/node" in error["errorMessage"]
        assert "image must install it" in error["errorMessage"]
    finally:
        function.stop()


def test_init_failure_names_a_bad_setting():
    function = start_function("python3", SANDLOT_MAX_TIMEOUT="soon")
    try:
        function.process.wait(30)
        assert "SANDLOT_MAX_TIMEOUT" in function.api.init_error["errorMessage"]
    finally:
        function.stop()


SECRET_HUNT = r"""
import os
secrets = [s[::-1] for s in SECRETS]  # the event carries them reversed: only this process holds them forwards
found = []
def look(where, data):
    for s in secrets:
        if s.encode() in data:
            found.append(where)
look("os.environ", "\n".join(f"{k}={v}" for k, v in os.environ.items()).encode())
pids = [p for p in os.listdir("/proc") if p.isdigit()] if os.path.isdir("/proc") else []
for pid in pids:
    if pid == str(os.getpid()):
        continue
    try:
        look(f"/proc/{pid}/environ", open(f"/proc/{pid}/environ", "rb").read())
    except OSError:
        pass
    try:
        maps = open(f"/proc/{pid}/maps").read().splitlines()
        mem = open(f"/proc/{pid}/mem", "rb")
        for line in maps:
            if "rw" not in line.split()[1]:
                continue
            start, end = (int(x, 16) for x in line.split()[0].split("-"))
            try:
                mem.seek(start)
                look(f"/proc/{pid}/mem", mem.read(min(end - start, 64 << 20)))
            except (OSError, ValueError, OverflowError):
                pass
    except OSError:
        pass
print("searched", len(pids), "processes")
print("FOUND" if found else "clean", sorted(set(found)))
"""


def test_no_run_can_print_the_credentials(functions):
    code = SECRET_HUNT.replace("SECRETS", repr([s[::-1] for s in FAKE_CREDENTIALS.values()]))
    result = result_of(functions["python3"], {"language": "python3", "code": code})
    for secret in FAKE_CREDENTIALS.values():
        assert secret not in json.dumps(result)
    assert "clean" in result["stdout"], result
    # and the runtime client itself no longer holds them where a same-uid process could read them
    for function in functions.values():
        with open(f"/proc/{function.process.pid}/environ", "rb") as f:
            environ = f.read()
        for secret in FAKE_CREDENTIALS.values():
            assert secret.encode() not in environ


def runtime_api_calls(address: str) -> str:
    """A run that asks the Runtime API for the next event and posts a forged response."""
    return f"""
import urllib.request
for method, path, body in (("GET", "/2018-06-01/runtime/invocation/next", None),
                           ("POST", "/2018-06-01/runtime/invocation/forged/response", b'{{"stdout": "forged"}}')):
    try:
        with urllib.request.urlopen(urllib.request.Request("http://{address}" + path, data=body, method=method),
                                    timeout=3) as r:
            print("GOT", r.status, r.read()[:200])
    except Exception as exc:
        print("refused", type(exc).__name__, str(exc)[:100])
"""


def test_a_run_gets_nothing_usable_from_the_runtime_api(python_function):
    code = runtime_api_calls(python_function.api.address)
    result = result_of(python_function, {"language": "python3", "code": code, "enable_network": True})
    assert "GOT" not in result["stdout"], result
    assert "forged" not in result["stdout"]
    assert result_of(python_function, {"language": "python3", "code": "print(5)"})["stdout"] == "5\n"


def test_what_a_run_leaves_behind_is_gone_for_the_next(python_function):
    leave = """
import os, time
for place in ("/tmp", os.environ.get("TMPDIR", "/tmp")):
    try:
        open(os.path.join(place, "left-behind"), "w").write("x")
    except OSError as exc:
        print("no write", exc)
try:
    if os.fork() == 0:
        time.sleep(60)
        os._exit(0)
    print("forked")
except OSError as exc:
    print("no fork", exc)
"""
    result_of(python_function, {"language": "python3", "code": leave})
    look = """
import os
print(sorted(set(os.listdir("/tmp")) | set(os.listdir(os.environ.get("TMPDIR", "/tmp")))))
"""
    result = result_of(python_function, {"language": "python3", "code": look})
    assert "left-behind" not in result["stdout"], result


def test_a_timed_out_function_is_restarted_and_serves_again():
    function = start_function("python3", timeout=3, SANDLOT_MAX_TIMEOUT="60")
    try:
        invocation = function.invoke({"language": "python3", "code": "import time; time.sleep(30)", "timeout": 30})
        # the runtime keeps a margin from Lambda's deadline: the run itself times out and says so
        assert invocation.kind == "response", invocation.body
        assert "error: timeout" in invocation.json()["error"]
        assert result_of(function, {"language": "python3", "code": "print(2)"})["stdout"] == "2\n"
    finally:
        function.stop()


def _claims(holder: int) -> tuple[set[str], str]:
    """The uid blocks process `holder` holds (lock files under its flock, /proc/locks: other instances,
    other test sessions' among them, may claim and free blocks meanwhile) and the egress tables."""
    with open("/proc/locks") as f:
        locked = {
            int(fields[5].rsplit(":", 1)[1])
            for fields in (line.split() for line in f)
            if fields[1] == "FLOCK" and fields[4] == str(holder)
        }
    blocks = set()
    for name in os.listdir("/run/sandlot") if os.path.isdir("/run/sandlot") else ():
        try:
            if os.stat(os.path.join("/run/sandlot", name)).st_ino in locked:
                blocks.add(name)
        except FileNotFoundError:
            pass
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    return blocks, tables


def test_sigterm_stops_the_runtime_and_leaves_nothing_behind():
    """Lambda ends an instance with SIGTERM: the function stops its runtime first, so that its zygote and
    children go, and as root its uid block and egress rules too (awslambdaric's main thread sits in C
    waiting for the next invocation: the signal must still be acted on)."""
    function = start_function("python3", SANDLOT_DATA_DIR="")  # its data dir: one of its own in its TMPDIR
    try:
        assert result_of(function, {"language": "python3", "code": "print(1)"})["stdout"] == "1\n"
        assert [n for n in os.listdir(function.tmp) if n.startswith("sandlot-data-")], os.listdir(function.tmp)
        blocks, tables = _claims(function.process.pid)
        (ours,) = blocks
        first = ours.removeprefix("uids-").removesuffix(".lock")
        assert f"sandlot_{first}" in tables
        below = descendants(function.process.pid)
        assert len(below) >= 2, below  # its zygote and the child prepared for the next run
        function.process.send_signal(signal.SIGTERM)
        assert function.process.wait(10) == 0, function.output()[-2000:]
        assert "SIGTERM: stopping the python3 runtime" in function.output()
        assert wait_for(lambda: not any(os.path.exists(f"/proc/{p}") for p in below), 10)
        blocks, tables = _claims(function.process.pid)
        assert ours not in blocks and f"sandlot_{first}" not in tables
        assert not os.path.exists(os.path.join("/run/sandlot", ours))
        assert [n for n in os.listdir(function.tmp) if n.startswith("sandlot-")] == []
    finally:
        function.stop()
