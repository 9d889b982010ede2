"""The checks of infra/sam_local_test.sh against SAM local (run with the SAM venv's Python: boto3 is there).

One line per check, `PASS name: detail` or `FAIL name: detail`; the script counts them.

    checks.py invoke LANGUAGE|probe OUTPUT_FILE      `sam local invoke`'s answer, saved by the script
    checks.py lambda URL MODE                         boto3 direct invokes of start-lambda, with TenantId
    checks.py api URL KEY MODE                        Dify-format requests to start-api (in front of start-lambda)

MODE is the --warm-containers mode (EAGER, LAZY) or `none` (a new container for every invocation).
"""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request

RESULT = ("stdout", "stderr", "error", "exit_code", "truncated", "outcome")  # duration: any number
OUTPUT_LIMIT = 4 * 1024 * 1024  # the runtime functions' default SANDLOT_OUTPUT_LIMIT_BYTES

DIFY_PYTHON = (  # Dify's Python Code node wrapper (tests/cases/run_cases.json: py-dify-template)
    "def main(arg1: str, arg2: str) -> dict:\n"
    '    return {"result": arg1 + arg2}\n\n'
    "import json\nfrom base64 import b64decode\n\n"
    "inputs_obj = json.loads(b64decode('eyJhcmcxIjogIkhlbGxvIiwgImFyZzIiOiAiV29ybGQifQ==').decode('utf-8'))\n"
    "output_obj = main(**inputs_obj)\n"
    "output_json = json.dumps(output_obj, indent=4)\n"
    "result = f'''<<RESULT>>{output_json}<<RESULT>>'''\n"
    "print(result)\n"
)
DIFY_PYTHON_STDOUT = '<<RESULT>>{\n    "result": "HelloWorld"\n}<<RESULT>>\n'
DIFY_NODEJS = (  # Dify's JavaScript Code node wrapper (js-template)
    "// declare main function\nfunction main({a}) {\n\treturn {b: a}\n}\n\n"
    "// decode and prepare input object\n"
    "var inputs_obj = JSON.parse(Buffer.from('eyJhIjoiYSJ9', 'base64').toString('utf-8'))\n\n"
    "// execute main function\nvar output_obj = main(inputs_obj)\n\n"
    "// convert output to json and print\nvar output_json = JSON.stringify(output_obj)\n"
    "var result = `<<RESULT>>${output_json}<<RESULT>>`\nconsole.log(result)"
)
DIFY_NODEJS_STDOUT = '<<RESULT>>{"b":"a"}<<RESULT>>\n'

failures = 0


def report(ok: bool, name: str, detail: str) -> None:
    global failures
    failures += not ok
    print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)


def short(value: object, limit: int = 300) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


def ok_result(stdout: str) -> dict:
    return {"stdout": stdout, "stderr": "", "error": "", "exit_code": 0, "truncated": False, "outcome": "ok"}


def result_is(result: object, expected: dict) -> tuple[bool, str]:
    """The run result equals `expected` field by field (every field of RESULT; duration a number)."""
    if not isinstance(result, dict):
        return False, f"not a run result: {short(result)}"
    got = {key: result.get(key) for key in RESULT}
    extra = set(result) - set(RESULT) - {"duration"}
    if got != expected or extra or not isinstance(result.get("duration"), (int, float)):
        return False, f"got {short(result)}, expected {short(expected)}"
    return True, f"stdout {result['stdout']!r}"


def envelope_is(envelope: object, expected: dict) -> tuple[bool, str]:
    """dify-sandbox's success envelope around exactly this run result."""
    if not isinstance(envelope, dict) or {k: envelope.get(k) for k in ("code", "message")} != {
        "code": 0,
        "message": "success",
    }:
        return False, f"not the success envelope: {short(envelope)}"
    if set(envelope) != {"code", "message", "data"}:
        return False, f"extra keys in the envelope: {sorted(envelope)}"
    return result_is(envelope["data"], expected)


# ---- sam local invoke ---------------------------------------------------------------------------------------


def check_invoke(what: str, path: str) -> None:
    with open(path) as f:
        text = f.read().strip()
    try:
        answer = json.loads(text.splitlines()[-1]) if text else None
    except ValueError:
        answer = None
    if what == "probe":
        ok = isinstance(answer, dict) and bool(answer)
        mode = mode_of(answer)
        protections = answer.get("protections", {}) if ok else {}
        facts = {k: protections.get(k) for k in ("own_uid", "seccomp", "landlock", "network", "processes_ended_by")}
        facts["euid"] = (answer.get("platform", {}) if ok else {}).get("euid")
        report(ok and mode is not None, "invoke probe (PythonFunction)", f"jail mode {mode}, {facts}")
        return
    expected = ok_result("2\n")  # infra/events/runtime-*-run.json: 1 + 1
    ok, detail = result_is(answer, expected)
    function = {"python3": "PythonFunction", "nodejs": "NodeFunction"}[what]
    report(ok, f"invoke {function} ({what} event)", detail)


