"""How many bits two concurrent runs pass through the machine-wide pid counter (the chroot and landlock jails have
no PID namespace), through the HTTP API.

The sender, in each time slot whose bit is 1, starts and joins N threads; the receiver, at the end of each slot,
starts one thread and reads its id: the step from the previous id, less one, is every pid taken in the slot (the
sender's, and everything else the machine started). A step of N/2 or more reads as 1. Slots follow the wall clock
(CLOCK_REALTIME, the same in every run), from a start both runs agree on. Prints, per slot length, the bits sent,
the errors and the rate, beside the machine's load (other helpers' services and tests share this machine: their
process starts are this channel's noise).

    python bench/pid_channel.py [--mode chroot] [--bits 256] [--slots 0.02,0.01,0.005] [--threads 20]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import httpx  # noqa: E402
from service import API_KEY, Service  # noqa: E402

SENDER = """
import threading, time
bits, slot, start, n = {bits!r}, {slot}, {start}, {n}
for i, bit in enumerate(bits):
    end = start + (i + 1) * slot
    if bit == '1':
        for _ in range(n):
            if time.time() >= end - slot * 0.2:
                break
            t = threading.Thread(target=int); t.start(); t.join()
    while time.time() < end:
        time.sleep(min(0.001, max(0, end - time.time())))
print('sent')
"""

RECEIVER = """
import threading, time
count, slot, start = {count}, {slot}, {start}
def tid():
    box = []
    t = threading.Thread(target=lambda: box.append(threading.get_native_id())); t.start(); t.join()
    return box[0]
while time.time() < start:
    time.sleep(0.0005)
previous, steps = tid(), []
for i in range(count):
    end = start + (i + 1) * slot
    while time.time() < end:
        time.sleep(min(0.001, max(0, end - time.time())))
    now = tid()
    steps.append(now - previous - 1)
    previous = now
print(' '.join(map(str, steps)))
"""


def run(url: str, code: str, timeout: float) -> str:
    body = {"language": "python3", "code": code, "preload": "", "enable_network": False, "timeout": timeout}
    reply = httpx.post(url + "/v1/sandbox/run", json=body, headers={"X-Api-Key": API_KEY}, timeout=timeout + 30)
    data = reply.json()["data"]
    if data["error"]:
        raise RuntimeError(data["error"])
    return data["stdout"]


def measure(url: str, bits: str, slot: float, threads: int) -> tuple[int, float, list[int]]:
    start = time.time() + 2.0  # both runs forked and waiting by then
    timeout = 2.0 + len(bits) * slot + 5
    out: dict[str, str] = {}
    send = threading.Thread(
        target=lambda: out.update(sent=run(url, SENDER.format(bits=bits, slot=slot, start=start, n=threads), timeout))
    )
    send.start()
    out["steps"] = run(url, RECEIVER.format(count=len(bits), slot=slot, start=start), timeout)
    send.join()
    steps = [int(s) for s in out["steps"].split()]
    got = "".join("1" if s >= threads / 2 else "0" for s in steps)
    errors = sum(a != b for a, b in zip(bits, got, strict=True))
    return errors, len(bits) / (len(bits) * slot), steps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", default="chroot")
    parser.add_argument("--bits", type=int, default=256)
    parser.add_argument("--slots", default="0.02,0.01,0.005")
    parser.add_argument("--threads", type=int, default=20)
    args = parser.parse_args()
    svc = Service(SANDLOT_JAIL=args.mode, MAX_WORKERS="4", SANDLOT_MAX_TIMEOUT="60").start()
    try:
        print(f"mode {svc.detail().get('mode', args.mode)}", flush=True)
        rng = random.Random(41)
        for slot in (float(s) for s in args.slots.split(",")):
            bits = "".join(rng.choice("01") for _ in range(args.bits))
            load = os.getloadavg()[0]
            errors, rate, steps = measure(svc.url, bits, slot, args.threads)
            idle = sorted(s for s, b in zip(steps, bits, strict=True) if b == "0")
            p = errors / len(bits)
            # the capacity of a binary symmetric channel with this error rate
            h = 0.0 if p in (0, 1) else -(p * math.log2(p) + (1 - p) * math.log2(1 - p))
            print(
                json.dumps(
                    {
                        "slot_s": slot,
                        "bits": len(bits),
                        "errors": errors,
                        "raw_bit_per_s": round(rate),
                        "capacity_bit_per_s": round(rate * (1 - h), 1),
                        "noise_pids_per_slot_p50_p90": [idle[len(idle) // 2], idle[int(len(idle) * 0.9)]],
                        "load": round(load, 1),
                    }
                ),
                flush=True,
            )
    finally:
        svc.stop()


if __name__ == "__main__":
    main()
