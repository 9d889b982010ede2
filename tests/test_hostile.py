"""Hostile code gets a clear result and hurts nobody."""

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import needs_root
from service import SLOWDOWN, descendants, expected_processes, parent_of, processes_with_uid_in, wait_for


def run(service, code, **fields):
    envelope = service.run(code, **fields)
    assert envelope["code"] == 0, envelope
    return envelope["data"]


def still_serving(service):
    assert run(service, "print('alive')")["stdout"] == "alive\n"


def test_memory_bomb_bytearray(service):
    data = run(service, "x = bytearray(8 * 1024**3)\nprint('allocated')")
    assert "allocated" not in data["stdout"]
    assert "MemoryError" in data["error"]
    still_serving(service)


def test_memory_bomb_growing_list(service):
    started = time.monotonic()
    data = run(service, "x = []\nwhile True:\n    x.append(bytearray(1024 * 1024))", timeout=10 * SLOWDOWN)
    assert "MemoryError" in data["error"] or "memory" in data["error"].lower()
    assert time.monotonic() - started < 10 * SLOWDOWN
    still_serving(service)


def test_memory_limit_extension_is_honoured(service):
    code = "x = bytearray(200 * 1024 * 1024)\nprint('ok')"
    assert run(service, code, memory_limit_mb=400)["stdout"] == "ok\n"
    assert "MemoryError" in run(service, code, memory_limit_mb=100)["error"]


def test_process_creation_fails(service):
    attempts = {
        "os.fork": "import os\nos.fork()",
        "os.execv": "import os\nos.execv('/bin/sh', ['sh', '-c', 'echo PWNED'])",
        "subprocess": "import subprocess\nsubprocess.run(['echo', 'PWNED'])",
        "posix_spawn": "import os\nos.posix_spawn('/bin/echo', ['echo', 'PWNED'], {})",
        "ctypes fork": (
            "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "pid = libc.fork()\n"
            "if pid == 0:\n    print('PWNED child')\n    libc._exit(0)\n"
            "raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))"
        ),
        "raw clone syscall": (
            "import ctypes, os, platform\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            # clone(SIGCHLD): a process; clone is 56 on x86_64, 220 on aarch64 (56 there is openat: EFAULT)
            "r = libc.syscall({'x86_64': 56, 'aarch64': 220}[platform.machine()], 17, 0, 0, 0, 0)\n"
            "if r == 0:\n    libc._exit(0)\n"
            "raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))"
        ),
    }
    for name, code in attempts.items():
        data = run(service, code)
        assert data["exit_code"] != 0, name
        assert "operation not permitted" in data["error"].lower(), (name, data["error"])
        assert "PWNED" not in data["stdout"], name


def test_os_system_command_never_runs(service):
    data = run(service, "import os\nr = os.system('echo PWNED')\nprint('rc', r)")
    assert "PWNED" not in data["stdout"]
    assert "rc" in data["stdout"] and "rc 0" not in data["stdout"]


def test_threads_keep_working(service):
    code = (
        "import threading, concurrent.futures\n"
        "with concurrent.futures.ThreadPoolExecutor(4) as pool:\n"
        "    print(sum(pool.map(lambda x: x * x, range(100))))\n"
        "import asyncio\n"
        "async def main():\n    await asyncio.sleep(0.01)\n    return 'async ok'\n"
        "print(asyncio.run(main()))\n"
    )
    data = run(service, code)
    assert data["stdout"] == "328350\nasync ok\n", data


def test_output_flood_stops_at_the_cap(service):
    data = run(service, "while True:\n    print('x' * 1000)", timeout=20)
    assert "error: output limit exceeded" in data["error"]
    assert len(data["stdout"].encode()) + len(data["stderr"].encode()) <= 4 * 1024 * 1024
    assert data["truncated"] is True
    still_serving(service)


def test_sigterm_ignoring_code_dies_at_its_timeout(service):
    code = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True:\n    time.sleep(0.01)"
    started = time.monotonic()
    data = run(service, code, timeout=1)
    elapsed = time.monotonic() - started
    assert data["exit_code"] == -1 and "error: timeout" in data["error"]
    assert elapsed < 3 * SLOWDOWN, elapsed


