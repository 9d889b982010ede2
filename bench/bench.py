"""Sandlot benchmark: latency, throughput, CPU, idle memory and start-up, beside another release.

Starts its own service on a free port (as root, `MAX_WORKERS=4`) and prints one table. With
`--base <commit>` it also starts that release's service (`git archive` of the commit, kept under
/var/tmp) and measures both in alternating blocks, so that the load of this shared machine, which
changes by the minute, weighs on both columns alike: read the ratios, not absolute numbers across
runs. `--unprivileged` starts the services as nobody (the userns jail without root); `--jail M`
gives them SANDLOT_JAIL=M; `--container` starts them in the stand-in for a container on default
privileges (tests/outer_filter.py: the chroot mode). `--relative` adds the rows again as ratios to the bare
interpreter spawns of the same run (the emulated arm64 machine's table: infra/arm64/vm.py bench).

    python bench/bench.py [--base 5d5d6ef] [--blocks 6] [--requests 100] [--starts 3] [--unprivileged]
                          [--jail chroot] [--container] [--relative]

Rows (each for this tree and the base):
- python hello, 1 client: p50 and p90, and p50 over a `python -I -S -c pass` spawn;
- python hello, 4 clients: runs/s, and CPU per run: the whole machine's (/proc/stat over the block,
  so other load on the machine counts too: quiet machines only) and the service tree's own (a
  cpuacct cgroup per service, where cgroup v1 has one: every process below the service, the dead
  ones included);
- node hello, 4 clients: runs/s, its ratio to the bare-node bound (the machine's cores / p50 of a
  `node -e ""` spawn: what 4 clients could reach if a run cost one bare node start), CPU per run,
  and, beside a base, the whole machine's CPU per run that 1.15x the base's runs/s leaves, against
  what one `node -e 0` start costs outside any jail (the floor of a run that starts node); node
  hello paced at 10/s, 1 client: p50;
- idle: PSS of the whole service tree (the service and every process below it, summed over
  /proc/<pid>/smaps_rollup) and of each of its processes, 5 s after the warm-up and after IDLE_PAUSE s
  without a run (PSS shares a page among every process that maps it, other services' included: a node
  binary mapped by another room's nodes counts less here than on a machine of its own);
- start: exec of the service -> first correct python run and first correct node run (requests sent
  from the exec on, every 5 ms until one is answered correctly; refusals counted), and when
  /health first said 200; its breakdown as the service logs it (the environment's settings read and
  layers found, the platform's record there and the runtime code loaded, the settings model loaded, web
  stack imported, app started, runtimes' first zygotes up, each runtime ready), with the load; the CPU the
  service tree (a cpuacct cgroup of its own) and the service process had used when the first python run
  was answered; `--starts-only` measures these rows alone;
- first runs after start: p50 of the 20 python runs that follow the first one, beside the steady p50.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests"))
sys.path.insert(0, REPO)

import unprivileged  # noqa: E402
from service import API_KEY, DOCKER_DEFAULT, Service, descendants, standin  # noqa: E402

from runtimes.config import RuntimeConfig, default_python  # noqa: E402

PYTHON_HELLO = 'print("hi")'
NODE_HELLO = 'console.log("hi")'
CPUACCT = "/sys/fs/cgroup/cpuacct"
IDLE_PAUSE = 70  # seconds without a run before the idle rows (ready children shrink after 20, the preloaded
# Python zygote is parked after 60: runtimes/python/runtime.py PARK_SECONDS)
# the start's timeline as the service logs it (handler/app.py), seconds after exec, in the order shown
START_MARKS = (
    "settings",
    "platform probed",
    "settings model",
    "web stack",
    "app",
    "runtimes started",
    "python3 ready",
    "nodejs ready",
)
HZ = os.sysconf("SC_CLK_TCK")
# The stand-ins --container starts a service in (tests/outer_filter.py), each with a PID namespace of its own as a
# container has (its /proc, which the uid sweep of the chroot and landlock jails reads, holds its own processes):
# a container on default privileges (Docker's capabilities and seccomp profile: the chroot jail), and a pod under
# Kubernetes' `restricted` standard (the same profile, a non-root uid, no capabilities, no_new_privs: the landlock
# jail), with the mode each must pick
CONTAINERS = {
    "default": ([*DOCKER_DEFAULT, "--pid-namespace"], "chroot"),
    "restricted": (["--profile", "docker-default", "--pid-namespace", "--uid", str(unprivileged.NOBODY)], "landlock"),
}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def spawn_times(argv: list[str], count: int) -> list[float]:
    times = []
    for _ in range(count):
        started = time.perf_counter()
        subprocess.run(argv, env={}, check=True)
        times.append(time.perf_counter() - started)
    return times


def spawn_cpu(argv: list[str], count: int) -> float:
    """CPU seconds (user and system) one start of argv costs, outside any jail: a floor for a run of it."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    for _ in range(count):
        subprocess.run(argv, env={}, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) / count


