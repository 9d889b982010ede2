"""Two versions of the Lambda runtime functions, measured in the same run: before/after rows that load cannot skew.

The machine this runs on is shared, and its load changes by the minute: rows taken minutes apart
compare the load, not the code. So this starts the runtime functions of both checkouts side by side
(as root, full jail; and on the simulated Lambda, a uid each) and invokes them through boto3 (the
LambdaInvoker's client) and the Invoke API emulation in blocks of back-to-back requests, round-robin
with the local service of this checkout, so that every row sees the same load.

    git archive <commit> | tar -x -C /tmp/sandlot-base       # the other version
    python bench/lambda_ab.py --base /tmp/sandlot-base [--language python3] [--blocks 12] [--block 10]
                              [--gap 0.1] [--no-simulated]

`--gap` pauses between requests (paced: the next child is ready when a request comes); without it,
requests follow each other at once (back to back).
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests"))
sys.path.insert(0, os.path.join(REPO, "tests", "lambda"))

from emulation import FunctionInstance, InvokeAPI  # noqa: E402
from functions import HANDLERS, boto_environment, function_env  # noqa: E402
from service import API_KEY, Service  # noqa: E402

WORKLOADS = {"python3": 'print("hi")', "nodejs": 'console.log("hi")'}


def root_function(language: str, checkout: str) -> FunctionInstance:
    os.makedirs(function_env(language)["SANDLOT_DATA_DIR"], exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="sandlot-fn-")
    env = function_env(language, TMPDIR=tmp, PYTHONPATH=checkout)
    instance = FunctionInstance(HANDLERS[language], env, name=f"ab-{language}", cwd=checkout)
    instance.tmp = tmp
    return instance.start()


def simulated_function(language: str, checkout: str, uid: int) -> FunctionInstance:
    """On a copy of the simulated image of its own, with that checkout's code installed."""
    from simulated import lay_out_image, start_simulated

    image = lay_out_image()
    if checkout != REPO:
        copy = f"{image}-ab-{hashlib.sha256(os.path.realpath(checkout).encode()).hexdigest()[:12]}"
        if not os.path.isdir(copy):
            shutil.copytree(image, copy, symlinks=True)
        image = copy
        subprocess.run([os.path.join(checkout, "infra", "layout.sh"), image, "--project-only"], check=True)
    return start_simulated(image, language, uid=uid, SANDLOT_REQUIRE_SECCOMP="false")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", required=True, help="a checkout of the version to compare with")
    parser.add_argument("--language", default="python3", choices=sorted(WORKLOADS))
    parser.add_argument("--blocks", type=int, default=12)
    parser.add_argument("--block", type=int, default=10, help="back-to-back requests per block")
    parser.add_argument("--gap", type=float, default=0.0, help="seconds between requests")
    parser.add_argument("--no-simulated", action="store_true")
    args = parser.parse_args()
    language, base = args.language, os.path.realpath(args.base)

    from simulated import SIM_UID

    from handler.lambda_invoker import LambdaInvoker

    functions = {"base, root": root_function(language, base), "this, root": root_function(language, REPO)}
    if not args.no_simulated and os.geteuid() == 0:
        functions["base, simulated Lambda"] = simulated_function(language, base, SIM_UID + 20)
        functions["this, simulated Lambda"] = simulated_function(language, REPO, SIM_UID + 21)
    invoke_api = InvokeAPI()
    names = {}
    for number, (label, instance) in enumerate(functions.items()):
        assert instance.ready, instance.output()
        names[label] = f"ab-{number}"
        invoke_api.add(names[label], [instance])
    os.environ.update({k: v for k, v in boto_environment(invoke_api).items() if k.startswith("AWS_")})
    client = LambdaInvoker({}, function_timeout=30).client
    payload = json.dumps({"language": language, "code": WORKLOADS[language], "enable_network": True})
    local = Service().start()

    def local_run(connection: http.client.HTTPConnection) -> None:
        headers = {"X-Api-Key": API_KEY, "Content-Type": "application/json"}
        connection.request("POST", "/v1/sandbox/run", payload.encode(), headers)
        answer = json.loads(connection.getresponse().read())
        assert answer["code"] == 0, answer

    def invoke(name: str) -> None:
        response = client.invoke(FunctionName=name, InvocationType="RequestResponse", Payload=payload)
        result = json.loads(response["Payload"].read())
        assert "FunctionError" not in response and result["exit_code"] == 0, result

    rows = ["local service, HTTP", *(f"{label}, boto3" for label in functions)]
    times: dict[str, list[float]] = {row: [] for row in rows}
    try:
        for _ in range(args.blocks):
            for row in rows:
                connection = http.client.HTTPConnection("127.0.0.1", local.port)  # idle ones get closed
                label = row.removesuffix(", boto3")
                for i in range(args.block + 1):  # the first of a block is a warm-up
                    started = time.perf_counter()
                    if row == rows[0]:
                        local_run(connection)
                    else:
                        invoke(names[label])
                    if i:
                        times[row].append(time.perf_counter() - started)
                    if args.gap:
                        time.sleep(args.gap)
                connection.close()
    finally:
        local.stop()
        invoke_api.close()
        for instance in functions.values():
            instance.stop()

    local_p50 = statistics.median(times[rows[0]])
    pace = f"{args.gap:g} s apart" if args.gap else "back to back"
    print(f"\n{language}, {pace}, {args.blocks} blocks of {args.block}; base = {base}")
    print(f"{'row':40} {'p50 ms':>8} {'p95 ms':>8} {'over local':>11} {'this/base':>10}")
    for row in rows:
        p50 = statistics.median(times[row])
        p95 = sorted(times[row])[int(0.95 * len(times[row]))]
        ratio = ""
        if row.startswith("this, "):
            ratio = f"{p50 / statistics.median(times[row.replace('this, ', 'base, ')]):.2f}"
        print(f"{row:40} {p50 * 1000:8.2f} {p95 * 1000:8.2f} {(p50 - local_p50) * 1000:+11.2f} {ratio:>10}")


if __name__ == "__main__":
    main()
