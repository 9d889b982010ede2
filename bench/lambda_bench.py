"""Sandlot on Lambda, emulated: cold init of the runtime functions and warm invoke latency, next to the local backend.

Rows (one table, all from the same run on this machine; read ratios, not absolutes):
- cold init: process start to the first `/next` (awslambdaric started, credentials dropped, platform
  probed, zygote up, first child prepared), and the function's own "ready in" (runtime start to the
  first ready child) from its log; as root (full jail) and on the simulated Lambda (unprivileged uid,
  outer filter, RequireSeccomp false: no seccomp there);
- warm invoke p50/p95: boto3 (the LambdaInvoker's own client) -> Invoke API emulation -> awslambdaric ->
  runtime function, and straight through the Runtime API (no boto3), next to the local service's p50
  (HTTP) for the same code; the whole path `sandlot serve` (lambda backend) over HTTP; and the simulated
  Lambda's runtime function (where runs share the runtime's uid, the next child is prepared only once a
  run's result is posted) straight through the Runtime API and through boto3;
- each of these back to back (the next request as soon as the answer is in) and paced (`--pace`, 10 a
  second by default, as bench/bench.py paces Node): back to back, a Node run also waits for the start of
  its node process, which may only begin once the previous run's result is posted (a node process is
  exec'ed for every run); paced, the next child is ready when the request comes;
- per-run tenancy (SANDLOT_LAMBDA_TENANCY=per-run): boto3 invokes, each with a fresh tenant id, of the
  simulated Lambda's function deployed PER_TENANT (RequireSeccomp true, seccomp refused: tenancy is what
  serves), so that each invoke waits for a fresh environment's init; with where that init's time goes
  (medians): the process up to the runtime function's init (interpreter, awslambdaric and the project's
  imports, the re-exec without credentials), and of it the handler module's own imports where the function
  says (the rest: the interpreter, the early hook, awslambdaric, the settings), the platform probe, the
  runtime's start (its zygote, started ahead where the function says so, the first child), and what is left to
  the first /next; and the run itself after it. Next to them, the floor: a bare
  awslambdaric function (`def handler(e, c): return "hello"`) on the same simulation (interpreter, uid, outer
  filter, environment), invoked the same way, each per-run row read as its difference and ratio to the floor
  (issue 31's targets: Python p50 <= floor + 120 ms, Node <= floor + 250 ms, p95 <= 1.5 x p50);
- header: tenancy (SANDLOT_LAMBDA_TENANCY=header:X-Sandlot-Tenant): `sandlot serve` over HTTP, each request
  naming a new tenant, so each is that tenant's first run in a fresh environment.

The floor is started exactly as the runtime functions are (simulated.start_floor): through the images'
ENTRYPOINT (env(1) dropping the role's credentials before the interpreter starts), on the same interpreter, so
that it pays no re-exec of the venv's early hook, as a bare function on Lambda pays none.

Each row says the machine's load (1-minute average, lowest and highest seen) while its block ran; a block that
ran above a load of 1.5 is marked (!) and a warning follows the table: the machine was shared, read the rows
of one block as ratios to each other, not as absolutes.

    python bench/lambda_bench.py [--requests 200] [--paced-requests 50] [--pace 10] [--inits 3]
                                 [--per-run 10] [--header 5] [--no-simulated] [--per-run-only] [--base REF]

--base REF: the per-run rows of REF's runtime functions too (e.g. main), in the same run, interleaved with
the others (a copy of the simulated image with REF's code, started as REF's images were).

The simulated image (/var/tmp/sandlot-lambda-image-<key>) is shared by every checkout, each laying its own code into
it: beside other worktrees, SANDLOT_LAMBDA_IMAGE=/var/tmp/<a dir of yours> runs on a copy of this checkout's own
(tests/lambda/simulated.py's lay_out_image), and REF's copy is made from it.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "lambda"))

from emulation import InvokeAPI  # noqa: E402
from functions import boto_environment, start_function  # noqa: E402
from service import API_KEY, Service  # noqa: E402

WORKLOADS = {"python3": 'print("hi")', "nodejs": 'console.log("hi")'}
# issue 31: per-run cold invoke p50 at most this much over the floor's (seconds)
PER_RUN_TARGETS = {"python3": 0.120, "nodejs": 0.250}
LOAD_WARNING = 1.5  # above this 1-minute load average a block's absolutes say more about the machine than the code
READY = re.compile(r"ready in ([0-9.]+) s")
INIT = re.compile(
    r"ready in ([0-9.]+) s .*?; init ([0-9.na]+) s since the process started \(platform probe ([0-9.]+) s"
    r"(?: waited for; the function's imports ([0-9.na]+) s; zygote started ahead: (\w+))?"
)


class Load:
    """The machine's 1-minute load average while a block runs: sampled at its start, by the block, and at its end."""

    def __init__(self):
        self.samples = [os.getloadavg()[0]]

    def sample(self) -> None:
        self.samples.append(os.getloadavg()[0])

    @property
    def high(self) -> float:
        return max(self.samples)

    def __str__(self) -> str:
        low, high = min(self.samples), self.high
        return f"{low:.1f}-{high:.1f}" + (" (!)" if high > LOAD_WARNING else "")