def _body(language: str, code: str) -> bytes:
    return json.dumps({"language": language, "code": code, "preload": "", "enable_network": True}).encode()


HEADERS = {"X-Api-Key": API_KEY, "Content-Type": "application/json"}


def _correct(answer: dict, expected: str) -> bool:
    data = answer.get("data") or {}
    return answer.get("code") == 0 and data.get("exit_code") == 0 and data.get("stdout") == expected


def drive(
    port: int, language: str, code: str, clients: int, total: int, rate: float | None = None
) -> tuple[list[float], float]:
    """total runs from `clients` connections; with `rate`, each client paces itself to rate/clients per second."""
    body = _body(language, code)
    latencies: list[float] = []
    failures: list[dict] = []
    lock = threading.Lock()

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port)
        mine = []
        interval = clients / rate if rate else 0.0
        next_at = time.perf_counter()
        for _ in range(total // clients):
            if interval:
                time.sleep(max(0.0, next_at - time.perf_counter()))
                next_at += interval
            started = time.perf_counter()
            conn.request("POST", "/v1/sandbox/run", body, HEADERS)
            answer = json.loads(conn.getresponse().read())
            mine.append(time.perf_counter() - started)
            if not _correct(answer, "hi\n"):
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


def machine_busy() -> float:
    """CPU seconds the whole machine has spent busy (not idle, not waiting for I/O) since boot."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / HZ


class Cgroup:
    """A cpuacct cgroup (v1) a service is started in: CPU of its whole tree, dead processes included."""

    def __init__(self, name: str):
        self.path = os.path.join(CPUACCT, f"sandlot-bench-{name}-{os.getpid()}")
        self.usable = os.geteuid() == 0 and os.path.isdir(CPUACCT)
        if self.usable:
            os.makedirs(self.path, exist_ok=True)
            os.chmod(os.path.join(self.path, "cgroup.procs"), 0o666)  # a service started as nobody joins it itself

    def launcher(self) -> list[str]:
        if not self.usable:
            return []
        return ["sh", "-c", f'echo $$ > {self.path}/cgroup.procs && exec "$@"', "--"]

    def seconds(self) -> float:
        if not self.usable:
            return float("nan")
        with open(os.path.join(self.path, "cpuacct.usage")) as f:
            return int(f.read()) / 1e9

    def remove(self) -> None:
        if not self.usable:
            return
        for _ in range(50):
            try:
                os.rmdir(self.path)
                return
            except OSError:
                time.sleep(0.1)  # the last processes are still leaving


def alone_memory(pids: list[int]) -> float:
    """What the tree would hold on a machine of its own, MiB: anonymous memory as PSS (only these processes
    share it), and each mapped file's resident pages once (PSS divides a file's pages among every process
    that maps it, other services' included: another room's nodes make a node binary look cheap)."""
    anon = 0
    files: dict[str, int] = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                anon += sum(int(line.split()[1]) for line in f if line.startswith(("Pss_Anon:", "Pss_Shmem:")))
            with open(f"/proc/{pid}/smaps") as f:
                path, rss = "", 0
                for line in f:
                    head = line.split(None, 1)[0]
                    if head == "Rss:":
                        rss = int(line.split()[1])
                    elif head == "Anonymous:":
                        if path:
                            files[path] = max(files.get(path, 0), rss - int(line.split()[1]))
                    elif not head.endswith(":"):  # a mapping's first line: its range, then its file if any
                        fields = line.split()
                        path = fields[5] if len(fields) > 5 and fields[5].startswith("/") else ""
        except OSError:
            continue
    return (anon + sum(files.values())) / 1024


def tree_memory(root: int) -> tuple[float, list[tuple[int, int, float, str]]]:
    """PSS of root and every process below it, MiB, and (pid, ppid, MiB, command) for each."""
    rows = []
    for pid in [root, *descendants(root)]:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                pss = next(int(line.split()[1]) for line in f if line.startswith("Pss:"))
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, StopIteration):
            continue
        rows.append((pid, ppid, pss / 1024, command))
    return sum(r[2] for r in rows), rows


def describe(command: str) -> str:
    if command.startswith("/usr/bin/node") or "/node " in command.split(" -")[0]:
        return "node (ready)"
    if "handler.cli" in command:
        return "service"
    if "handler/pid_one.py" in command:
        return "pid 1 of the container (pid_one.py)"
    if "runtimes.jail.zygote" in command:  # runtimes.jail.zygote.loop, or a release before the layout
        return "zygote or its child (" + ("nodejs" if "runtimes.nodejs.runner" in command else "python3") + ")"
    return command[:40]


@dataclass
class Subject:
    """One release under test: its checkout, its service, what was measured of it."""

    label: str
    source: str
    unprivileged: bool
    jail: str = ""  # SANDLOT_JAIL
    container: str = ""  # in a stand-in of CONTAINERS
    service: Service | None = None
    cgroup: Cgroup | None = None
    samples: dict[str, list[float]] = field(default_factory=dict)

    def make_service(self, cgroup: Cgroup | None) -> Service:
        env = {"MAX_WORKERS": "4", "MAX_REQUESTS": "100", **({"SANDLOT_JAIL": self.jail} if self.jail else {})}
        as_nobody = self.unprivileged or self.container == "restricted"
        service = unprivileged.service(**env) if as_nobody else Service(**env)
        service.source = service.cwd = self.source
        container = standin(CONTAINERS[self.container][0]) if self.container else []
        if self.container == "restricted":
            service.user = None  # the stand-in changes to nobody, after its filter is loaded as root
        elif self.container:  # layer builds there run as their uid without a tree: an interpreter it may run
            service.python = unprivileged.venv_python()
        service.launcher = (cgroup.launcher() if cgroup is not None else []) + container
        return service

    def check_mode(self) -> None:
        """In a stand-in: both runtimes serve in the mode it must pick (a bench of the wrong jail is no row)."""
        if not self.container:
            return
        expected = CONTAINERS[self.container][1]
        with self.service.client() as client:
            runtimes = client.get("/v1/sandbox/health").json()["data"]["runtimes"]
        found = {language: runtime["protections"].get("mode") for language, runtime in runtimes.items()}
        if set(found.values()) != {expected}:
            raise SystemExit(f"{self.label}: expected the {expected} jail in the {self.container} stand-in: {found}")

    def root(self) -> int:
        """The service's main process: in the container stand-in, pid 1 of its namespace below the launcher,
        which stands for the container runtime and is not counted."""
        pid = self.service.process.pid
        return descendants(pid)[0] if self.container else pid

    def add(self, row: str, *values: float) -> None:
        self.samples.setdefault(row, []).extend(values)

    def start(self) -> None:
        self.cgroup = Cgroup(self.label.replace(" ", "-"))
        self.service = self.make_service(self.cgroup).start()
        self.check_mode()

    def stop(self) -> None:
        if self.service is not None:
            self.service.stop()
        if self.cgroup is not None:
            self.cgroup.remove()


def process_cpu(pid: int) -> float:
    """CPU seconds (user and system) the live process has used so far, its reaped children not counted."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def first_correct_runs(subject: Subject, deadline: float = 60.0) -> None:
    """Exec a fresh service, then ask for a python and a node run every 5 ms until each is answered right; the
    CPU its tree (a cgroup of its own) and its own process had used when the first python run was answered."""
    cgroup = Cgroup(subject.label.replace(" ", "-") + "-start")
    service = subject.make_service(cgroup)
    found: dict[str, float] = {}
    cpu: dict[str, float] = {}
    refusals = {"python3": 0, "nodejs": 0}
    health: list[float] = []

    def poll(language: str, code: str) -> None:
        body = _body(language, code)
        while time.perf_counter() - started < deadline:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", service.port, timeout=deadline)
                conn.request("POST", "/v1/sandbox/run", body, HEADERS)
                answer = json.loads(conn.getresponse().read())
                conn.close()
            except OSError:
                time.sleep(0.005)
                continue
            if _correct(answer, "hi\n"):
                found[language] = time.perf_counter() - started
                if language == "python3":
                    cpu["tree"], cpu["service"] = cgroup.seconds(), process_cpu(subject_pid(subject, service))
                return
            refusals[language] += 1
            time.sleep(0.005)

    def watch_health() -> None:
        while time.perf_counter() - started < deadline and not health:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", service.port, timeout=5)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    health.append(time.perf_counter() - started)
                conn.close()
            except OSError:
                pass
            time.sleep(0.005)

    threads = [
        threading.Thread(target=poll, args=("python3", PYTHON_HELLO)),
        threading.Thread(target=poll, args=("nodejs", NODE_HELLO)),
        threading.Thread(target=watch_health),
    ]
    started = time.perf_counter()
    service.start(wait=False)
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        after, _rate = drive(service.port, "python3", PYTHON_HELLO, 1, 20)
    finally:
        service.stop()
        cgroup.remove()
    if len(found) < 2:
        raise SystemExit(f"{subject.label}: no correct run within {deadline} s: {found}\n{service.output()[-3000:]}")
    marks = start_marks(service.output())
    for mark in START_MARKS:
        subject.add(f"start mark: {mark}", marks.get(mark, float("nan")))
    subject.add("start: load", os.getloadavg()[0])
    subject.add("start: python", found["python3"])
    subject.add("start: node", found["nodejs"])
    subject.add("start: /health 200", health[0] if health else float("nan"))
    subject.add("start: refusals", refusals["python3"] + refusals["nodejs"])
    subject.add("start: CPU of the tree", cpu["tree"])
    subject.add("start: CPU of the service", cpu["service"])
    subject.add("first 20 python runs after start", *after)


