"""Sandlot benchmark: latency and throughput of runs over HTTP, next to the cost of a cold interpreter.

Starts its own service on a free port, prints one table. Not run by CI: machines are shared and
noisy, so read the ratios within one run, not absolute numbers across runs. `--unprivileged`
starts the whole service as nobody (the userns jail without root; tests/unprivileged.py).

    python bench/bench.py [--requests 400] [--clients 1,4] [--unprivileged] [--jail chroot] [--container]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import unprivileged  # noqa: E402
from service import API_KEY, DOCKER_DEFAULT, Service, standin  # noqa: E402
from test_api import DIFY_PYTHON_WRAPPER, b64  # noqa: E402  (Dify's wrappers, as the tests send them)
from test_nodejs import DIFY_JS_WRAPPER  # noqa: E402

from runtimes.config import default_python  # noqa: E402

INPUTS = b64({"a": 2, "b": 40})  # the wrappers' inputs, base64 JSON as Dify sends them

PYTHON_WORKLOADS = {
    "python hello": 'print("hi")',
    "python dify wrapper": DIFY_PYTHON_WRAPPER % INPUTS,
    "python import requests,httpx,jinja2": "import requests, httpx, jinja2\nprint('ok')",
}
NODE_WORKLOADS = {
    "node hello": 'console.log("hi")',
    "node dify wrapper": DIFY_JS_WRAPPER % INPUTS,
}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def spawn_p50(argv: list[str], count: int = 60) -> float:
    times = []
    for _ in range(count):
        started = time.perf_counter()
        subprocess.run(argv, env={}, check=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def drive(
    port: int, code: str, clients: int, total: int, language: str = "python3", rate: float | None = None
) -> tuple[list[float], float]:
    """total runs from `clients` connections; with `rate`, each client paces itself to rate/clients per second."""
    body = json.dumps({"language": language, "code": code, "preload": "", "enable_network": True}).encode()
    headers = {"X-Api-Key": API_KEY, "Content-Type": "application/json"}
    latencies: list[float] = []
    lock = threading.Lock()
    per_client = total // clients
    failures = []

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port)
        mine = []
        interval = clients / rate if rate else 0.0
        next_at = time.perf_counter()
        for _ in range(per_client):
            if interval:
                time.sleep(max(0.0, next_at - time.perf_counter()))
                next_at += interval
            started = time.perf_counter()
            conn.request("POST", "/v1/sandbox/run", body, headers)
            answer = json.loads(conn.getresponse().read())
            mine.append(time.perf_counter() - started)
            if answer["code"] != 0 or answer["data"]["exit_code"] != 0:
                failures.append(answer)
        conn.close()
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    if failures:
        raise SystemExit(f"runs failed: {failures[:2]}")
    return latencies, len(latencies) / elapsed


def idle_round_trip(port: int, count: int = 40, rate: float = 10) -> float:
    """p50 of GET /health paced like the paced rows: what waking an idle machine costs an HTTP round trip."""
    conn = http.client.HTTPConnection("127.0.0.1", port)
    times = []
    for _ in range(count):
        time.sleep(1 / rate)
        started = time.perf_counter()
        conn.request("GET", "/health")
        conn.getresponse().read()
        times.append(time.perf_counter() - started)
    conn.close()
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--clients", default="1,4")
    parser.add_argument("--languages", default="python3,nodejs")
    parser.add_argument("--unprivileged", action="store_true", help="the whole service as nobody (no root)")
    parser.add_argument("--jail", default="", help="SANDLOT_JAIL for the service (e.g. chroot, next to full)")
    parser.add_argument(
        "--container", action="store_true", help="the service in the stand-in for a default container (chroot)"
    )
    args = parser.parse_args()
    client_counts = [int(c) for c in args.clients.split(",")]

    python = default_python()
    node = os.environ.get("NODEJS_PATH", "/usr/bin/node")
    make = unprivileged.service if args.unprivileged else Service
    env = {"MAX_WORKERS": "4", "MAX_REQUESTS": "100", **({"SANDLOT_JAIL": args.jail} if args.jail else {})}
    if args.container:
        service = Service(launcher=standin(DOCKER_DEFAULT), **env).start()
        python = os.path.realpath(service.python)  # the stand-in's interpreter: the one its runs fork from
    else:
        service = make(**env).start()
    mode = service.detail()["runtimes"]["python3"]["protections"]["mode"]
    print(f"jail: {mode}")
    header = f"{'workload':40} {'clients':>7} {'pacing':>8} {'p50 ms':>8} {'p99 ms':>8} {'runs/s':>8} {'p50/spawn':>9}"

    def row(name, language, code, clients, total, spawn, rate=None):
        latencies, achieved = drive(service.port, code, clients, total, language, rate)
        p50, p99 = percentile(latencies, 0.5), percentile(latencies, 0.99)
        pacing = f"{rate:.0f}/s" if rate else "none"
        timings = f"{p50 * 1000:8.2f} {p99 * 1000:8.2f} {achieved:8.1f} {p50 / spawn:9.2f}"
        print(f"{name:40} {clients:7d} {pacing:>8} {timings}")

    try:
        drive(service.port, 'print("warm")', 4, 100)  # warm-up
        spawn = spawn_p50([python, "-I", "-S", "-c", "pass"])
        node_spawn = spawn_p50([node, "-e", ""], count=40)
        cores = os.cpu_count()
        print(f"reference: spawn of `{python} -I -S -c pass`: p50 {spawn * 1000:.2f} ms")
        print(f"reference: spawn of `{node} -e ''` (empty environment): p50 {node_spawn * 1000:.2f} ms")
        languages = args.languages.split(",")
        if "nodejs" in languages:
            drive(service.port, 'console.log("warm")', 1, 20, "nodejs", rate=10)
            floor = idle_round_trip(service.port)
            print(f"reference: GET /health paced at 10/s (idle wake-ups, no run): p50 {floor * 1000:.2f} ms")
        print(header)
        for name, code in PYTHON_WORKLOADS.items() if "python3" in languages else ():
            for clients in client_counts:
                row(name, "python3", code, clients, args.requests, spawn)
        for name, code in NODE_WORKLOADS.items() if "nodejs" in languages else ():
            row(name, "nodejs", code, 1, 50, node_spawn, rate=10)
            row(name, "nodejs", code, 4, args.requests // 2, node_spawn)
        print(f"targets: python hello p50 < 0.5 x spawn; 4-client python hello >= {2 / spawn:.0f} runs/s;")
        node_target = 0.7 * cores / node_spawn
        print(f"         node hello paced p50 < 0.3 x node spawn; 4-client node >= {node_target:.0f} runs/s")
    finally:
        service.stop()


if __name__ == "__main__":
    main()