class CpuCount:
    """The CPU time of the processes started under it (a cgroup v1 cpuacct group of its own): what an
    environment's init costs in work, which the machine's load does not change as it changes wall time. None
    where no such group can be made (no cgroup v1 cpuacct, not root)."""

    ROOT = "/sys/fs/cgroup/cpuacct"

    def __init__(self, name: str):
        self.path = os.path.join(self.ROOT, f"sandlot-bench-{os.getpid()}-{name.replace('@', '-')}")
        try:
            os.makedirs(self.path, exist_ok=True)
            self.usage()
        except OSError:
            self.path = ""
        else:
            import atexit

            atexit.register(self.close)  # once the environments in it are stopped (main's finally)

    @property
    def wrap(self) -> tuple[str, ...]:
        """A command that moves itself into the group, then execs the rest."""
        if not self.path:
            return ()
        return ("/bin/sh", "-c", 'echo $$ >"$0/cgroup.procs" && exec "$@"', self.path)

    def usage(self) -> float:
        """Seconds of CPU used by the group's processes so far."""
        with open(os.path.join(self.path, "cpuacct.usage")) as f:
            return int(f.read()) / 1e9

    def close(self) -> None:
        if self.path:
            try:
                os.rmdir(self.path)  # its processes gone (the environments stopped)
            except OSError:
                pass


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ms(value: float) -> str:
    return f"{value * 1000:8.2f}"


def cold_inits(language: str, count: int, simulated_image: str | None, load: Load) -> tuple[float, float]:
    """Medians of (spawn to first /next, the function's own ready-in)."""
    totals, readies = [], []
    for _ in range(count):
        load.sample()
        if simulated_image:
            from simulated import start_simulated

            instance = start_simulated(simulated_image, language, SANDLOT_REQUIRE_SECCOMP="false")
        else:
            instance = start_function(language)
        try:
            assert instance.ready, instance.output()
            totals.append(instance.init_seconds)
            found = READY.search(instance.output())
            readies.append(float(found.group(1)) if found else float("nan"))
        finally:
            instance.stop()
    return statistics.median(totals), statistics.median(readies)


def pause(interval: float, started: float) -> None:
    """Paced: the next request one interval after the previous one started (at least 1 ms after its answer)."""
    if interval:
        time.sleep(max(0.001, interval - (time.perf_counter() - started)))


def http_latencies(port: int, language: str, total: int, interval: float = 0.0) -> list[float]:
    body = json.dumps({"language": language, "code": WORKLOADS[language], "enable_network": True}).encode()
    headers = {"X-Api-Key": API_KEY, "Content-Type": "application/json"}
    connection = http.client.HTTPConnection("127.0.0.1", port)
    times = []
    for i in range(total + 10):
        started = time.perf_counter()
        connection.request("POST", "/v1/sandbox/run", body, headers)
        answer = json.loads(connection.getresponse().read())
        elapsed = time.perf_counter() - started
        assert answer["code"] == 0 and answer["data"]["exit_code"] == 0, answer
        if i >= 10:  # warm-up
            times.append(elapsed)
        pause(interval, started)
    connection.close()
    return times


