"""Issue 19, in every mode this machine runs: no channel between two concurrent runs through the page
cache or machine-wide counters, no host identity (uptime, /etc/hosts), threads at the default memory limit.

Modes are built by MODES (name -> how to make its service): a new mode is one more entry. Cross-run
cases run two runs at once, the second posted a second after the first, and each run prints what it
tried and what worked; the page-cache pair is also run as plain processes on the host, where the same
code does pass the byte, so that the jail's answer is not an accident of the test.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest
import unprivileged
from service import DOCKER_DEFAULT, IS_ROOT, Service, output, require_namespaces, standin, together

from runtimes.jail.policy.tree_files import run_hosts


def _auto() -> Service:
    return Service()


def _reduced() -> Service:
    if not IS_ROOT:
        pytest.skip("reduced as root is what this mode tests; without root it is the auto mode")
    return Service(SANDLOT_JAIL="reduced")


def _unprivileged() -> Service:
    if unprivileged.unavailable():
        pytest.skip(unprivileged.unavailable())
    return unprivileged.service()


def _container() -> Service:
    """The chroot mode: root in the stand-in for a container on default privileges (tests/service.py)."""
    if not IS_ROOT:
        pytest.skip("the stand-in for a container narrows root's privileges")
    return Service(launcher=standin(DOCKER_DEFAULT))


MODES = {"auto": _auto, "reduced": _reduced, "unprivileged": _unprivileged, "container": _container}


@pytest.fixture(scope="module", params=list(MODES))
def jail(request):
    require_namespaces(request.param)  # under the stand-in switch `auto` is `container` as well
    svc = MODES[request.param]()
    svc.started_at = time.time()
    svc.start()
    svc.mode = request.param
    yield svc
    svc.stop()


# ---- the page cache ------------------------------------------------------------------------------

SECRET = 0xA5
PAGES = 8
# A file every run can read: one of the dependency layer (the service's own uid owns it without root,
# and the kernel honours MADV_PAGEOUT and mincore for a file's owner), or PAGE_CACHE_FILE.
_FILE = (
    "import os\n"
    "F = os.environ.get('PAGE_CACHE_FILE')\n"
    "if not F:\n"
    "    import idna\n"
    "    F = os.path.join(os.path.dirname(idna.__file__), 'uts46data.py')\n"
    "PAGE, PAGES, FIRST = 4096, 8, 16\n"
    "fd = os.open(F, os.O_RDONLY)\n"
)
# Makes the eight pages cached, then evicts those whose bit is 1 by every means it has, and holds.
SENDER = (
    _FILE + "import ctypes, time\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]\n"
    f"BYTE = {SECRET}\n"
    "os.pread(fd, PAGES * PAGE, FIRST * PAGE)\n"
    "worked = set()\n"
    "libc.mmap.restype = ctypes.c_void_p\n"
    "libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]\n"
    "mapped = libc.mmap(None, (FIRST + PAGES) * PAGE, 1, 2, fd, 0)\n"
    "libc.madvise(mapped, (FIRST + PAGES) * PAGE, 1)  # MADV_RANDOM: a fault reads no neighbour back in\n"
    "ones = [FIRST + i for i in range(PAGES) if BYTE >> i & 1]\n"
    "for page in ones:\n"
    "    ctypes.c_char.from_address(mapped + page * PAGE).value  # mapped, so that madvise acts on it\n"
    "    for name, advice in (('pageout', 21), ('cold', 20)):\n"
    "        if libc.madvise(mapped + page * PAGE, PAGE, advice) == 0:\n"
    "            worked.add(name)\n"
    "libc.munmap(ctypes.c_void_p(mapped), (FIRST + PAGES) * PAGE)  # a page mapped anywhere stays cached\n"
    "for page in ones:\n"
    "    try:\n"
    "        os.posix_fadvise(fd, page * PAGE, PAGE, os.POSIX_FADV_DONTNEED)\n"
    "        worked.add('fadvise')\n"
    "    except OSError:\n"
    "        pass\n"
    "print('evictions:', sorted(worked), flush=True)\n"
    "time.sleep(3)\n"
)
# Reads nothing (reading would cache the pages): asks whether each page is cached, by every means it has.
RECEIVER = (
    _FILE + "import ctypes\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "libc.mmap.restype = ctypes.c_void_p\n"
    "libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]\n"
    "libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]\n"
    "answers = {}\n"
    "mapped = libc.mmap(None, (FIRST + PAGES) * PAGE, 1, 2, fd, 0)\n"
    "vec = ctypes.create_string_buffer(FIRST + PAGES)\n"
    "if libc.mincore(mapped, (FIRST + PAGES) * PAGE, vec) == 0:\n"
    "    answers['mincore'] = [1 - (vec.raw[FIRST + i] & 1) for i in range(PAGES)]\n"
    "bits = {}\n"
    "try:\n"
    "    for i in reversed(range(PAGES)):  # a miss starts a read-ahead of the pages after it\n"
    "        try:\n"
    "            os.preadv(fd, [bytearray(1)], (FIRST + i) * PAGE, os.RWF_NOWAIT)\n"
    "            bits[i] = 0\n"
    "        except BlockingIOError:\n"
    "            bits[i] = 1\n"
    "    answers['nowait'] = [bits[i] for i in range(PAGES)]\n"
    "except OSError:\n"
    "    pass\n"
    "for name, bits in sorted(answers.items()):\n"
    "    print(name, hex(sum(b << i for i, b in enumerate(bits))))\n"
    "print('probes:', sorted(answers))\n"
)


def test_the_page_cache_pair_passes_a_byte_between_plain_processes(tmp_path):
    """The control: the same two programs, as plain processes on the host, on a file on disk."""
    if not IS_ROOT:
        pytest.skip("evicting a page another process shares is what is shown; as root here")
    directory = tempfile.mkdtemp(dir="/var/tmp")
    try:
        path = os.path.join(directory, "shared")
        with open(path, "wb") as f:
            f.write(os.urandom(32 * 4096))
        os.sync()
        env = {**os.environ, "PAGE_CACHE_FILE": path}
        sender = subprocess.Popen([sys.executable, "-c", SENDER], env=env, stdout=subprocess.PIPE, text=True)
        time.sleep(1)
        received = subprocess.run([sys.executable, "-c", RECEIVER], env=env, capture_output=True, text=True)
        sent = sender.communicate(timeout=30)[0]
    finally:
        subprocess.run(["rm", "-rf", directory], check=True)
    if "fadvise" not in sent:
        pytest.skip(f"this filesystem keeps pages fadvise asks to drop: {sent}")
    # a busy machine can flip a bit of one probe's reading (readahead, reclaim): the byte crossing through
    # either of them shows the channel
    crossed = [probe for probe in ("nowait", "mincore") if f"{probe} {hex(SECRET)}" in received.stdout]
    assert crossed, (sent, received.stdout, received.stderr)


def test_two_runs_cannot_pass_a_byte_through_the_page_cache(jail):
    sent, received = together(jail, SENDER, RECEIVER)
    assert sent == "evictions: []\n"  # fadvise DONTNEED, MADV_PAGEOUT and MADV_COLD refused
    assert received == "probes: []\n"  # preadv2 RWF_NOWAIT and mincore refused


def test_cachestat_is_refused(jail):
    code = (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "fd = os.open(os.__file__, os.O_RDONLY)\n"
        "range_, stat = ctypes.create_string_buffer(16), ctypes.create_string_buffer(64)\n"
        "print(libc.syscall(451, fd, range_, stat, 0), ctypes.get_errno())"
    )
    assert output(jail, code) == "-1 1\n"


# ---- machine-wide counters ----------------------------------------------------------------------

SYSINFO = (
    "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    "class Sysinfo(ctypes.Structure):\n"
    "    _fields_ = [('uptime', ctypes.c_long), ('loads', ctypes.c_ulong * 3), ('totalram', ctypes.c_ulong),\n"
    "                ('freeram', ctypes.c_ulong), ('sharedram', ctypes.c_ulong), ('bufferram', ctypes.c_ulong),\n"
    "                ('totalswap', ctypes.c_ulong), ('freeswap', ctypes.c_ulong), ('procs', ctypes.c_ushort),\n"
    "                ('pad', ctypes.c_char * 256)]\n"
    "def procs():\n"
    "    info = Sysinfo()\n"
    "    if libc.sysinfo(ctypes.byref(info)) != 0:\n"
    "        raise OSError(ctypes.get_errno(), 'sysinfo')\n"
    "    return info.procs\n"
)
# Starts 37 threads 1.5 s in, for 2 s: the machine's process count rises by 37 while they live.
COUNT_SENDER = (
    "import threading, time\nstop = threading.Event()\ntime.sleep(1.5)\n"
    "threads = [threading.Thread(target=stop.wait) for _ in range(37)]\n"
    "for t in threads:\n    t.start()\ntime.sleep(2)\nstop.set()\nprint('held', len(threads), 'threads')"
)
# Posted a second later: the count before the sender's threads, and while they live.
COUNT_RECEIVER = (
    SYSINFO + "import time\n"
    "try:\n    before = procs()\n    time.sleep(1.5)\n    print('received', procs() - before)\n"
    "except OSError as e:\n    print('sysinfo refused', e.errno)"
)


# Makes 37 files in its /tmp 1.5 s in: where /tmp is a directory of the host's disk (the chroot mode), the
# disk's free inodes fall by 37 while they are there.
INODE_SENDER = (
    "import os, time\ntime.sleep(1.5)\n"
    "for n in range(37):\n    open(f'f{n}', 'w').close()\n"
    "time.sleep(2)\nprint('made', len(os.listdir('.')), 'files')"
)
INODE_RECEIVER = (
    "import os, time\n"
    "try:\n    before = os.statvfs('.').f_ffree\n    time.sleep(1.5)\n"
    "    print('received', before - os.statvfs('.').f_ffree)\n"
    "except OSError as e:\n    print('statvfs refused', e.errno)"
)


COUNTERS = {  # a machine-wide counter: (sender, receiver, what each prints)
    "process count": (COUNT_SENDER, COUNT_RECEIVER, ("held 37 threads\n", "sysinfo refused 1\n")),
    "free inodes": (INODE_SENDER, INODE_RECEIVER, ("made 37 files\n", "statvfs refused 1\n")),
}


@pytest.mark.parametrize("counter", list(COUNTERS))
def test_two_runs_cannot_pass_a_byte_through_a_machine_wide_counter(jail, counter):
    sender, receiver, printed = COUNTERS[counter]
    assert tuple(together(jail, sender, receiver)) == printed


def test_no_filesystems_size_tells_the_machines_memory(jail):
    """The tree's root is a tmpfs, whose default size and inode count are a share of the machine's memory."""
    code = (
        "import os\nfor path in ('/', '/tmp', os.path.dirname(os.__file__)):\n"
        "    try:\n        print(os.statvfs(path).f_files)\n    except OSError as e:\n        print(e.errno)\n"
    )
    assert output(jail, code) == "1\n1\n1\n"
    node = (
        "const fs = require('fs');\nfor (const path of ['/', '/tmp']) {\n"
        "  try { console.log(fs.statfsSync(path).files); } catch (e) { console.log(e.code); }\n}"
    )
    assert output(jail, node, language="nodejs") == "EPERM\nEPERM\n"


def test_python_learns_the_runs_memory_not_the_machines(jail):
    code = (
        "import os\npages = os.sysconf('SC_PHYS_PAGES'), os.sysconf('SC_AVPHYS_PAGES')\n"
        "print([p * os.sysconf('SC_PAGE_SIZE') >> 20 for p in pages], os.cpu_count() > 0)\n"
        "try:\n    os.getloadavg()\nexcept OSError:\n    print('no load average')"
    )
    assert output(jail, code, memory_limit_mb=300) == "[300, 300] True\nno load average\n"


def _run_hostname(jail) -> str:
    """A UTS namespace per run: "sandbox"; the chroot mode has none: the machine's (a container's) own."""
    return os.uname().nodename if jail.mode == "container" else "sandbox"


def _time_namespace(jail) -> bool:
    """Every mode but the chroot one: CLONE_NEWTIME needs CAP_SYS_ADMIN, which a default container lacks."""
    in_force = jail.detail()["runtimes"]["python3"]["protections"]["time_namespace"]
    assert in_force is (jail.mode != "container")
    return in_force


def test_node_os_answers_without_the_machines_counters(jail):
    code = (
        "const os = require('os')\n"
        "console.log(os.totalmem(), os.freemem(), JSON.stringify(os.loadavg()), os.uptime() < 600,"
        " os.availableParallelism() > 0, os.hostname())"
    )
    small_uptime = str(_time_namespace(jail)).lower()
    assert output(jail, code, language="nodejs") == f"0 0 [0,0,0] {small_uptime} true {_run_hostname(jail)}\n"


# ---- host identity ------------------------------------------------------------------------------

CLOCKS = (
    "import time\n"
    "boot, mono = time.clock_gettime(time.CLOCK_BOOTTIME), time.clock_gettime(time.CLOCK_MONOTONIC)\n"
    "print(round(time.time() - boot, 1), boot < 600, mono < 600)"
)


def test_times_does_not_tell_the_hosts_uptime(jail):
    """times() returns clock ticks since the host booted, which no time namespace shifts: it answers ENOSYS (as on a
    kernel without it; glibc hands the raw -38 on, so Python's os.times() says -0.38 s elapsed, not the host's
    uptime), and Python and Node start and run without it."""
    code = (
        "import ctypes, errno, os\nlibc = ctypes.CDLL(None, use_errno=True)\nanswer = libc.syscall(100, None)\n"
        "print(answer, errno.errorcode.get(ctypes.get_errno()), round(os.times().elapsed * os.sysconf('SC_CLK_TCK')))"
    )
    assert output(jail, code) == "-1 ENOSYS -38\n"
    node = "console.log(process.uptime() < 60, process.cpuUsage().user >= 0)"
    assert output(jail, node, language="nodejs") == "true true\n"


def test_a_run_reads_no_other_processes_cpu_clock(jail):
    """A negative clock id names a pid: the kernel reads any process's CPU time for whoever asks. Without a PID
    namespace (the chroot mode) that named 118 processes, the service and the zygotes among them, and carried a
    byte a second between two runs. Only the run's own clocks answer now."""
    code = (
        "import os, time\nme = os.getpid()\nnamed = []\n"
        "for pid in range(1, 65536):\n"
        "    if pid == me:\n        continue\n"
        "    try:\n        time.clock_getres((~pid << 3) | 2)\n        named.append(pid)\n"
        "    except OSError:\n        pass\n"
        "own = [time.clock_gettime(c) >= 0 for c in ((~me << 3) | 2, (~0 << 3) | 2, (~0 << 3) | 6,"
        " time.CLOCK_PROCESS_CPUTIME_ID, time.CLOCK_THREAD_CPUTIME_ID)]\n"
        "print(len(named), os.getppid() in named, all(own))"
    )
    assert output(jail, code) == "0 False True\n"


