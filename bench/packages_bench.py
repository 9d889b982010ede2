"""Adding a package: how long until a run can import it, and what runs served meanwhile see.

    python bench/packages_bench.py [--runs 300] [--packages pyjokes,numpy] [--node is-number] [--base default|six]

Starts its own service (as root: the full jail; MAX_WORKERS=2) on a data dir of its own under /var/tmp, with the
default base requirements (requests, httpx, jinja2: every build installs the base again) or just `six`. Then:

for each package:
1. idle: `print("hi")` back to back, --runs times (p50/p90/p99), just before the add, so that each build's row
   has an idle row taken moments earlier (this machine's load drifts by the minute);
2. `POST /v1/sandlot/packages`, then the same run loop until the package's build ends, each run's latency kept
   if the build was in the same state (building, or switching: the runtime starting a zygote on the new layer)
   both when it started and when it ended; and the time from the add to the first run
   that imports the package (polled every 50 ms by a second client, which runs in the idle phase too, as does
   a third polling the build's state: both phases carry the same side traffic);
then one table. Read it on an otherwise idle machine: other work on the two cores weighs on every row.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

import httpx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

from service import API_KEY, Service  # noqa: E402

ADMIN_KEY = "bench-admin-" + os.urandom(6).hex()
HELLO = {"language": "python3", "code": "print('hi')"}


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else float("nan")


def row(label: str, values: list[float]) -> str:
    if not values:
        return f"{label:<44} {'-':>6}"
    ms = [v * 1000 for v in values]
    p50, p90, p99 = statistics.median(ms), percentile(ms, 0.9), percentile(ms, 0.99)
    return f"{label:<44} {len(ms):>6} {p50:>9.2f} {p90:>9.2f} {p99:>9.2f}"


def one_run(client: httpx.Client) -> float:
    started = time.perf_counter()
    answer = client.post("/v1/sandbox/run", json=HELLO).json()
    elapsed = time.perf_counter() - started
    assert answer["code"] == 0 and answer["data"]["stdout"] == "hi\n", answer
    return elapsed


def build_state(admin: httpx.Client, build_id: int) -> dict:
    return admin.get(f"/v1/sandlot/builds/{build_id}", params={"tail": 0}).json()["data"]


def add_and_measure(svc: Service, spec: str, language: str, module_code: str, idle_runs: int, remove: str = "") -> dict:
    """Runs back to back: idle_runs of them first, then from the add until its build ends. Both phases carry the
    same side traffic: a second client trying to import the package every 50 ms (it fails until the switch) and
    a third asking for the build's state every 50 ms. Also the time from the add to the first import. With
    `remove` (a name), the change is that removal instead (no import time)."""
    admin = httpx.Client(base_url=svc.url, headers={"X-Api-Key": ADMIN_KEY}, timeout=60)
    runs = httpx.Client(base_url=svc.url, headers={"X-Api-Key": API_KEY}, timeout=60)
    prober = httpx.Client(base_url=svc.url, headers={"X-Api-Key": API_KEY}, timeout=60)
    state = {"build": None, "running": "", "done": False, "added": 0.0, "stop": False}
    first_import: list[float] = []

    def watch() -> None:
        while not state["done"]:
            if state["build"] is None:
                admin.get("/v1/sandlot/builds", params={"language": language})
            else:
                current = build_state(admin, state["build"])["state"]
                state["running"] = current if current in ("building", "switching") else ""
                state["done"] = current in ("succeeded", "failed")
            time.sleep(0.05)

    def probe() -> None:
        while not state["stop"]:
            added, ended = state["added"], state["done"]  # read before the run: a run after the end sees its layer
            answer = prober.post("/v1/sandbox/run", json={"language": language, "code": module_code}).json()
            if answer["code"] != 0:  # never expected: runs are served throughout a build and its switch
                print(f"sandlot: a run was refused: {answer}", file=sys.stderr)
            elif answer["data"]["exit_code"] == 0 and added and not remove:
                first_import.append(time.perf_counter() - added)
                return
            if ended and remove:
                return
            if ended:  # the build had ended before this run started: it failed, or the run did not see its layer
                print(f"sandlot: a run after the build's end could not import: {answer}", file=sys.stderr)
                return
            time.sleep(0.05)

    watcher, prober_thread = threading.Thread(target=watch), threading.Thread(target=probe)
    watcher.start()
    prober_thread.start()
    time.sleep(0.5)
    idle = [one_run(runs) for _ in range(idle_runs)]
    state["added"] = time.perf_counter()
    if remove:
        queued = admin.delete("/v1/sandlot/packages", params={"language": language, "name": remove}).json()
    else:
        queued = admin.post("/v1/sandlot/packages", json={"language": language, "spec": spec}).json()
    assert queued["code"] == 0, queued
    state["build"] = queued["data"]["build"]["id"]
    building: list[float] = []
    switching: list[float] = []  # the runtime starting a zygote on the new layer
    while not state["done"]:
        during = state["running"]
        elapsed = one_run(runs)
        if during and state["running"] == during:
            (building if during == "building" else switching).append(elapsed)
    watcher.join()
    prober_thread.join(timeout=120)
    state["stop"] = True
    final = build_state(admin, state["build"])
    for client in (admin, runs, prober):
        client.close()
    return {
        "spec": spec,
        "state": final["state"],
        "build_seconds": final["duration"],
        "to_import": first_import[0] if first_import else float("nan"),
        "idle": idle,
        "building": building,
        "switching": switching,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=300, help="idle runs (default 300)")
    parser.add_argument("--packages", default="pyjokes,numpy", help="pip specs to add, comma-separated")
    parser.add_argument("--node", default="is-number", help="npm specs to add, comma-separated ('' for none)")
    parser.add_argument("--base", choices=["default", "six"], default="default", help="the base requirements")
    parser.add_argument(
        "--cycles", type=int, default=0, help="then add and remove the first package this many times (more samples)"
    )
    args = parser.parse_args()

    root = tempfile.mkdtemp(prefix="sandlot-bench-packages-", dir="/var/tmp")
    os.chmod(root, 0o755)
    env = {"SANDLOT_DATA_DIR": os.path.join(root, "data"), "SANDLOT_ADMIN_KEY": ADMIN_KEY, "MAX_WORKERS": "2"}
    if args.base == "six":
        requirements = os.path.join(root, "requirements.txt")
        with open(requirements, "w") as f:
            f.write("six\n")
        os.chmod(requirements, 0o644)
        env["SANDLOT_PYTHON_REQUIREMENTS"] = requirements
    svc = Service(**env)
    try:
        svc.start()
        client = httpx.Client(base_url=svc.url, headers={"X-Api-Key": API_KEY}, timeout=60)
        for _ in range(30):  # warm-up
            one_run(client)
        work = [
            (spec, "python3", f"import {spec.split('=')[0].split('<')[0].split('>')[0].replace('-', '_')}")
            for spec in args.packages.split(",")
            if spec
        ]
        work += [
            (spec, "nodejs", f"require({(spec.rsplit('@', 1)[0] if spec.rfind('@') > 0 else spec)!r})")
            for spec in args.node.split(",")
            if spec
        ]
        client.close()
        results = [add_and_measure(svc, spec, language, code, args.runs) for spec, language, code in work]
        cycled: dict[str, list[float]] = {"idle": [], "building": []}
        if args.cycles and work:
            spec, language, code = work[0]
            name = code.split()[-1] if language == "python3" else spec.rsplit("@", 1)[0]
            for _ in range(args.cycles):
                for change in (name, ""):  # remove it (it is there), then add it again
                    done = add_and_measure(svc, spec, language, code, args.runs // 2, remove=change)
                    cycled["idle"] += done["idle"]
                    cycled["building"] += done["building"]
        print(f"base: {args.base}; MAX_WORKERS=2; python hello back to back, one client")
        print(f"{'python hello':<44} {'runs':>6} {'p50 ms':>9} {'p90 ms':>9} {'p99 ms':>9}")
        for result in results:
            print(row(f"idle, just before adding {result['spec']}", result["idle"]))
            print(row(f"while {result['spec']} builds", result["building"]))
            print(row("while the runtime switches to it", result["switching"]))
        if args.cycles:
            print(row(f"idle, {args.cycles} remove+add cycles", cycled["idle"]))
            print(row(f"while building, {args.cycles} cycles", cycled["building"]))
        print()
        print(f"{'add':<24} {'build':>10} {'add -> first import':>20} {'result':>10}")
        for result in results:
            print(
                f"{result['spec']:<24} {result['build_seconds'] or 0:>9.1f}s {result['to_import']:>19.2f}s "
                f"{result['state']:>10}"
            )
    finally:
        svc.stop()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