def test_cpu_time_does_not_pre_empt_the_wall_clock(service):
    data = run(service, "while True:\n    pass", timeout=2)
    assert data["exit_code"] == -1 and "error: timeout" in data["error"]


def test_no_signals_or_ptrace_to_the_service(service):
    # the service and its zygotes (not the ready children: one of them runs this very code)
    zygotes = [p for p in descendants(service.process.pid) if parent_of(p) == service.process.pid]
    pids = [service.process.pid, *zygotes]
    assert len(pids) >= 2
    # outside the run's PID namespace these pids do not exist (ProcessLookupError); by uid: PermissionError
    code = (
        "import os, signal, ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        f"for pid in {pids!r}:\n"
        "    try:\n        os.kill(pid, signal.SIGKILL)\n        print('killed', pid)\n"
        "    except (PermissionError, ProcessLookupError):\n        print('kill denied')\n"
        "    r = libc.ptrace(16, pid, 0, 0)\n"  # PTRACE_ATTACH
        "    print('ptrace', r, ctypes.get_errno())\n"
    )
    data = run(service, code)
    assert "killed" not in data["stdout"]
    assert data["stdout"].count("kill denied") == len(pids)
    assert data["stdout"].count("ptrace -1 1") == len(pids)
    assert service.process.poll() is None
    still_serving(service)


@needs_root
@pytest.mark.namespaces  # the chroot jail's /tmp is a directory of the run's own, named by TMPDIR
def test_tmp_is_private_to_each_run(service):
    first = run(service, "open('/tmp/left-behind', 'w').write('secret')\nimport os\nprint(os.listdir('/tmp'))")
    assert "left-behind" in first["stdout"]
    second = run(service, "import os\nprint(os.path.exists('/tmp/left-behind'), os.listdir('/tmp'))")
    assert second["stdout"] == "False []\n"


def test_environment_holds_no_secret(service):
    data = run(service, "import os\nprint(sorted(os.environ))")
    assert data["stdout"] == "['HOME', 'LANG', 'TMPDIR']\n"


def test_only_stdio_descriptors_are_open(service):
    data = run(
        service,
        "import os\nopen_fds = []\nfor fd in range(1024):\n    try:\n        os.fstat(fd)\n"
        "        open_fds.append(fd)\n    except OSError:\n        pass\nprint(open_fds)",
    )
    assert data["stdout"] == "[0, 1, 2, 3]\n"  # and its own exit report's pipe (see the next test)


def test_a_forged_exit_report_only_ends_its_own_run(service):
    started = time.monotonic()
    forged = run(service, "import os\nos.write(3, bytes([7]))\nwhile True: pass", timeout=20 * SLOWDOWN)
    assert forged["exit_code"] == 7
    assert time.monotonic() - started < 10 * SLOWDOWN  # not the timeout: the service stopped it
    # and killed it
    assert wait_for(lambda: len(descendants(service.process.pid)) == expected_processes(service), 10 * SLOWDOWN)
    # anything but one byte is no report: the run goes on and ends as the process does
    data = run(service, "import os\nos.write(3, b'not a status')\nprint('still here')")
    assert data["exit_code"] == 0 and data["stdout"] == "still here\n"
    closed = run(service, "import os\nos.close(3)\nprint('closed')")  # no report: the end of the process
    assert closed["exit_code"] == 0 and closed["stdout"] == "closed\n"


SELF_SIGNALS = {
    "import os\nprint('a', flush=True)\nos.kill(os.getpid(), 9)\nprint('b')": (137, "killed (signal 9)", "a\n"),
    "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\nprint('b')": (143, "killed (signal 15)", ""),
    "import os\nos.abort()": (134, "aborted (signal 6)", ""),
    "import signal, time\nsignal.alarm(1)\ntime.sleep(5)\nprint('b')": (142, "killed (signal 14)", ""),
    "import signal\nsignal.raise_signal(signal.SIGUSR1)\nprint('b')": (138, "killed (signal 10)", ""),
    "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\nprint('b')": (139, "segmentation fault (signal 11)", ""),
    # through ctypes, past the wrappers: the handler the shim installed takes it
    "import ctypes, time\nctypes.CDLL(None).kill(1, 15)\ntime.sleep(5)\nprint('b')": (143, "killed (signal 15)", ""),
}