def boto_latencies(client, name: str, language: str, total: int, interval: float = 0.0) -> list[float]:
    payload = json.dumps({"language": language, "code": WORKLOADS[language], "enable_network": True})
    times = []
    for i in range(total + 10):
        started = time.perf_counter()
        response = client.invoke(FunctionName=name, InvocationType="RequestResponse", Payload=payload)
        result = json.loads(response["Payload"].read())
        elapsed = time.perf_counter() - started
        assert "FunctionError" not in response and result["exit_code"] == 0, result
        if i >= 10:
            times.append(elapsed)
        pause(interval, started)
    return times


def runtime_api_latencies(instance, language: str, total: int, interval: float = 0.0) -> list[float]:
    event = {"language": language, "code": WORKLOADS[language], "enable_network": True}
    times = []
    for i in range(total + 10):
        started = time.perf_counter()
        invocation = instance.invoke(event)
        elapsed = time.perf_counter() - started
        assert invocation.kind == "response", invocation.body
        if i >= 10:
            times.append(elapsed)
        pause(interval, started)
    return times


def per_run_tenancy(
    invoke_api,
    client,
    image: str,
    languages: tuple[str, ...],
    count: int,
    load: Load,
    base_image: str = "",
    base_entrypoint: bool = False,
) -> tuple[dict[str, list[float]], dict[str, list[dict]]]:
    """Invoke latencies with a fresh tenant id each (a fresh environment's init included), and each init's parts,
    by language; "floor" is the bare awslambdaric function (simulated.start_floor) on the same simulation;
    "<language>@base" the same function from base_image (bench --base: another commit's code, started as
    its images were: through their ENTRYPOINT where it drops the credentials (base_entrypoint), the interpreter
    straight before). Interleaved (a round is one invoke of each), so that the
    machine's load weighs on each row alike."""
    from simulated import tenant_environments

    from handler.tenancy import per_run_id

    inits: dict[str, list[dict]] = {language: [] for language in languages}
    counts = {label: CpuCount(label) for label in languages}

    def recorder(label: str):
        language, _, base = label.partition("@")
        count = counts[label]
        start = tenant_environments(
            base_image if base else image, language, entrypoint=base_entrypoint or not base, wrap=count.wrap
        )

        def recorded(tenant: str):
            used = count.usage() if count.path else 0.0
            instance = start(tenant)
            cpu = {"CPU, spawn to first /next": count.usage() - used} if count.path else {}
            if language == "floor":
                inits[label].append({"spawn to first /next": instance.init_seconds, **cpu})
                return instance
            found = INIT.search(instance.output())
            assert found, instance.output()
            ready, age, probe = (float(v) for v in found.groups()[:3])
            imports = found.group(4)  # None where the function does not say (an older one)
            before = age - ready - probe
            parts = {"spawn to first /next": instance.init_seconds, "process start to init": before}
            if imports is not None:
                parts["  the handler module's imports"] = float(imports)
                parts["  the rest (interpreter, early hook, awslambdaric, settings)"] = before - float(imports)
            parts["platform probe (waited for)"] = probe
            parts["runtime start (first child)"] = ready
            parts["after init to first /next"] = instance.init_seconds - age
            inits[label].append({**parts, **cpu})
            return instance

        return recorded

    payloads = {}
    for language in languages:
        invoke_api.add_per_tenant(f"per-run-{language}", recorder(language), concurrency=1, keep=1)
        plain = language.partition("@")[0]
        event = {"floor": True} if language == "floor" else {"language": plain, "code": WORKLOADS[plain]}
        payloads[language] = json.dumps({**event, "enable_network": True})
    times: dict[str, list[float]] = {language: [] for language in languages}
    for i in range(count + 1):  # the first round: a warm-up (files not yet in the page cache)
        load.sample()
        for language in languages:
            started = time.perf_counter()
            response = client.invoke(
                FunctionName=f"per-run-{language}", Payload=payloads[language], TenantId=per_run_id()
            )
            result = json.loads(response["Payload"].read())
            elapsed = time.perf_counter() - started
            assert "FunctionError" not in response, result
            assert result == "hello" if language == "floor" else result["exit_code"] == 0, result
            for stopping in invoke_api.stopping:  # the environment reclaimed, off the clock: Lambda does it elsewhere
                stopping.join()
            if i:
                times[language].append(elapsed)
    return times, {language: found[1:] for language, found in inits.items()}