def test_a_run_cannot_grow_its_pipes_past_the_default(jail):
    """Pipe pages are counted per uid (fs.pipe-user-pages-soft): one run growing 127 pipes to 1 MiB passed the
    limit, which other runs of its uid read from a new pipe's size. Growing past 64 KiB is refused."""
    code = (
        "import fcntl, os\nr, w = os.pipe()\ntry:\n    fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 1 << 20)\n"
        "    print('grown')\nexcept PermissionError:\n    print('refused')\n"
        "print(fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 4096), fcntl.fcntl(r, fcntl.F_GETPIPE_SZ))"
    )
    assert output(jail, code) == "refused\n4096 4096\n"


def test_a_run_preallocates_only_what_its_file_size_shows(jail):
    """fallocate(FALLOC_FL_KEEP_SIZE) allocates past a file's size, which RLIMIT_FSIZE does not bound: the chroot
    mode's /tmp cap was walked past by 1 GiB so. It answers EOPNOTSUPP; posix_fallocate (mode 0) still works."""
    code = (
        "import ctypes, errno, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "fd = os.open(os.path.join(os.environ.get('TMPDIR', '/tmp'), 'f'), os.O_CREAT | os.O_RDWR, 0o600)\n"
        "answer = libc.fallocate(fd, 1, ctypes.c_long(0), ctypes.c_long(1 << 20))\n"
        "print(errno.errorcode.get(ctypes.get_errno()) if answer else 'allocated')\n"
        "os.posix_fallocate(fd, 0, 1 << 20)\nprint(os.fstat(fd).st_size)"
    )
    assert output(jail, code) in ("EOPNOTSUPP\n1048576\n", "ENOTSUP\n1048576\n")