@pytest.mark.parametrize(
    "code",
    # kill(1) is a run's own signal only where the run is pid 1 of its PID namespace
    [pytest.param(code, marks=pytest.mark.namespaces) if "kill(1," in code else code for code in SELF_SIGNALS],
)
def test_a_signal_a_run_sends_itself_ends_it(service, code):
    """As for any process, although a run is the first process of its PID namespace (which the kernel
    spares its own signals): the runner's shim ends it, killed by that signal."""
    exit_code, words, stdout = SELF_SIGNALS[code]
    data = run(service, code, timeout=10)
    assert data["exit_code"] == exit_code and f"error: {words}" in data["error"] and data["stdout"] == stdout


def test_a_run_that_handles_its_own_signal_goes_on(service):
    code = (
        "import os, signal\nsignal.signal(signal.SIGTERM, lambda *a: print('caught'))\n"
        "os.kill(os.getpid(), 15)\nprint('on')"
    )
    data = run(service, code)
    assert data["exit_code"] == 0 and data["stdout"] == "caught\non\n"


@needs_root
@pytest.mark.namespaces
def test_root_jail_shape(service):
    code = (
        "import os\n"
        "print(os.getuid() != 0, os.getgid() != 0, os.getgroups())\n"
        "print(sorted(os.listdir('/')))\n"
        "print(os.path.exists('/proc/self'), os.path.exists('/etc/passwd'), os.path.exists('/bin/sh'))\n"
        "try:\n    open('/usr/evil', 'w')\nexcept OSError as e:\n    print('ro', e.errno)\n"
        "open('/tmp/x.sh', 'w').write('#!/bin/sh')\nos.chmod('/tmp/x.sh', 0o755)\n"
        "print(os.stat('/tmp').st_uid == os.getuid())\n"
    )
    data = run(service, code)
    lines = data["stdout"].splitlines()
    assert lines[0] == "True True []"
    assert "proc" not in lines[1] and "home" not in lines[1]
    assert lines[2] == "False False False"
    assert lines[3] in ("ro 30", "ro 13")  # read-only file system / permission denied
    assert lines[4] == "True"


@needs_root
def test_ready_children_hold_no_capability_not_even_to_regain(service):
    """Every capability set of a child waiting for its run is empty, the bounding set too (the zygote drops
    it once for all its children where they get no user namespace of their own)."""
    uids = service.detail()["runtimes"]["python3"]["uid_range"]
    children = processes_with_uid_in(*uids)
    assert children
    for pid in children:
        with open(f"/proc/{pid}/status") as f:
            caps = {k: int(v, 16) for k, v in (line.split(":") for line in f if line.startswith("Cap"))}
        assert caps == {"CapInh": 0, "CapPrm": 0, "CapEff": 0, "CapBnd": 0, "CapAmb": 0}, (pid, caps)


@needs_root
def test_runs_get_different_uids(service):
    with ThreadPoolExecutor(4) as pool:
        results = list(
            pool.map(lambda _: run(service, "import os, time\ntime.sleep(0.2)\nprint(os.getuid())"), range(4))
        )
    uids = {r["stdout"] for r in results}
    assert len(uids) == 4


@needs_root
def test_zygote_environment_is_clean(service):
    zygotes = [p for p in descendants(service.process.pid) if b"runtimes.jail.zygote.loop" in _cmdline(p)]
    assert zygotes
    for pid in zygotes:
        with open(f"/proc/{pid}/environ", "rb") as f:
            names = sorted(item.split(b"=")[0].decode() for item in f.read().split(b"\0") if item)
        assert names == ["HOME", "LANG", "TMPDIR"]


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def test_service_survives_a_burst_of_hostile_runs(service):
    codes = [
        "import os\nos.fork()",
        "while True:\n    print('x' * 10000)",
        "x = bytearray(8 * 1024**3)",
        "raise SystemExit('bye')",
        "import os\nos.kill(os.getpid(), 9)",
        "import ctypes\nctypes.string_at(0)",
    ]
    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda c: service.run(c, timeout=5 * SLOWDOWN), codes * 3))
    assert all(r["code"] == 0 for r in results)
    assert all(r["data"]["exit_code"] == 137 for r in results[4::6])  # 128 + SIGKILL
    assert all("segmentation fault" in r["data"]["error"] for r in results[5::6])
    assert all("output limit exceeded" in r["data"]["error"] for r in results[1::6])
    still_serving(service)