def mode_of(probe: object) -> str | None:
    """The jail mode a probe record reports."""
    if not isinstance(probe, dict):
        return None
    for key in ("mode", "jail_mode"):
        if isinstance(probe.get(key), str):
            return probe[key]
    for value in probe.values():
        found = mode_of(value) if isinstance(value, dict) else None
        if found:
            return found
    return None


# ---- sam local start-lambda: boto3 direct invokes --------------------------------------------------------------


def lambda_client(url: str):
    import boto3
    from botocore.config import Config

    return boto3.client(
        "lambda",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="sam-local",
        aws_secret_access_key="sam-local",  # noqa: S106 - start-lambda checks no signature
        config=Config(read_timeout=180, connect_timeout=10, retries={"total_max_attempts": 1}),
    )


def invoke(client, function: str, event: dict, tenant: str | None) -> tuple[dict | None, object, float]:
    """(the invoke's answer less its payload, the decoded payload, seconds)"""
    kwargs = {"FunctionName": function, "Payload": json.dumps(event).encode()}
    if tenant is not None:
        kwargs["TenantId"] = tenant
    begin = time.monotonic()
    response = client.invoke(**kwargs)
    elapsed = time.monotonic() - begin
    raw = response["Payload"].read()
    try:
        payload = json.loads(raw)
    except ValueError:
        payload = raw.decode(errors="replace")
    return response, payload, elapsed


def check_lambda(url: str, mode: str) -> None:
    from botocore.exceptions import ClientError

    client = lambda_client(url)
    warm = mode != "none"
    for function, language, code in (
        ("PythonFunction", "python3", "print(6 * 7)"),
        ("NodeFunction", "nodejs", "console.log(6 * 7)"),
    ):
        event = {"language": language, "code": code, "enable_network": False}
        times = []
        for attempt in ("first", "again"):
            try:
                response, payload, elapsed = invoke(client, function, event, "tenant-a")
            except ClientError as exc:
                report(False, f"start-lambda {function} TenantId tenant-a ({attempt}, {mode})", str(exc))
                break
            times.append(elapsed)
            ok, detail = result_is(payload, ok_result("42\n"))
            ok = ok and "FunctionError" not in response
            report(ok, f"start-lambda {function} TenantId tenant-a ({attempt}, {mode})", f"{detail} in {elapsed:.2f} s")
        # another tenant: a warm container already serves tenant-a and must refuse; a cold one is tenant-b's own
        name = f"start-lambda {function} TenantId tenant-b after tenant-a ({mode})"
        try:
            response, payload, elapsed = invoke(client, function, event, "tenant-b")
        except ClientError as exc:
            report(False, name, str(exc))
            continue
        if warm:
            message = payload.get("errorMessage", "") if isinstance(payload, dict) else ""
            # Lambda marks a function error with X-Amz-Function-Error; SAM 1.170 only where the payload's keys are
            # errorMessage, errorType and stackTrace (or cause), and awslambdaric's carry requestId too: none here
            ok = (
                response.get("FunctionError") in ("Unhandled", None)
                and isinstance(payload, dict)
                and payload.get("errorType") == "TenantRefused"
                and "serves tenant 'tenant-a' only and refuses tenant 'tenant-b'" in message
            )
            header = response.get("FunctionError") or "none"
            reason = payload.get("errorMessage") if isinstance(payload, dict) else payload
            kind = payload.get("errorType") if isinstance(payload, dict) else None
            report(ok, name + " is refused", f"{kind}: {short(reason, 200)} (X-Amz-Function-Error: {header})")
        else:
            ok, detail = result_is(payload, ok_result("42\n"))
            report(ok and "FunctionError" not in response, name + " is served (a new container)", detail)
    # a function deployed PER_TENANT without a tenant id: refused by SAM before any container
    name = f"start-lambda PythonFunction without TenantId ({mode})"
    try:
        response, payload, _ = invoke(client, "PythonFunction", {"action": "probe"}, None)
        report(False, name + " is refused", f"served: {short(payload)}")
    except ClientError as exc:
        report(
            True, name + " is refused", f"{exc.response['Error'].get('Code')}: {exc.response['Error'].get('Message')}"
        )


# ---- sam local start-api: Dify-format requests --------------------------------------------------------------------


def post(url: str, key: str, body: dict, timeout: float = 180) -> tuple[int, bytes, float]:
    request = urllib.request.Request(
        url + "/v1/sandbox/run",
        data=json.dumps(body).encode(),
        headers={"X-Api-Key": key, "Content-Type": "application/json"},
        method="POST",
    )
    begin = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - loopback only
            status, content = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, content = exc.code, exc.read()
    return status, content, time.monotonic() - begin