def _host_boot() -> float:
    with open("/proc/uptime") as f:
        return time.time() - float(f.read().split()[0])


def test_a_runs_clocks_start_after_the_service_did_not_at_the_machines_boot(jail):
    if not _time_namespace(jail):
        pytest.skip("no time namespace in the chroot mode: its runs see the machine's uptime (README says so)")
    first, second = together(jail, CLOCKS + "\ntime.sleep(2)", CLOCKS)
    for answer in (first, second):
        booted, small_boot, small_mono = answer.split()
        assert (small_boot, small_mono) == ("True", "True"), answer
        # the run's "boot" is when its process was prepared: after the service started, long after the host
        assert float(booted) >= jail.started_at - 1, (answer, jail.started_at)
        assert abs(float(booted) - _host_boot()) > 5 or time.time() - _host_boot() < 60
    node = output(
        jail,
        "const t = process.hrtime(); console.log(require('os').uptime() < 600, t[0] < 600,"
        " performance.now() >= 0 && performance.now() < 60000)",
        language="nodejs",
    )
    assert node == "true true true\n"


def test_a_run_sees_a_hosts_file_and_hostname_of_its_own(jail):
    code = (
        "import socket\nprint(repr(open('/etc/hosts').read()))\n"
        "print(socket.gethostname(), socket.gethostbyname(socket.gethostname()), socket.gethostbyname('localhost'))"
    )
    answer = output(jail, code)
    hostname = _run_hostname(jail)
    hosts = run_hosts(hostname)  # localhost and the name uname() tells the run, nothing of the host's file
    assert answer == f"{hosts!r}\n{hostname} 127.0.0.1 127.0.0.1\n"
    if hostname == "sandbox":
        assert os.uname().nodename not in answer.replace("sandbox", "")
    node = output(
        jail,
        "const fs = require('fs'), os = require('os'); console.log(JSON.stringify(fs.readFileSync('/etc/hosts',"
        " 'utf8')), os.hostname())",
        language="nodejs",
    )
    assert node == f"{json.dumps(hosts)} {hostname}\n"