def test_ipc_objects_cannot_be_made(service):
    # a uid goes back to the pool once its process is gone: nothing may outlive it (SysV IPC, mqueues)
    # (mq_open: 240 on x86_64, 180 on aarch64, where 240 is rt_tgsigqueueinfo)
    code = (
        "import ctypes, os, platform\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "print('shmget', libc.shmget(0, 4096, 0o1600), ctypes.get_errno())\n"
        "print('semget', libc.semget(0, 1, 0o1600), ctypes.get_errno())\n"
        "print('msgget', libc.msgget(0, 0o1600), ctypes.get_errno())\n"
        "mq_open = {'x86_64': 240, 'aarch64': 180}[platform.machine()]\n"
        "print('mq_open', libc.syscall(mq_open, b'/q', 0o100 | 2, 0o600, None), ctypes.get_errno())\n"
    )
    assert run(service, code)["stdout"] == "shmget -1 1\nsemget -1 1\nmsgget -1 1\nmq_open -1 1\n"


SOCKETS = """
import ctypes, socket
libc = ctypes.CDLL(None, use_errno=True)
def attempt(name, family, kind, protocol):
    try:
        socket.socket(family, kind, protocol).close()
        print(name, 'opened')
    except OSError as e:
        print(name, e.errno)
attempt('tcp', socket.AF_INET, socket.SOCK_STREAM, 0)
attempt('tcp6', socket.AF_INET6, socket.SOCK_STREAM, socket.IPPROTO_TCP)
attempt('udp', socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_UDP)
attempt('mptcp', socket.AF_INET, socket.SOCK_STREAM, 262)
attempt('mptcp6', socket.AF_INET6, socket.SOCK_STREAM, 262)
attempt('sctp', socket.AF_INET, socket.SOCK_STREAM, 132)
attempt('udplite', socket.AF_INET, socket.SOCK_DGRAM, 136)
attempt('udp-as-stream', socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_UDP)
for family in (socket.AF_INET, socket.AF_INET6):
    try:
        socket.socketpair(family, socket.SOCK_STREAM)
        print('pair', family, 'opened')
    except OSError as e:
        print('pair', family, e.errno)
socket.socketpair()
print('unix pair opened')
params = ctypes.create_string_buffer(120)  # io_uring_setup (425 on x86_64 and aarch64): its socket operations
print('io_uring', libc.syscall(425, 8, params), ctypes.get_errno())
"""
SOCKETS_REFUSED = (
    "mptcp 1\nmptcp6 1\nsctp 1\nudplite 1\nudp-as-stream 1\npair 2 1\npair 10 1\nunix pair opened\nio_uring -1 1\n"
)
# what plain TCP and UDP give, by what runs asking for network get in this mode (the health detail's "network")
SOCKETS_PLAIN = {
    "filtered": "tcp opened\ntcp6 opened\nudp opened\n",
    "unfiltered": "tcp opened\ntcp6 opened\nudp opened\n",
    "proxy": "tcp opened\ntcp6 opened\nudp 1\n",  # TCP to the proxy's port only, no UDP
    "none": "tcp 1\ntcp6 1\nudp 1\n",
}


def sockets_seen(service) -> str:
    network = service.detail()["runtimes"]["python3"]["protections"]["network"]
    return SOCKETS_PLAIN[network] + SOCKETS_REFUSED


def test_no_socket_but_plain_tcp_udp_and_unix_pairs(service):
    """A run with network opens TCP and UDP sockets only: no MPTCP, SCTP or UDP-Lite (Landlock's TCP rules and
    proxy egress do not see them), no socketpair but unix, no io_uring to open sockets past the filter."""
    assert run(service, SOCKETS, enable_network=True)["stdout"] == sockets_seen(service)