def check_api(url: str, key: str, mode: str) -> None:
    def run(name: str, body: dict, verdict) -> None:
        try:
            status, content, elapsed = post(url, key, body)
        except OSError as exc:
            report(False, f"start-api {name} ({mode})", f"no answer: {exc}")
            return
        try:
            envelope = json.loads(content)
        except ValueError:
            envelope = content.decode(errors="replace")
        ok, detail = verdict(envelope) if status == 200 else (False, f"HTTP {status}: {short(envelope)}")
        report(ok, f"start-api {name} ({mode})", f"{detail} in {elapsed:.2f} s")

    for attempt in ("first run", "second run"):
        run(
            f"Dify Python wrapper, {attempt}",
            {"language": "python3", "code": DIFY_PYTHON, "preload": "", "enable_network": True},
            lambda e: envelope_is(e, ok_result(DIFY_PYTHON_STDOUT)),
        )
        run(
            f"Dify JavaScript wrapper, {attempt}",
            {"language": "nodejs", "code": DIFY_NODEJS, "preload": "", "enable_network": True},
            lambda e: envelope_is(e, ok_result(DIFY_NODEJS_STDOUT)),
        )

    if mode == "none":
        # a new container for every invocation (two, one for the API and one for the runtime, each cold): the
        # wrappers above show the path; the run outcomes below are the same code's, checked in a warm mode
        wrong_key(url, key, mode)
        return

    def error_run(e):
        data = e.get("data") if isinstance(e, dict) else None
        if not isinstance(data, dict):
            return False, f"no data: {short(e)}"
        stderr = data.get("stderr", "")
        expected = {
            "stdout": "",
            "stderr": stderr,
            "error": f"process exited with code 1\n{stderr}",
            "exit_code": 1,
            "truncated": False,
            "outcome": "error",
        }
        ok, detail = envelope_is(e, expected)
        ok = ok and stderr.rstrip().endswith("ValueError: bad input")
        return ok, detail if not ok else f"stderr ends {stderr.rstrip().splitlines()[-1]!r}"

    run("an error", {"language": "python3", "code": 'raise ValueError("bad input")\n'}, error_run)

    def timeout_run(e):
        expected = {
            "stdout": "",
            "stderr": "",
            "error": "process exited with code -1\nerror: timeout\n",
            "exit_code": -1,
            "truncated": False,
            "outcome": "timeout",
        }
        return envelope_is(e, expected)

    run("a timeout (1 s)", {"language": "python3", "code": "while True:\n    pass\n", "timeout": 1}, timeout_run)

    def cap_run(e):
        data = e.get("data") if isinstance(e, dict) else None
        if not isinstance(data, dict):
            return False, f"no data: {short(e)}"
        stdout = data.get("stdout", "")
        expected = {
            "stdout": stdout,
            "stderr": "",
            "error": "process exited with code -1\nerror: output limit exceeded\n",
            "exit_code": -1,
            "truncated": True,
            "outcome": "output_limit",
        }
        ok, detail = envelope_is(e, expected)
        ok = ok and 0 < len(stdout) <= OUTPUT_LIMIT and set(stdout) <= {"x"}
        return ok, f"{len(stdout)} bytes of stdout kept" if ok else detail[:300]

    run("an output cap (5 MiB printed)", {"language": "python3", "code": "print('x' * (5 << 20))\n"}, cap_run)

    def refused_run(e):
        data = e.get("data") if isinstance(e, dict) else None
        if not isinstance(data, dict):
            return False, f"no data: {short(e)}"
        ok = (
            e.get("code") == 0
            and data.get("exit_code") not in (0, None)
            and "operation not permitted" in data.get("error", "").lower()
            and "123" not in data.get("stdout", "")
        )
        error = short(data.get("error"), 160)
        return ok, f"exit_code {data.get('exit_code')}, outcome {data.get('outcome')}, error {error!r}"

    run(
        "a refused syscall (fork)",
        {"language": "python3", "code": "import os\nprint(os.fork())\nprint(123)\n"},
        refused_run,
    )

    wrong_key(url, key, mode)


def wrong_key(url: str, key: str, mode: str) -> None:
    """A wrong key: 401 with an empty body, as dify-sandbox answers (no run)."""
    try:
        status, content, elapsed = post(url, key + "x", {"language": "python3", "code": "print(1)"})
        report(
            status == 401 and content == b"", f"start-api a wrong key ({mode})", f"HTTP {status}, body {content[:80]!r}"
        )
    except OSError as exc:
        report(False, f"start-api a wrong key ({mode})", str(exc))


def main(argv: list[str]) -> int:
    command = argv[1]
    if command == "invoke":
        check_invoke(argv[2], argv[3])
    elif command == "lambda":
        check_lambda(argv[2], argv[3])
    elif command == "api":
        check_api(argv[2], argv[3], argv[4])
    else:
        raise SystemExit(__doc__)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