# ---- threads at the default memory limit ---------------------------------------------------------

PYTHON_THREADS = (
    "import threading\nalive = threading.Barrier(33)\nsizes = []\n"
    "def work():\n"
    "    data = [bytes(1000) for _ in range(1000)] + [bytearray(1 << 20)]  # about 2 MiB, small and large\n"
    "    sizes.append(len(data))\n"
    "    alive.wait()  # all 32 at once\n"
    "threads = [threading.Thread(target=work) for _ in range(32)]\n"
    "for t in threads:\n    t.start()\nalive.wait()\nfor t in threads:\n    t.join()\n"
    "print(len(sizes), 'threads')\n"
    "kept = bytearray(300 << 20)\nprint('300 MiB after them')\n"
    "more = bytearray(300 << 20)\nprint('600 MiB: not stopped')"
)


def test_python_runs_32_threads_at_the_default_limit_which_still_stops_its_allocations(jail):
    envelope = jail.run(PYTHON_THREADS, timeout=20)
    data = envelope["data"]
    assert data["stdout"] == "32 threads\n300 MiB after them\n", data
    assert "MemoryError" in data["error"], data


NODE_WORKERS = (
    "const { Worker } = require('worker_threads')\nlet ready = 0\nconst workers = []\n"
    "for (let i = 0; i < 32; i++) {\n"
    "  const w = new Worker(`const { parentPort } = require('worker_threads')\n"
    "    const data = new Array(1e5).fill(1.5)  // a little of each worker's own heap\n"
    "    parentPort.postMessage(data.length)\n"
    "    parentPort.on('message', () => process.exit(0))`, { eval: true })\n"
    "  w.on('error', e => { console.log('worker failed:', e.message); process.exit(1) })\n"
    "  w.on('message', () => { if (++ready === 32) { console.log(ready, 'workers');"
    " workers.forEach(x => x.postMessage('done')) } })\n"
    "  workers.push(w)\n"
    "}\n"
)