# A run tries to change the shared files' modes, times, owner and extended attributes through descriptors it may
# open read-only: the layer's requests/__init__.py, the layer's requests/ directory, Node's wrapper (the tree's, or
# the install's where there is no tree). In the landlock jail these are the service's uid's, which every run
# shares: one run's fchmod(fd, 0) made `import requests` fail for every later tenant (issue 41).
METADATA_ATTEMPTS = (
    "import ctypes, json, os, platform, requests\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    # utimensat is 280 on x86_64, 88 on aarch64 (where 280 is bpf); fchmodat2 is 452 on both
    "UTIMENSAT = {{'x86_64': 280, 'aarch64': 88}}[platform.machine()]\n"
    "wrappers = ['/opt/sandlot/wrapper.js', {wrapper!r}]\n"
    "targets = [requests.__file__, os.path.dirname(requests.__file__)]\n"
    "targets += [w for w in wrappers if os.path.exists(w)][:1]\n"
    "def fchown(fd): os.fchown(fd, os.getuid(), os.getgid())\n"
    "def futimens(fd): os.utime(fd, (1, 1))\n"
    "def utimensat_fd(fd):\n"  # utimensat(fd, NULL, times, 0): what futimens is
    "    if libc.syscall(UTIMENSAT, fd, None, None, 0): raise OSError(ctypes.get_errno(), 'utimensat')\n"
    "def utimensat_empty(fd):\n"  # utimensat(fd, '', NULL, AT_EMPTY_PATH)
    "    if libc.syscall(UTIMENSAT, fd, b'', None, 0x1000): raise OSError(ctypes.get_errno(), 'utimensat')\n"
    "def fchmodat_empty(fd):\n"  # fchmodat2(fd, '', 0, AT_EMPTY_PATH)
    "    if libc.syscall(452, fd, b'', 0, 0x1000): raise OSError(ctypes.get_errno(), 'fchmodat2')\n"
    "def fsetxattr(fd): os.setxattr(fd, 'user.sandlot', b'x')\n"
    "def fremovexattr(fd): os.removexattr(fd, 'user.sandlot')\n"
    "attempts = {{'fchmod': lambda fd: os.fchmod(fd, 0), 'fchown': fchown, 'futimens': futimens,\n"
    "            'utimensat by fd': utimensat_fd, 'utimensat AT_EMPTY_PATH': utimensat_empty,\n"
    "            'fchmodat2 AT_EMPTY_PATH': fchmodat_empty, 'fsetxattr': fsetxattr, 'fremovexattr': fremovexattr,\n"
    "            'chmod': lambda fd: os.chmod(f'/proc/self/fd/{{fd}}', 0)}}\n"
    "def seen(fd):\n"  # what a change would show: ctime moves with any change of mode, owner, times, xattrs
    "    st = os.fstat(fd)\n"
    "    return (st.st_mode, st.st_uid, st.st_gid, st.st_mtime_ns, st.st_ctime_ns), st.st_nlink\n"
    "changed = []\n"
    "fds = {{}}\n"  # all opened first: an fchmod(fd, 0) that worked would keep the next open out
    "for target in targets:\n"
    "    try:\n"
    "        fds[target] = os.open(target, os.O_RDONLY)\n"
    "    except PermissionError:\n"
    "        pass\n"  # a Python run's domain may not read Node's wrapper (the landlock jail)
    "for target, fd in fds.items():\n"
    "    for name, attempt in attempts.items():\n"
    # the link count moves the ctime too: in the chroot jail the file's other names are the service's (each uid's
    # cell of hard links, made and removed as uids come and go, meanwhile): an attempt whose window saw the count
    # move is tried again
    "        for _ in range(20):\n"
    "            before, links = seen(fd)\n"
    "            try:\n"
    "                attempt(fd)\n"  # refused, or (fchmod in the landlock jail) answered without a change
    "            except OSError:\n"
    "                pass\n"
    "            after, links_after = seen(fd)\n"
    "            if links_after == links:\n"
    "                break\n"
    "        if after != before:\n"
    "            changed.append(f'{{name}} {{target}}')\n"
    "print(json.dumps({{'changed': changed, 'targets': len(fds)}}))\n"
)
# the layer file's mode and times, its directory's mode (in the chroot jail each uid's cell has directories of
# its own, with times of their own; the files are the tree's), and its link count (the links others make and remove
# move its ctime: test_a_run_cannot_change_the_shared_files)
METADATA_SEEN = (
    "import json, os, requests\n"
    "f, d = os.stat(requests.__file__), os.stat(os.path.dirname(requests.__file__))\n"
    "print(json.dumps([f.st_mode, f.st_mtime_ns, f.st_ctime_ns, d.st_mode, f.st_nlink]))\n"
)
NODE_METADATA_ATTEMPTS = (
    "const fs = require('fs');\n"
    "const target = ['/opt/sandlot/wrapper.js', {wrapper!r}].find((p) => {{ try {{ fs.accessSync(p, fs.constants.R_OK);"
    " return true; }} catch {{ return false; }} }});\n"
    "const changed = [];\n"
    "for (const [name, attempt] of [['fchmod', (fd) => fs.fchmodSync(fd, 0)],\n"
    "    ['futimes', (fd) => fs.futimesSync(fd, 1, 1)],\n"
    "    ['fchown', (fd) => fs.fchownSync(fd, process.getuid(), process.getgid())]]) {{\n"
    "  const fd = fs.openSync(target, 'r');\n"
    "  const seen = () => {{ const s = fs.fstatSync(fd, {{bigint: true}});\n"
    "    return [`${{s.mode}} ${{s.ctimeNs}}`, s.nlink]; }};\n"
    "  let before, after;\n"  # tried again where the link count moved meanwhile (METADATA_ATTEMPTS)
    "  for (let i = 0; i < 20; i++) {{\n"
    "    before = seen();\n"
    "    try {{ attempt(fd); }} catch (e) {{}}\n"
    "    after = seen();\n"
    "    if (after[1] === before[1]) break;\n"
    "  }}\n"
    "  if (after[0] !== before[0]) changed.push(name);\n"
    "  fs.closeSync(fd);\n"
    "}}\n"
    "const st = fs.statSync(target);\n"
    "console.log(JSON.stringify({{changed, mode: st.mode, mtime: st.mtimeMs}}));\n"
)


