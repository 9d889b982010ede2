"""What a warm invocation costs inside a runtime function, over the local service's own run path.

Both sides are the same `JailedRuntime.run`; they differ in the schedule. The local service's (pooled)
answers on the run's exit report and gives the child back in the background; a runtime function's
(serial) answers once nothing of the run can execute again (kill, then every thread in exit). This
measures, in the same run and in alternating blocks so that this shared machine's load weighs on both:

- `local run path`: `JailedRuntime.run` with the pooled schedule, in this process, as the service
  calls it (no HTTP);
- `handler, <where>`: the runtime function's handler, from the event handed to it to the result
  returned, timed inside the function process by a wrapper (bench/timed_handler.py), as root (full jail)
  and on the simulated Lambda (unprivileged uid, no seccomp, the uid sweep after every run);
- `invoke, <where>`: the same invocation as a caller sees it through boto3, the Invoke API emulation and
  awslambdaric: test infrastructure, shown without a target.

    python bench/lambda_overhead.py [--language python3] [--blocks 10] [--block 20] [--gap 0.1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path[:0] = [REPO, os.path.join(REPO, "tests"), os.path.join(REPO, "tests", "lambda")]

from emulation import FunctionInstance, InvokeAPI  # noqa: E402
from functions import boto_environment, function_env  # noqa: E402

WORKLOADS = {"python3": 'print("hi")', "nodejs": 'console.log("hi")'}
MODULES = {"python3": "python", "nodejs": "nodejs"}


def root_function(language: str) -> FunctionInstance:
    import tempfile

    os.makedirs(function_env(language)["SANDLOT_DATA_DIR"], exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="sandlot-fn-")
    env = function_env(language, TMPDIR=tmp, PYTHONPATH=f"{REPO}:{HERE}", SANDLOT_TIMED_LANGUAGE=MODULES[language])
    instance = FunctionInstance("timed_handler.handler", env, name=f"overhead-{language}", cwd=REPO)
    instance.tmp = tmp
    return instance.start()


def simulated_function(language: str, uid: int) -> FunctionInstance:
    from simulated import lay_out_image, start_simulated

    instance = start_simulated(
        lay_out_image(),
        language,
        uid=uid,
        SANDLOT_REQUIRE_SECCOMP="false",
        PYTHONPATH=HERE,
        SANDLOT_TIMED_LANGUAGE=MODULES[language],
    )
    instance.handler = "timed_handler.handler"  # the same instance, restarted on the timed handler
    instance.stop(for_good=False)
    return instance.start()


class LocalRunPath:
    """The service's runtime for the language, in this process, on its own event loop."""

    def __init__(self, language: str):
        from handler.cli import layer_manager
        from handler.settings import load_settings
        from runtimes.nodejs.runtime import NodeRuntime
        from runtimes.python.runtime import PythonRuntime

        settings = load_settings()
        layers = layer_manager(settings)
        config = settings.runtime_config(python_layer=layers.ensure("python3"), nodejs_layer=layers.ensure("nodejs"))
        self.runtime = {"python3": PythonRuntime, "nodejs": NodeRuntime}[language](config)
        self.loop = asyncio.new_event_loop()
        self.loop.run_until_complete(self.runtime.start())
        deadline = time.monotonic() + 60
        while not self.runtime.ready and time.monotonic() < deadline:  # a server's preloaded zygote takes over
            self.loop.run_until_complete(asyncio.sleep(0.05))
        assert self.runtime.ready, self.runtime.error

    def run(self, request) -> float:
        async def timed() -> float:
            started = time.perf_counter()
            result = await self.runtime.run(request)
            elapsed = time.perf_counter() - started
            assert result.exit_code == 0, result
            return elapsed

        return self.loop.run_until_complete(timed())

    def stop(self) -> None:
        self.loop.run_until_complete(self.runtime.stop())
        self.loop.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--language", default="python3", choices=sorted(WORKLOADS))
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--block", type=int, default=20, help="requests per block")
    parser.add_argument("--gap", type=float, default=0.1, help="seconds between requests (the next child is ready)")
    parser.add_argument("--no-simulated", action="store_true")
    args = parser.parse_args()
    language = args.language

    from handler.lambda_invoker import LambdaInvoker
    from runtimes.payload import RunRequest

    functions = {"root": root_function(language)}
    if not args.no_simulated:
        from simulated import SIM_UID

        functions["simulated Lambda"] = simulated_function(language, SIM_UID + 30)
    invoke_api = InvokeAPI()
    for where, instance in functions.items():
        assert instance.ready, instance.output()
        invoke_api.add(f"overhead-{where.replace(' ', '-')}", [instance])
    os.environ.update({k: v for k, v in boto_environment(invoke_api).items() if k.startswith("AWS_")})
    client = LambdaInvoker({}, function_timeout=30).client
    event = {"language": language, "code": WORKLOADS[language], "enable_network": True}
    request = RunRequest(**event)
    local = LocalRunPath(language)

    times: dict[str, list[float]] = {"local run path": []}
    for where in functions:
        times[f"handler, {where}"] = []
        times[f"invoke, {where}"] = []
    try:
        for _ in range(args.blocks):
            for i in range(args.block + 1):  # the first of a block is a warm-up
                elapsed = local.run(request)
                if i:
                    times["local run path"].append(elapsed)
                time.sleep(args.gap)
            for where in functions:
                name = f"overhead-{where.replace(' ', '-')}"
                for i in range(args.block + 1):
                    started = time.perf_counter()
                    response = client.invoke(FunctionName=name, Payload=json.dumps(event))
                    elapsed = time.perf_counter() - started
                    result = json.loads(response["Payload"].read())
                    assert "FunctionError" not in response and result["exit_code"] == 0, result
                    if i:
                        times[f"handler, {where}"].append(result["handler_seconds"])
                        times[f"invoke, {where}"].append(elapsed)
                    time.sleep(args.gap)
    finally:
        local.stop()
        invoke_api.close()
        for instance in functions.values():
            instance.stop()

    local_p50 = statistics.median(times["local run path"])
    print(f"\n{language}, {args.gap:g} s apart, {args.blocks} blocks of {args.block}; load {os.getloadavg()[0]:.2f}")
    print(f"{'row':32} {'p50 ms':>8} {'p90 ms':>8} {'over local p50':>15}")
    for row, values in times.items():
        p50 = statistics.median(values)
        p90 = sorted(values)[int(0.9 * len(values))]
        print(f"{row:32} {p50 * 1000:8.2f} {p90 * 1000:8.2f} {(p50 - local_p50) * 1000:+15.2f}")


if __name__ == "__main__":
    main()