def test_node_runs_32_worker_threads_at_the_default_limit(jail):
    assert output(jail, NODE_WORKERS, language="nodejs", timeout=20) == "32 workers\n"


def test_node_heap_still_stops_at_the_limit(jail):
    code = "const a = []\nwhile (true) a.push(new Array(1e6).fill(1.5))"
    data = jail.run(code, language="nodejs", timeout=20)["data"]
    assert data["exit_code"] != 0
    assert "heap" in data["error"].lower() or "memory" in data["error"].lower(), data


# ---- nothing left after a stop ----------------------------------------------------------------------

TEMP_DIRS = ("/tmp", "/var/tmp")


@pytest.mark.parametrize("mode", list(MODES))
def test_after_sigterm_to_the_main_process_nothing_of_the_service_is_left_in_tmp(mode):
    """Its TMPDIR is a directory of the test's own (other tests and services come and go in /tmp meanwhile):
    empty after the stop; and nothing in /tmp or /var/tmp carries the service's pid (its tree mount points)."""
    require_namespaces(mode)
    svc = MODES[mode]()
    own_tmp = tempfile.mkdtemp(prefix="hardening-tmpdir-", dir="/var/tmp")
    os.chmod(own_tmp, 0o1777)  # a service as nobody writes there too
    svc.env["TMPDIR"] = own_tmp
    try:
        svc.start()
        pid = svc.process.pid
        try:
            for language, code in (("python3", "print(1)"), ("nodejs", "console.log(1)")):
                assert output(svc, code, language=language, enable_network=True) == "1\n"
                assert output(svc, code, language=language, enable_network=False) == "1\n"
            made = os.listdir(own_tmp)
        finally:
            svc.stop()  # SIGTERM to the main process, as a container runtime or systemd stops it
        # uvicorn ends by raising SIGTERM again once its shutdown (the runtimes' stop) is complete
        assert svc.process.returncode in (0, -signal.SIGTERM), svc.final_output[-3000:]
        assert "Application shutdown complete" in svc.final_output
        if mode != "container":  # the chroot mode makes none there: its trees live in the data dir
            assert made, "the service made no temporary directory: TMPDIR was not its"
        assert os.listdir(own_tmp) == []
        assert [n for d in TEMP_DIRS for n in os.listdir(d) if f"-{pid}-" in n] == []
    finally:
        subprocess.run(["rm", "-rf", own_tmp], check=True)


# ---- the shared cases ----------------------------------------------------------------------------


def test_the_shared_cases_do_not_notice(jail):
    """tests/cases/run_cases.json in this mode: what the closed calls cost real code (nothing, it must be)."""
    from test_cases import CASES, check

    failed = {}
    for case in CASES:
        body = {"language": case["language"], "code": case["code"], "enable_network": case["enable_network"]}
        if "timeout" in case:
            body["timeout"] = case["timeout"]
        envelope = jail.run(**body)
        try:
            assert envelope["code"] == 0, envelope
            check(case["expect"], envelope["data"])
        except AssertionError as exc:
            failed[case["id"]] = f"{exc}: {envelope}"
    print(f"{jail.mode}: {len(CASES) - len(failed)} of {len(CASES)} shared cases pass")
    assert failed == {}