def subject_pid(subject: Subject, service: Service) -> int:
    """The service's own process: the one started (the cgroup's launcher execs into it), or in a container
    stand-in the first below the launcher (as Subject.root)."""
    pid = service.process.pid
    below = descendants(pid) if subject.container else []
    return below[0] if below else pid


def start_marks(output: str) -> dict[str, float]:
    """The service's own start timeline (seconds after exec), from its `started` log line; {} where it logs none
    (older releases)."""
    for line in output.splitlines():
        if line.startswith("{") and '"start_marks"' in line:
            try:
                return json.loads(line)["start_marks"]
            except (ValueError, KeyError):
                return {}
    return {}


def measure_block(subject: Subject, requests: int) -> None:
    port = subject.service.port
    latencies, _ = drive(port, "python3", PYTHON_HELLO, 1, requests)
    subject.add("python hello, 1 client", *latencies)
    busy, tree = machine_busy(), subject.cgroup.seconds()
    _, rate = drive(port, "python3", PYTHON_HELLO, 4, requests)
    subject.add("python cpu machine", (machine_busy() - busy) / requests)
    subject.add("python cpu tree", (subject.cgroup.seconds() - tree) / requests)
    subject.add("python hello, 4 clients", rate)
    node_requests = max(20, requests // 2)
    busy, tree = machine_busy(), subject.cgroup.seconds()
    _, rate = drive(port, "nodejs", NODE_HELLO, 4, node_requests)
    subject.add("node cpu machine", (machine_busy() - busy) / node_requests)
    subject.add("node cpu tree", (subject.cgroup.seconds() - tree) / node_requests)
    subject.add("node hello, 4 clients", rate)
    paced, _ = drive(port, "nodejs", NODE_HELLO, 1, 20, rate=10)
    subject.add("node hello, paced 10/s", *paced)


def checkout(commit: str) -> str:
    """The commit's tree under /var/tmp (kept for later runs): its own service, beside this one."""
    resolved = subprocess.run(
        ["git", "-C", REPO, "rev-parse", "--short=12", commit], capture_output=True, text=True, check=True
    ).stdout.strip()
    path = f"/var/tmp/sandlot-bench-{resolved}"
    if not os.path.isdir(path):
        scratch = path + ".partial"
        shutil.rmtree(scratch, ignore_errors=True)
        os.makedirs(scratch)
        archive = subprocess.Popen(["git", "-C", REPO, "archive", resolved], stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", scratch], stdin=archive.stdout, check=True)
        archive.wait()
        os.chmod(scratch, 0o755)
        os.rename(scratch, path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", help="a commit to measure beside this tree (e.g. 5d5d6ef)")
    parser.add_argument("--blocks", type=int, default=6, help="alternating blocks per service")
    parser.add_argument("--requests", type=int, default=100, help="python runs per row and block (node: half)")
    parser.add_argument("--starts", type=int, default=3, help="fresh starts per service for the start rows")
    parser.add_argument("--starts-only", action="store_true", help="the start rows alone (no blocks, no idle)")
    parser.add_argument("--unprivileged", action="store_true", help="the services as nobody (no root)")
    parser.add_argument("--jail", default="", help="SANDLOT_JAIL for the services (e.g. chroot, next to full)")
    parser.add_argument(
        "--container",
        nargs="?",
        const="default",
        default="",
        choices=[*CONTAINERS, "both"],
        help="the services in the stand-in for a default container (chroot, the default), a restricted pod "
        "(landlock), or both side by side",
    )
    parser.add_argument(
        "--relative",
        action="store_true",
        help="also every time, rate and CPU row as a ratio to the bare interpreter spawns measured in the same run "
        "(where absolute times mean little: an emulated machine)",
    )
    args = parser.parse_args()

    containers = list(CONTAINERS) if args.container == "both" else [args.container]
    subjects = []
    for container in containers:
        kind = {"unprivileged": args.unprivileged, "jail": args.jail, "container": container}
        mode = f" {CONTAINERS[container][1]}" if args.container == "both" else ""
        if args.base:
            subjects.append(Subject(f"base {args.base}{mode}", checkout(args.base), **kind))
        subjects.append(Subject(f"this{mode}".strip(), REPO, **kind))
    # the ratio columns: each tree against the base in the same stand-in, and landlock against chroot
    ratios = []
    if args.base:
        for i in range(1, len(subjects), 2):
            ratios.append((i, i - 1, f"this/base {subjects[i].label.removeprefix('this')}".strip()))
    if args.container == "both":
        ratios.append((len(subjects) - 1, len(subjects) // 2 - 1, "landlock/chroot"))
    python = default_python()
    print(f"load average at the start: {os.getloadavg()[0]:.2f} (2 cores: above ~0.3, other work shares them)")

    for _ in range(args.starts):  # one at a time: a start measures the machine's whole attention
        for subject in subjects:
            first_correct_runs(subject)
    if args.starts_only:
        report_starts(subjects, ratios)
        return
    spawns: list[float] = []
    node_starts: list[float] = []
    node_spawns: list[float] = []
    python_starts: list[float] = []
    memory: dict[str, tuple[float, list]] = {}
    try:
        for subject in subjects:
            subject.start()
            drive(subject.service.port, "python3", PYTHON_HELLO, 4, 100)  # warm-up
            drive(subject.service.port, "nodejs", NODE_HELLO, 4, 40)
        time.sleep(5)  # what the service holds just after load
        for subject in subjects:
            memory[f"{subject.label} after load"] = tree_memory(subject.root())
        time.sleep(IDLE_PAUSE - 5)  # idle: what it holds at rest
        for subject in subjects:
            memory[subject.label] = tree_memory(subject.root())
            root = subject.root()
            memory[f"{subject.label} alone"] = (alone_memory([root, *descendants(root)]), [])
        loads = []
        for _ in range(args.blocks):
            spawns += spawn_times([python, "-I", "-S", "-c", "pass"], 10)
            node_starts.append(spawn_cpu([RuntimeConfig().nodejs_path, "-e", "0"], 10))
            node_spawns += spawn_times([RuntimeConfig().nodejs_path, "-e", ""], 10)
            if args.relative:
                python_starts.append(spawn_cpu([python, "-I", "-S", "-c", "pass"], 10))
            for subject in subjects:
                measure_block(subject, args.requests)
            loads.append(os.getloadavg()[0])
    finally:
        for subject in subjects:
            subject.stop()
    node_bound = (os.cpu_count() or 1) / statistics.median(node_spawns)
    report(subjects, ratios, statistics.median(spawns), statistics.median(node_starts), memory, loads, node_bound)
    if args.relative:
        spawned = {
            "python": statistics.median(spawns),
            "python cpu": statistics.median(python_starts),
            "node": statistics.median(node_spawns),
            "node cpu": statistics.median(node_starts),
        }
        report_relative(subjects, ratios, spawned)


def report_relative(subjects: list[Subject], ratios: list[tuple[int, int, str]], spawned: dict[str, float]) -> None:
    """The rows as ratios to the bare interpreter spawns of the same run (spawned: the p50 of a `python -I -S -c
    pass` and of a `node -e ""` spawn, and the CPU of one start of each): what a run costs beyond starting an
    interpreter, on a machine whose absolute speed means nothing (software emulation)."""
    cores = os.cpu_count() or 1
    print(f"\nrelative to this machine's bare interpreter spawns ({cores} cores):")
    print(f"  python spawn p50 {spawned['python'] * 1000:.1f} ms, CPU {spawned['python cpu'] * 1000:.1f} ms;", end="")
    print(f" node spawn p50 {spawned['node'] * 1000:.1f} ms, CPU {spawned['node cpu'] * 1000:.1f} ms")
    line = _table(subjects, ratios, "row / the bare spawn's")

    def pct(row: str, q: float) -> list[float]:
        return [percentile(s.samples[row], q) if s.samples.get(row) else float("nan") for s in subjects]

    def med(row: str) -> list[float]:
        return _medians(subjects, row)

    python_bound, node_bound = cores / spawned["python"], cores / spawned["node"]
    line(
        "python hello, 1 client, p50 / spawn p50",
        [v / spawned["python"] for v in pct("python hello, 1 client", 0.5)],
        "x",
    )
    line(
        "python hello, 1 client, p90 / spawn p50",
        [v / spawned["python"] for v in pct("python hello, 1 client", 0.9)],
        "x",
    )
    line("python hello, 4 clients / cores per spawn", [v / python_bound for v in med("python hello, 4 clients")], "x")
    line("  CPU per run (machine) / a spawn's CPU", [v / spawned["python cpu"] for v in med("python cpu machine")], "x")
    line("node hello, 4 clients / cores per spawn", [v / node_bound for v in med("node hello, 4 clients")], "x")
    line("  CPU per run (machine) / a spawn's CPU", [v / spawned["node cpu"] for v in med("node cpu machine")], "x")
    line(
        "node hello, paced 10/s, p50 / spawn p50",
        [v / spawned["node"] for v in pct("node hello, paced 10/s", 0.5)],
        "x",
    )


def report(
    subjects: list[Subject],
    ratios: list[tuple[int, int, str]],
    spawn: float,
    node_start: float,
    memory: dict,
    loads: list[float],
    node_bound: float = float("nan"),
) -> None:
    """One table, a column per subject, then a column per ratio (ratios: numerator's and denominator's index)."""
    ms = 1000
    print(f"load average during the blocks: {min(loads):.2f}-{max(loads):.2f}")
    print(f"reference: spawn of `python -I -S -c pass`: p50 {spawn * ms:.2f} ms")
    print(f"reference: CPU of one `node -e 0` start, outside any jail: {node_start * ms:.2f} ms")
    print(f'reference: the bare-node bound, {os.cpu_count()} cores / p50 of a `node -e ""` spawn: {node_bound:.1f}/s')
    line = _table(subjects, ratios, "row")

    def med(row: str) -> list[float]:
        return _medians(subjects, row)

    def pct(row: str, q: float) -> list[float]:
        return [percentile(s.samples[row], q) if s.samples.get(row) else float("nan") for s in subjects]

    p50 = pct("python hello, 1 client", 0.5)
    line("python hello, 1 client, p50", [v * ms for v in p50], "ms")
    line("python hello, 1 client, p90", [v * ms for v in pct("python hello, 1 client", 0.9)], "ms")
    line("  p50 / spawn (target <= 0.35)", [v / spawn for v in p50], "x")
    p90 = pct("python hello, 1 client", 0.9)
    line("  p90 / p50 (target <= 2)", [a / b for a, b in zip(p90, p50, strict=True)], "x")
    line("python hello, 4 clients (target >= 1.2x base)", med("python hello, 4 clients"), "/s")
    line("  CPU per run, whole machine (target <= 7)", [v * ms for v in med("python cpu machine")], "ms")
    line("  CPU per run, service tree", [v * ms for v in med("python cpu tree")], "ms")
    line("node hello, 4 clients (target >= 1.15x base)", med("node hello, 4 clients"), "/s")
    line("  / the bare-node bound (target >= 0.85)", [v / node_bound for v in med("node hello, 4 clients")], "x")
    line("  CPU per run, whole machine", [v * ms for v in med("node cpu machine")], "ms")
    line("  CPU per run, service tree", [v * ms for v in med("node cpu tree")], "ms")
    if any(head.startswith("this/base") for _n, _d, head in ratios):
        # what 1.15x the base's runs/s leaves a run, against what node's own start costs
        budget = med("node cpu machine")[0] / 1.15
        print(
            f"  the target leaves a run {budget * ms:.2f} ms of the whole machine's CPU; node's start alone: "
            f"{node_start * ms:.2f} ms"
        )
    line("node hello, paced 10/s, p50", [v * ms for v in pct("node hello, paced 10/s", 0.5)], "ms")
    line("PSS of the service tree 5 s after load", [memory[f"{s.label} after load"][0] for s in subjects], "Mi")
    line(f"idle ({IDLE_PAUSE} s) PSS of the service tree (<= 80)", [memory[s.label][0] for s in subjects], "Mi")
    line("  the same on a machine of its own (estimate)", [memory[f"{s.label} alone"][0] for s in subjects], "Mi")
    line("idle processes in the service tree", [len(memory[s.label][1]) for s in subjects], "")
    report_starts(subjects, ratios, line)
    print("\nidle service tree (PSS MiB, process):")
    for subject in subjects:
        total, rows = memory[subject.label]
        print(f"  {subject.label}: {total:.1f} MiB in {len(rows)} processes")
        kinds: dict[str, list[float]] = {}
        for _pid, _ppid, pss, command in rows:
            kinds.setdefault(describe(command), []).append(pss)
        for kind, values in sorted(kinds.items(), key=lambda kv: -sum(kv[1])):
            print(f"    {len(values):3d} x {kind:40} {sum(values):7.1f} MiB")


def _table(subjects: list[Subject], ratios: list[tuple[int, int, str]], title: str):
    """Print a table's head; the function that prints one of its rows (none where nothing was measured)."""
    labels = [s.label for s in subjects]
    width = max(18, *(len(label) + 2 for label in labels))
    heads = "".join(f"{head:>{max(12, len(head) + 2)}}" for _n, _d, head in ratios)
    print(f"{title:44}" + "".join(f"{label:>{width}}" for label in labels) + heads)

    def line(name: str, values: list[float], unit: str) -> None:
        if all(v != v for v in values):
            return  # not measured in this run (--starts 0)
        cells = "".join(f"{v:>{width - 3}.2f} {unit:2}" for v in values)
        columns = ""
        for numerator, denominator, head in ratios:
            ratio = f"{values[numerator] / values[denominator]:.2f}x" if values[denominator] else "-"
            columns += f"{ratio:>{max(12, len(head) + 2)}}"
        print(f"{name:44}{cells}{columns}")

    return line


def _medians(subjects: list[Subject], row: str) -> list[float]:
    """Each subject's median of a row, nan where nothing was measured (the start rows with --starts 0)."""
    return [statistics.median(s.samples[row]) if s.samples.get(row) else float("nan") for s in subjects]


def report_starts(subjects: list[Subject], ratios: list[tuple[int, int, str]], line=None) -> None:
    """The start rows (medians over the starts), in report()'s table or, with --starts-only, a table of their
    own."""
    ms = 1000
    if line is None:
        line = _table(subjects, ratios, "row (median of the starts)")

    def med(row: str) -> list[float]:
        return _medians(subjects, row)

    line("start: exec -> first python run (<= 0.4)", med("start: python"), "s")
    line("  CPU before it: the service tree", med("start: CPU of the tree"), "s")
    line("  CPU before it: the service process", med("start: CPU of the service"), "s")
    line("start: exec -> first node run (<= 1.5)", med("start: node"), "s")
    line("start: exec -> /health 200", med("start: /health 200"), "s")
    for mark in START_MARKS:  # the service's own log of its start (older releases log none)
        line(f"  start: {mark}, after exec", med(f"start mark: {mark}"), "s")
    line("  load during the starts", med("start: load"), "")
    refusals = [max(s.samples.get("start: refusals") or [float("nan")]) for s in subjects]
    line("start: refusals while starting (target 0)", refusals, "")
    line("first 20 python runs after start, p50", [v * ms for v in med("first 20 python runs after start")], "ms")
    if len(subjects[0].samples.get("start: python") or ()) > 1:
        for subject in subjects:  # each start, for the spread (the machine's load changes by the second)
            shown = ", ".join(f"{v:.2f}" for v in subject.samples["start: python"])
            print(f"  {subject.label}: exec -> first python run, each start: {shown} s")


if __name__ == "__main__":
    main()