def entrypoint_drops_credentials(ref: str) -> bool:
    """Whether `ref`'s images start the interpreter through env(1) dropping the credentials (their ENTRYPOINT)."""
    import subprocess

    from functions import REPO

    shown = subprocess.run(
        ["git", "-C", REPO, "show", f"{ref}:runtimes/python/Dockerfile"], capture_output=True, text=True
    )
    return shown.returncode == 0 and '"/usr/bin/env", "-u", "AWS_ACCESS_KEY_ID"' in shown.stdout


def base_image(image: str, ref: str) -> str:
    """A copy of the simulated image (lay_out_image) with `ref`'s code in its venv, installed by that commit's own
    infra/layout.sh --project-only: the per-run rows of both, interleaved in one run (kept under /var/tmp)."""
    import shutil
    import subprocess
    import tempfile

    from functions import REPO

    sha = subprocess.run(["git", "-C", REPO, "rev-parse", ref], check=True, capture_output=True, text=True)
    root = f"{image}-base-{sha.stdout.strip()[:12]}"
    if not os.path.exists(os.path.join(root, ".complete")):
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(image, root, symlinks=True)
        with tempfile.TemporaryDirectory() as source:
            archive = ["git", "-C", REPO, "archive", sha.stdout.strip()]
            tar = subprocess.run(archive, check=True, capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", source], input=tar, check=True)
            subprocess.run([os.path.join(source, "infra", "layout.sh"), root, "--project-only"], check=True)
        open(os.path.join(root, ".complete"), "w").close()
    return root


def header_tenancy(invoke_api, image: str, language: str, count: int, load: Load) -> list[float]:
    """`sandlot serve` (lambda backend, SANDLOT_LAMBDA_TENANCY=header:X-Sandlot-Tenant) over HTTP, each request
    naming a new tenant in that header: each waits for a fresh environment of that tenant's (its first run)."""
    import uuid

    from simulated import tenant_environments

    name = f"header-{language}"
    invoke_api.add_per_tenant(name, tenant_environments(image, language), concurrency=1, keep=1)
    env = {
        **boto_environment(invoke_api),
        f"SANDLOT_LAMBDA_{'PYTHON3' if language == 'python3' else 'NODEJS'}_FUNCTION": name,
        "SANDLOT_LAMBDA_TENANCY": "header:X-Sandlot-Tenant",
    }
    service = Service(SANDLOT_BACKEND="lambda", **env).start()
    body = json.dumps({"language": language, "code": WORKLOADS[language], "enable_network": True}).encode()
    times = []
    try:
        connection = http.client.HTTPConnection("127.0.0.1", service.port)
        for i in range(count + 1):  # the first: a warm-up (and the API's first probe of the function)
            load.sample()
            headers = {"X-Api-Key": API_KEY, "Content-Type": "application/json", "X-Sandlot-Tenant": uuid.uuid4().hex}
            started = time.perf_counter()
            connection.request("POST", "/v1/sandbox/run", body, headers)
            answer = json.loads(connection.getresponse().read())
            elapsed = time.perf_counter() - started
            assert answer["code"] == 0 and answer["data"]["exit_code"] == 0, answer
            for stopping in invoke_api.stopping:
                stopping.join()
            if i:
                times.append(elapsed)
        connection.close()
    finally:
        service.stop()
    return times


def add_rows(rows: list, language: str, measured: dict[str, tuple[list[float], Load]], base_label: str) -> None:
    base = statistics.median(measured[base_label][0])
    for label, (times, load) in measured.items():
        p50 = statistics.median(times)
        spread = f"{ms(percentile(times, 0.95))} (+{ms(p50 - base)})"
        rows.append((f"{language} {label}", ms(p50), spread, load))


def timed(measure, *args) -> tuple[list[float], Load]:
    """A block's times and the machine's load while it ran."""
    load = Load()
    times = measure(*args)
    load.sample()
    return times, load


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=200, help="back-to-back requests per row")
    parser.add_argument("--paced-requests", type=int, default=50, help="paced requests per row (0: none)")
    parser.add_argument("--pace", type=float, default=10.0, help="requests a second in the paced rows")
    parser.add_argument("--inits", type=int, default=3)
    parser.add_argument("--per-run", type=int, default=10, help="per-run tenancy invokes per language (0: none)")
    parser.add_argument(
        "--header", type=int, default=5, help="header: tenancy requests (a new tenant each) per language (0: none)"
    )
    parser.add_argument("--no-simulated", action="store_true")
    parser.add_argument("--per-run-only", action="store_true", help="only the cold init and per-run tenancy rows")
    parser.add_argument(
        "--base",
        default="",
        metavar="REF",
        help="per-run rows of this commit's runtime functions too, interleaved with the others (e.g. main)",
    )
    args = parser.parse_args()
    languages = ("python3", "nodejs")
    modes = [] if args.per_run_only else [("warm", 0.0, args.requests)]
    if args.paced_requests and not args.per_run_only:
        modes.append((f"paced {args.pace:g}/s", 1.0 / args.pace, args.paced_requests))
    rows: list[tuple[str, str, str, Load]] = []

    for language in languages:
        load = Load()
        total, ready = cold_inits(language, args.inits, None, load)
        load.sample()
        rows.append((f"{language} cold init, root (full jail)", ms(total), ms(ready), load))
    simulated = not args.no_simulated and os.geteuid() == 0
    image = ""
    if simulated:
        from simulated import lay_out_image

        image = lay_out_image()
        for language in languages:
            load = Load()
            total, ready = cold_inits(language, args.inits, image, load)
            load.sample()
            rows.append((f"{language} cold init, simulated Lambda", ms(total), ms(ready), load))

    from handler.lambda_invoker import LambdaInvoker

    instances = {language: start_function(language) for language in languages}
    invoke_api = InvokeAPI()
    for language, instance in instances.items():
        invoke_api.add(f"sandlot-{language}", [instance])  # boto3 straight: no tenant id
        # what `sandlot serve` invokes: deployed PER_TENANT as template.yaml does (auto: one shared, warm id here)
        invoke_api.add_per_tenant(f"tenant-{language}", lambda tenant, language=language: start_function(language))
    sims = {}
    if simulated:
        from simulated import SIM_UID, start_simulated

        for offset, language in enumerate(languages):  # side by side: a uid each (each sweeps its own)
            sims[language] = start_simulated(image, language, uid=SIM_UID + offset, SANDLOT_REQUIRE_SECCOMP="false")
            invoke_api.add(f"sim-{language}", [sims[language]])
    env = {
        **boto_environment(invoke_api),
        "SANDLOT_LAMBDA_PYTHON3_FUNCTION": "tenant-python3",
        "SANDLOT_LAMBDA_NODEJS_FUNCTION": "tenant-nodejs",
    }
    os.environ.update({k: v for k, v in env.items() if k.startswith("AWS_")})
    client = LambdaInvoker({}, function_timeout=30).client  # configured as `sandlot serve` configures it
    local = Service().start() if modes else None
    remote = Service(SANDLOT_BACKEND="lambda", **env).start() if modes else None
    try:
        for label, interval, count in modes:
            for language in languages:
                name = f"sandlot-{language}"
                measured = {
                    f"{label}, local service, HTTP": timed(http_latencies, local.port, language, count, interval),
                    f"{label}, runtime API straight": timed(
                        runtime_api_latencies, instances[language], language, count, interval
                    ),
                    f"{label}, boto3 -> Invoke API -> awslambdaric": timed(
                        boto_latencies, client, name, language, count, interval
                    ),
                    f"{label}, sandlot serve (lambda backend), HTTP": timed(
                        http_latencies, remote.port, language, count, interval
                    ),
                }
                if language in sims:
                    measured[f"{label}, simulated Lambda, runtime API straight"] = timed(
                        runtime_api_latencies, sims[language], language, count, interval
                    )
                    measured[f"{label}, simulated Lambda, boto3"] = timed(
                        boto_latencies, client, f"sim-{language}", language, count, interval
                    )
                add_rows(rows, language, measured, f"{label}, local service, HTTP")
        if simulated and args.per_run:
            based = tuple(f"{language}@base" for language in languages) if args.base else ()
            load = Load()
            all_times, all_inits = per_run_tenancy(
                invoke_api,
                client,
                image,
                ("floor", *languages, *based),
                args.per_run,
                load,
                base_image(image, args.base) if args.base else "",
                entrypoint_drops_credentials(args.base) if args.base else False,
            )
            load.sample()
            floor = all_times["floor"]
            floor_p50, floor_p95 = statistics.median(floor), percentile(floor, 0.95)
            rows.append(("floor: bare awslambdaric function, fresh env (p50, p95)", ms(floor_p50), ms(floor_p95), load))
            cpu = "CPU, spawn to first /next"
            cpu_floor = statistics.median([i[cpu] for i in all_inits["floor"]]) if cpu in all_inits["floor"][0] else 0
            if cpu_floor:
                rows.append((f"floor   init: {cpu}", ms(cpu_floor), "", load))
            for label in (*languages, *based):
                language = label.partition("@")[0]
                times, inits = all_times[label], all_inits[label]
                p50, p95 = statistics.median(times), percentile(times, 0.95)
                allowed = PER_RUN_TARGETS[language]
                label = label.replace("@base", f" (base {args.base})")
                verdict = "met" if p50 <= floor_p50 + allowed and p95 <= 1.5 * p50 else "MISSED"
                rows.append(
                    (
                        f"{label} per-run tenancy, fresh env (p50, p95)",
                        ms(p50),
                        f"{ms(p95)} = {p95 / p50:.2f} x p50",
                        load,
                    )
                )
                rows.append(
                    (
                        f"{label}   p50 over the floor (target +{allowed * 1000:.0f} ms, p95 <= 1.5 x p50)",
                        ms(p50 - floor_p50),
                        f"{p50 / floor_p50:5.2f} x floor: {verdict}",
                        load,
                    )
                )
                for part in inits[0]:
                    value = statistics.median([i[part] for i in inits])
                    over = f"+{ms(value - cpu_floor).strip()} over the floor's" if part == cpu else ""
                    rows.append((f"{label}   init: {part}", ms(value), over, load))
                spawn = statistics.median([i["spawn to first /next"] for i in inits])
                rows.append((f"{label}   the invoke beyond the init (p50 - init p50)", ms(p50 - spawn), "", load))
                if args.header and "base" not in label:
                    header_load = Load()
                    first = header_tenancy(invoke_api, image, language, args.header, header_load)
                    header_load.sample()
                    p50h = statistics.median(first)
                    rows.append(
                        (
                            f"{language} header: tenancy, a new tenant's first run, HTTP (p50, p95)",
                            ms(p50h),
                            f"{ms(percentile(first, 0.95))} ({p50h / floor_p50:5.2f} x floor)",
                            header_load,
                        )
                    )
    finally:
        for service in (local, remote):
            if service is not None:
                service.stop()
        invoke_api.close()
        for instance in [*instances.values(), *sims.values()]:
            instance.stop()

    print(f"\n{'row':64} {'p50/total ms':>13} {'p95 (+over local p50) / ready-in ms':>36} {'load':>12}")
    for label, first, second, load in rows:
        print(f"{label:64} {first:>13} {second:>36} {load!s:>12}")
    loaded = {id(load): load for *_, load in rows if load.high > LOAD_WARNING}
    if loaded:
        highest = max(load.high for load in loaded.values())
        print(
            f"\nWARNING: the machine's load exceeded {LOAD_WARNING} during {len(loaded)} of the blocks above (up to "
            f"{highest:.1f}, marked (!)): their absolutes say more about the machine than about the code; compare "
            "the rows of one block (the per-run block is interleaved) as ratios."
        )


if __name__ == "__main__":
    main()