def test_a_run_cannot_change_the_shared_files(service):
    """Every attempt fails, and the next run still imports requests and sees the same modes, times and xattrs."""
    import json
    import os

    wrapper = os.path.join(getattr(service, "source", "/nonexistent"), "runtimes", "nodejs", "wrapper.js")
    slow = {"timeout": 30 * SLOWDOWN} if SLOWDOWN > 1 else {}  # `import requests`, from the lean zygote too

    # Where the layer's file has other names (hard links: the chroot jail's tree and each uid's cell, made and removed
    # as uids come and go, at rest and ahead of the next runs; those of any chroot service on the same store of
    # layers, whatever this one's mode), each link made or removed moves its ctime, so between two runs the ctime
    # says nothing of what a run did (the attempts' own check does: each attempt's ctime before and after). A file
    # of one name both times: any change of its ctime is one a run made.
    def seen() -> tuple[list, list]:
        mode, mtime, ctime, directory, links = json.loads(run(service, METADATA_SEEN, **slow)["stdout"])
        return [mode, mtime, directory], [ctime, links]

    before, (ctime, links) = seen()
    data = run(service, METADATA_ATTEMPTS.format(wrapper=wrapper), **slow)
    assert data["exit_code"] == 0, data
    result = json.loads(data["stdout"])
    assert result["changed"] == [] and result["targets"] >= 2, data
    after, (ctime_after, links_after) = seen()
    assert after == before
    if links == links_after == 1:
        assert ctime_after == ctime
    node = run(service, NODE_METADATA_ATTEMPTS.format(wrapper=wrapper), language="nodejs")
    first = json.loads(node["stdout"])
    assert first["changed"] == [], node
    again = json.loads(run(service, NODE_METADATA_ATTEMPTS.format(wrapper=wrapper), language="nodejs")["stdout"])
    assert (again["mode"], again["mtime"]) == (first["mode"], first["mtime"])
    assert run(service, "import requests; print(requests.__name__)", **slow)["stdout"] == "requests\n"
