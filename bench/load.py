"""Sandlot under mixed load: N clients x T seconds of benign runs (exact outputs checked) and hostile ones.

Starts its own service (as root: the full jail; `--mode reduced`: the userns jail as root;
`--mode unprivileged`: the whole service as nobody; `--mode container`: root in the stand-in for a
container on default privileges, the chroot jail), drives it, stops it, and reports counts,
wrong results, errors other than the designed 503, p50/p99 per workload, the service's RSS after
warm-up and at the end, and what was left over (processes, uids of the block, mounts, rules).

    python bench/load.py [--clients 32] [--seconds 600] [--mode auto|reduced|unprivileged|container] [--json]

The short form runs in the tests (tests/test_load.py); the long form is run by hand.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import httpx  # noqa: E402
import unprivileged  # noqa: E402
from service import API_KEY, DOCKER_DEFAULT, Service, descendants, processes_with_uid_in, standin  # noqa: E402


@dataclass(frozen=True)
class Workload:
    name: str
    language: str
    make: Callable[[random.Random], tuple[str, Callable[[dict], bool], str]]  # -> code, check(data), stdin
    timeout: float = 10
    benign: bool = True


def _product(rng: random.Random):
    a, b = rng.randrange(1000), rng.randrange(1000)
    return f"print({a} * {b})", lambda d: d["stdout"] == f"{a * b}\n" and d["exit_code"] == 0, ""


def _json_roundtrip(rng: random.Random):
    key = f"k{rng.randrange(10**6)}"
    code = f"import json\nprint(json.dumps({{'{key}': [1, 2, 3]}}, sort_keys=True))"
    return code, lambda d: d["stdout"] == json.dumps({key: [1, 2, 3]}) + "\n", ""


def _node_product(rng: random.Random):
    a, b = rng.randrange(1000), rng.randrange(1000)
    return f"console.log({a} * {b})", lambda d: d["stdout"] == f"{a * b}\n" and d["exit_code"] == 0, ""


def _node_stdin(rng: random.Random):
    word = f"w{rng.randrange(10**6)}"
    code = "let s = ''; process.stdin.on('data', d => s += d); process.stdin.on('end', () => console.log(s.trim()))"
    return code, lambda d: d["stdout"] == f"{word}\n", word


def _fixed(code: str, check: Callable[[dict], bool]):
    return lambda rng: (code, check, "")


WORKLOADS = [
    Workload("python product", "python3", _product),
    Workload("python json", "python3", _json_roundtrip),
    Workload("node product", "nodejs", _node_product),
    Workload("node stdin", "nodejs", _node_stdin),
    Workload(
        "python fork",
        "python3",
        _fixed("import os\nos.fork()", lambda d: "operation not permitted" in d["error"].lower()),
        benign=False,
    ),
    Workload(
        "python busy loop",
        "python3",
        _fixed("while True: pass", lambda d: d["exit_code"] == -1 and "error: timeout" in d["error"]),
        timeout=0.5,
        benign=False,
    ),
    Workload(
        "python memory bomb",
        "python3",
        _fixed("x = bytearray(8 * 1024**3)", lambda d: "MemoryError" in d["error"]),
        benign=False,
    ),
    Workload(
        "python threads",
        "python3",
        _fixed(
            "import threading\nstop = threading.Event()\nn = 0\ntry:\n    for _ in range(3000):\n"
            "        threading.Thread(target=stop.wait).start()\n        n += 1\nexcept RuntimeError:\n    pass\n"
            "stop.set()\nprint(n < 100)",
            lambda d: d["stdout"] == "True\n",
        ),
        benign=False,
    ),
    Workload(
        "python fills /tmp",
        "python3",
        _fixed(
            "import tempfile\ntry:\n    for i in range(10):\n"
            "        open(f'{tempfile.gettempdir()}/b{i}', 'wb').write(b'x' * (10 << 20))\n"
            "except OSError as e:\n    print('capped', e.errno)",
            # a tmpfs is full (ENOSPC); the chroot jail's /tmp directory is capped by ending the run
            lambda d: d["stdout"] == "capped 28\n" or d["error"].endswith("error: /tmp size limit exceeded (64 MiB)\n"),
        ),
        benign=False,
    ),
    Workload(
        "node busy loop",
        "nodejs",
        _fixed("while (true) {}", lambda d: d["exit_code"] == -1 and "error: timeout" in d["error"]),
        timeout=0.5,
        benign=False,
    ),
    Workload(
        "node kills itself",
        "nodejs",
        _fixed("process.kill(process.pid, 'SIGKILL')", lambda d: d["exit_code"] == 137),
        benign=False,
    ),
]


@dataclass
class Tally:
    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    wrong: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    errors: list[str] = field(default_factory=list)
    busy_503: int = 0
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    samples: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def client(url: str, until: float, seed: int, tally: Tally, hostile_share: float) -> None:
    rng = random.Random(seed)
    benign = [w for w in WORKLOADS if w.benign]
    hostile = [w for w in WORKLOADS if not w.benign]
    with httpx.Client(base_url=url, headers={"X-Api-Key": API_KEY}, timeout=120) as http:
        while time.monotonic() < until:
            work = rng.choice(hostile if rng.random() < hostile_share else benign)
            code, check, stdin = work.make(rng)
            body = {"language": work.language, "code": code, "timeout": work.timeout, "stdin": stdin}
            started = time.monotonic()
            try:
                response = http.post("/v1/sandbox/run", json=body)
                envelope = response.json()
            except (httpx.HTTPError, ValueError) as exc:
                with tally.lock:
                    tally.errors.append(f"{work.name}: {type(exc).__name__}: {exc}")
                continue
            elapsed = time.monotonic() - started
            with tally.lock:
                if response.status_code == 503 and envelope.get("code") == -503:
                    tally.busy_503 += 1
                    continue
                tally.counts[work.name] += 1
                tally.latencies[work.name].append(elapsed)
                if response.status_code != 200 or envelope.get("code") != 0:
                    tally.errors.append(f"{work.name}: HTTP {response.status_code} {json.dumps(envelope)[:300]}")
                elif not check(envelope["data"]):
                    tally.wrong[work.name] += 1
                    if len(tally.samples) < 10:
                        tally.samples.append(f"{work.name}: {json.dumps(envelope['data'])[:300]}")


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def leftovers(below: list[int], of_block: list[int], uid_ranges: list[list[int]]) -> dict:
    """What outlived the service: its processes, its block's (not "any process of the block": once it
    has stopped another instance may claim that block), mounts in our namespace, its nft tables."""
    mounts = []
    with open("/proc/self/mountinfo") as f:
        mounts = [line.split()[4] for line in f if "sandlot" in line]
    tables = ""
    if os.geteuid() == 0:
        out = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
        unclaimed = [r for r in uid_ranges if not block_claimed(r[0])]  # a live instance's table is its own
        tables = " ".join(t for t in out.split() if any(t == f"sandlot_{r[0]}" for r in unclaimed))
    return {
        "processes": [p for p in below if os.path.exists(f"/proc/{p}")],
        "uid_processes": [p for p in of_block if os.path.exists(f"/proc/{p}")],
        "mounts": mounts,
        "rules": tables,
    }


def block_claimed(first_uid: int, lock_dir: str = "/run/sandlot") -> bool:
    """Whether a live instance holds the uid block starting at first_uid (runtimes/jail/service/uids.py)."""
    try:
        fd = os.open(os.path.join(lock_dir, f"uids-{first_uid}.lock"), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def make_service(mode: str, workers: int) -> Service:
    env = {"MAX_WORKERS": str(workers), "MAX_REQUESTS": "1000", "SANDLOT_QUEUE_TIMEOUT": "60"}
    if mode == "unprivileged":
        return unprivileged.service(**env)
    if mode == "reduced":
        env["SANDLOT_JAIL"] = "reduced"
    if mode == "container":
        return Service(launcher=standin(DOCKER_DEFAULT), **env)
    return Service(**env)


def run(clients: int, seconds: float, mode: str = "auto", hostile_share: float = 0.3, workers: int = 4) -> dict:
    svc = make_service(mode, workers).start()
    report: dict = {"clients": clients, "seconds": seconds, "mode": mode}
    try:
        detail = svc.detail()["runtimes"]
        report["jail"] = {lang: rt["protections"]["mode"] for lang, rt in detail.items()}
        uid_ranges = [rt["uid_range"] for rt in detail.values() if rt.get("uid_range")]
        tally = Tally()
        warm_up = min(10.0, seconds / 5)
        until = time.monotonic() + seconds
        threads = [
            threading.Thread(target=client, args=(svc.url, until, seed, tally, hostile_share))
            for seed in range(clients)
        ]
        for t in threads:
            t.start()
        time.sleep(warm_up)
        report["rss_kib_after_warm_up"] = rss_kib(svc.process.pid)
        for t in threads:
            t.join()
        report["rss_kib_end"] = rss_kib(svc.process.pid)
        below = descendants(svc.process.pid)
        of_block = [p for r in uid_ranges for p in processes_with_uid_in(*r)] if os.geteuid() == 0 else []
    finally:
        svc.stop()
    report["runs"] = dict(tally.counts)
    report["total_runs"] = sum(tally.counts.values())
    report["wrong"] = dict(tally.wrong)
    report["wrong_samples"] = tally.samples
    report["errors"] = tally.errors[:20]
    report["error_count"] = len(tally.errors)
    report["designed_503"] = tally.busy_503
    report["latency_ms"] = {
        name: {
            "p50": round(statistics.median(values) * 1000, 1),
            "p99": round(sorted(values)[min(len(values) - 1, int(0.99 * len(values)))] * 1000, 1),
        }
        for name, values in sorted(tally.latencies.items())
    }
    start, end = report["rss_kib_after_warm_up"], report["rss_kib_end"]
    report["rss_growth_percent"] = round(100 * (end - start) / start, 1) if start else None
    deadline = time.monotonic() + 10  # killed at stop, the last processes may take a moment to be gone
    report["leftovers"] = leftovers(below, of_block, uid_ranges)
    while any(report["leftovers"].values()) and time.monotonic() < deadline:
        time.sleep(0.2)
        report["leftovers"] = leftovers(below, of_block, uid_ranges)
    return report


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--mode", choices=["auto", "reduced", "unprivileged", "container"], default="auto")
    parser.add_argument("--hostile-share", type=float, default=0.3)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    report = run(args.clients, args.seconds, args.mode, args.hostile_share, args.workers)
    if args.json:
        print(json.dumps(report, indent=1))
        return
    print(f"mode {report['mode']} ({report['jail']}), {args.clients} clients x {args.seconds:g} s")
    print(
        f"runs {report['total_runs']}, wrong {sum(report['wrong'].values())}, errors {report['error_count']}, "
        f"designed 503s {report['designed_503']}"
    )
    print(f"{'workload':28} {'runs':>6} {'wrong':>6} {'p50 ms':>8} {'p99 ms':>8}")
    for name, lat in report["latency_ms"].items():
        print(f"{name:28} {report['runs'][name]:>6} {report['wrong'].get(name, 0):>6} {lat['p50']:>8} {lat['p99']:>8}")
    print(
        f"service RSS after warm-up {report['rss_kib_after_warm_up']} KiB, at the end {report['rss_kib_end']} KiB "
        f"({report['rss_growth_percent']} %)"
    )
    print(f"leftovers: {report['leftovers']}")
    for line in report["wrong_samples"] + report["errors"]:
        print("  ", line)


if __name__ == "__main__":
    main()
