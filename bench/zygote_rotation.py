"""What replacing zygotes more often costs: the same service with SANDLOT_ZYGOTE_MAX_FORKS at a small value and at
the default, measured in alternating blocks (this machine's load, which changes by the minute, weighs on both).

A zygote's hash secret and address layout are shared by every run forked from it; a new zygote (a new interpreter:
fresh PYTHONHASHSEED, fresh ASLR; for Node a fresh snapshot seed) is the only way to change them
(docs/security.md, "Hash seed and address layout"). This prints, for each setting:
- python hello, 4 clients: runs/s and the service tree's CPU per run (its processes' utime+stime, dead ones
  included: /proc/<pid>/stat of the service counts its waited-for children);
- node hello, 4 clients: runs/s;
- how many distinct `hash('sandlot')` values the python runs printed (one per zygote generation that served);
- zygote generations started during the blocks;
- with --paced S: two services given one python and one node run a second for S seconds, one with
  SANDLOT_ZYGOTE_MAX_AGE=2 and one that never replaces its zygotes by age (an idle service replaces none: a
  zygote is found too old when a child is asked of it): the CPU replacing every zygote (python's two kinds and
  node's, whose replacement builds a snapshot) costs.

    python bench/zygote_rotation.py [--few 50] [--blocks 3] [--requests 200] [--mode chroot] [--paced 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import httpx  # noqa: E402
from service import API_KEY, Service  # noqa: E402

PY = "print(hash('sandlot'))"
NODE = "console.log(1)"


def tree_cpu(pid: int) -> float:
    """utime+stime of pid and every process below it, the waited-for dead ones included (cutime, cstime)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    seen = set()

    def walk(p: int) -> None:
        nonlocal total
        if p in seen:
            return
        seen.add(p)
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in fields[11:15]) / ticks
            children = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            return
        for c in children:
            walk(int(c))

    walk(pid)
    return total


def block(svc: Service, language: str, code: str, requests: int, clients: int = 4) -> tuple[float, list[str]]:
    outputs: list[str] = []
    lock = threading.Lock()
    todo = iter(range(requests))

    def client() -> None:
        with httpx.Client(base_url=svc.url, headers={"X-Api-Key": API_KEY}, timeout=120) as http:
            for _ in todo:
                body = {"language": language, "code": code, "preload": "", "enable_network": False}
                data = http.post("/v1/sandbox/run", json=body).json()["data"]
                with lock:
                    outputs.append(data["stdout"])

    threads = [threading.Thread(target=client) for _ in range(clients)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return requests / (time.monotonic() - start), outputs


def paced(seconds: float, mode: str) -> None:
    extra = {"SANDLOT_JAIL": mode} if mode else {}
    services = {age: Service(MAX_WORKERS="4", SANDLOT_ZYGOTE_MAX_AGE=age, **extra) for age in ("0", "2")}
    for svc in services.values():
        svc.start()
    try:
        for svc in services.values():
            block(svc, "python3", PY, 8)
            block(svc, "nodejs", NODE, 8)
        time.sleep(5)
        load = os.getloadavg()[0]
        before = {age: (tree_cpu(svc.process.pid), svc.detail()["runtimes"]) for age, svc in services.items()}
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for svc in services.values():
                block(svc, "python3", PY, 1, clients=1)
                block(svc, "nodejs", NODE, 1, clients=1)
            time.sleep(1)
        for age, svc in services.items():
            cpu = tree_cpu(svc.process.pid) - before[age][0]
            detail = svc.detail()["runtimes"]
            generations = {
                lang: detail[lang]["zygote_generation"] - before[age][1][lang]["zygote_generation"] for lang in detail
            }
            print(
                f"paced {seconds:.0f} s, SANDLOT_ZYGOTE_MAX_AGE={age}: {cpu:.2f} s CPU, "
                f"new zygotes {generations} (load {load:.1f})"
            )
    finally:
        for svc in services.values():
            svc.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--few", type=int, default=50, help="SANDLOT_ZYGOTE_MAX_FORKS of the rotating service")
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--mode", default="", help="SANDLOT_JAIL (default: the best this host gives)")
    parser.add_argument("--paced", type=float, default=0, help="measure replacements under 1 run/s this long")
    args = parser.parse_args()
    if args.paced:
        paced(args.paced, args.mode)
        return
    mode = {"SANDLOT_JAIL": args.mode} if args.mode else {}
    settings = {"default (2000)": "2000", f"every {args.few}": str(args.few)}
    services = {
        name: Service(MAX_WORKERS="4", SANDLOT_ZYGOTE_MAX_FORKS=forks, **mode) for name, forks in settings.items()
    }
    for svc in services.values():
        svc.start()
    try:
        results = {name: {"py": [], "node": [], "cpu": [], "hashes": set(), "gen": 0} for name in services}
        for svc in services.values():  # warm-up
            block(svc, "python3", PY, 20)
            block(svc, "nodejs", NODE, 20)
        first_gen = {name: svc.detail()["runtimes"]["python3"]["zygote_generation"] for name, svc in services.items()}
        for number in range(args.blocks):
            for name, svc in services.items():
                load = os.getloadavg()[0]
                cpu0 = tree_cpu(svc.process.pid)
                rate, outputs = block(svc, "python3", PY, args.requests)
                cpu = (tree_cpu(svc.process.pid) - cpu0) / args.requests
                node_rate, _ = block(svc, "nodejs", NODE, args.requests // 2)
                r = results[name]
                r["py"].append(rate)
                r["cpu"].append(cpu)
                r["node"].append(node_rate)
                r["hashes"].update(outputs)
                print(
                    f"block {number} {name:>15}: python {rate:6.1f} runs/s, {cpu * 1000:5.1f} ms CPU/run; "
                    f"node {node_rate:5.1f} runs/s  (load {load:.1f})",
                    flush=True,
                )
        for name, svc in services.items():
            detail = svc.detail()["runtimes"]
            results[name]["gen"] = detail["python3"]["zygote_generation"] - first_gen[name]
        base = results["default (2000)"]
        print(f"\nload {os.getloadavg()[0]:.1f} (shared machine: other helpers' services and tests run too)")
        for name, r in results.items():
            py, node, cpu = statistics.median(r["py"]), statistics.median(r["node"]), statistics.median(r["cpu"])
            print(
                f"{name:>15}: python {py:6.1f} runs/s ({py / statistics.median(base['py']):.2f}x), "
                f"{cpu * 1000:5.1f} ms CPU/run ({cpu / statistics.median(base['cpu']):.2f}x); "
                f"node {node:5.1f} runs/s ({node / statistics.median(base['node']):.2f}x); "
                f"{len(r['hashes'])} distinct hash('sandlot') over {args.blocks * args.requests} python runs; "
                f"{r['gen']} python zygote generations"
            )
    finally:
        for svc in services.values():
            svc.stop()


if __name__ == "__main__":
    main()
