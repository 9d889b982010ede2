"""The service in a default container: Docker's default capabilities, namespaces and mounts refused.

Docker cannot run here, so the container is stood in for by tests/outer_filter.py:
the capability bounding set narrowed to Docker's default set and the calls
Docker's default seccomp profile refuses without CAP_SYS_ADMIN (unshare, setns,
mount, umount2, pivot_root, ...; clone with any CLONE_NEW* flag; clone3 with
ENOSYS) refused. The protections record says what is left.
`SANDLOT_TEST_CONTAINER=docker-default` starts every service of a test run in
the same stand-in (tests/service.py).
Neither namespaced jail can be built there: the record chooses the chroot jail,
which serves. Where seccomp is refused as well, the chroot jail cannot be built
either (without namespaces, seccomp is what keeps a run from making processes),
so runs are refused, saying why, whatever SANDLOT_REQUIRE_SECCOMP says (opting
out of seccomp never opts out of the rest of the jail; the opt-out itself is
shown where a mode can serve, in tests/lambda/test_lambda_simulated.py).
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import test_cases
import test_isolation
import test_layers
from conftest import needs_root
from outer_filter import DOCKER_DEFAULT_CAPS
from service import DOCKER_DEFAULT, IS_ROOT, Service, output, processes_with_uid_in, standin, together, wait_for

from runtimes.jail.policy import tree_files
from runtimes.linux import egress

NO_SECCOMP = [*DOCKER_DEFAULT, "--eperm", "seccomp,prctl:22"]


def contained(restriction: list[str], **env: str) -> Service:
    return Service(launcher=standin(restriction), NODEJS_PATH="/nonexistent/node", **env)


CLONE_PROBE = """
import ctypes, errno, os, threading
libc = ctypes.CDLL(None, use_errno=True)
SYS_CLONE, SYS_CLONE3, SIGCHLD = {"x86_64": (56, 435), "aarch64": (220, 435)}[os.uname().machine] + (17,)
def clone(flags):
    # aarch64 and x86_64 both take the flags first; a child exits at once
    pid = libc.syscall(SYS_CLONE, flags | SIGCHLD, 0, 0, 0, 0)
    if pid == 0:
        os._exit(0)
    if pid > 0:
        os.waitpid(pid, 0)
        return "ok"
    return errno.errorcode[ctypes.get_errno()]
flags = {"NEWNS": 0x20000, "NEWCGROUP": 0x2000000, "NEWUTS": 0x4000000, "NEWIPC": 0x8000000,
         "NEWUSER": 0x10000000, "NEWPID": 0x20000000, "NEWNET": 0x40000000}
print("plain", clone(0))
for name, flag in flags.items():
    print(name, clone(flag))
print("clone3", "ok" if libc.syscall(SYS_CLONE3, 0, 0) >= 0 else errno.errorcode[ctypes.get_errno()])
thread = threading.Thread(target=lambda: None)
thread.start()
thread.join()
print("thread", "ok")
print("unshare", "ok" if libc.unshare(0) >= 0 else errno.errorcode[ctypes.get_errno()])
"""


@needs_root
def test_the_stand_in_refuses_what_dockers_default_profile_refuses():
    """Namespaces through clone are refused flag by flag, clone3 answers ENOSYS (libc falls back to clone),
    plain processes and threads still start: what a process in a default container meets."""
    result = subprocess.run(
        [*standin(DOCKER_DEFAULT), sys.executable, "-c", CLONE_PROBE], capture_output=True, text=True, check=True
    )
    answers = dict(line.split() for line in result.stdout.splitlines())
    assert answers.pop("plain") == "ok" and answers.pop("thread") == "ok"
    assert answers.pop("clone3") == "ENOSYS"
    assert answers == {name: "EPERM" for name in answers} and len(answers) == 8, answers
    capabilities = subprocess.run(
        [*standin(DOCKER_DEFAULT), "grep", "CapBnd", "/proc/self/status"], capture_output=True, text=True, check=True
    )
    assert int(capabilities.stdout.split()[1], 16) == 0xA80425FB  # Docker's 14 default capabilities


def detail(svc: Service) -> dict:
    """The health detail once the runtime has started or failed to (the start-up log says which)."""
    assert wait_for(lambda: "python3 runtime" in svc.output(), timeout=120), svc.output()
    data = svc.detail()
    [started] = [
        line
        for line in map(json.loads, filter(lambda text: text.startswith("{"), svc.output().splitlines()))
        if line.get("logger") == "sandlot.api" and line.get("language") == "python3"
    ]
    assert started["platform"] == data["runtimes"]["python3"]["platform"]  # the start-up log shows the record
    return data


@needs_root
def test_a_default_container_serves_with_the_chroot_jail_and_says_so(container):
    data = detail(container)
    python = data["runtimes"]["python3"]
    record = python["platform"]
    assert record["euid"] == 0
    assert record["setuid"] is True and record["chroot"] is True and record["mknod"] is True  # Docker's set keeps
    assert record["seccomp"] is True and record["no_new_privs"] is True
    assert record["host_nft"] is False and "Operation not permitted" in record["errors"]["host_nft"]  # no NET_ADMIN
    for name in ("user_namespaces", "mount_namespaces", "pid_namespaces", "net_namespaces"):
        assert record[name] is False and "unshare" in record["errors"][name], name
    for language in ("python3", "nodejs"):
        runtime = data["runtimes"][language]
        assert runtime["ready"], runtime
        protections = runtime["protections"]
        assert protections["mode"] == "chroot" and protections["tree"] == "chroot"
        assert protections["own_uid"] and not protections["pid_namespace"]
        assert protections["processes_ended_by"] == "uid_sweep" and protections["private_tmp"] == "directory"
        assert protections["network"] == "none" and "NET_ADMIN" in protections["network_reason"]
        assert protections["egress_filter"] is False
    assert httpx.get(container.url + "/health").status_code == 200
    assert container.run("print(6 * 7)")["data"]["stdout"] == "42\n"
    assert container.run("console.log(6 * 7)", language="nodejs")["data"]["stdout"] == "42\n"
    logged = container.output()
    assert "network is not available to runs here" in logged and "SANDLOT_UNFILTERED_EGRESS" in logged


@needs_root
@pytest.mark.parametrize("required", [True, False])
def test_without_seccomp_or_namespaces_runs_are_refused_whatever_the_opt_out(required):
    """Without namespaces, seccomp alone keeps a run from making processes and from the network: the chroot
    jail needs it, and opting out of seccomp never opts out of the rest of the jail."""
    svc = contained(NO_SECCOMP, SANDLOT_REQUIRE_SECCOMP=str(required).lower()).start(wait=False)
    try:
        python = detail(svc)["runtimes"]["python3"]
        assert python["platform"]["seccomp"] is False
        assert python["platform"]["errors"]["seccomp"]
        envelope = svc.run("print(1)")
        assert envelope["code"] == -500 and envelope["message"] == python["error"]
        assert "user_namespaces" in envelope["message"] and "unshare" in envelope["message"]
        assert httpx.get(svc.url + "/health").status_code == 503
    finally:
        svc.stop()


# ---- the chroot jail, under the stand-in -----------------------------------------------------------------

CASES = test_cases.CASES


def data_dir() -> str:
    """A data directory as a container's volume would be (not under /tmp); its layers and trees stay."""
    path = tempfile.mkdtemp(prefix="sandlot-container-", dir="/var/tmp")
    os.chmod(path, 0o755)
    return path


def serving(restriction: list[str] = DOCKER_DEFAULT, data: str = "", **env: str) -> Service:
    """A service started in the stand-in, with node, its layers and trees in data (made when not given)."""
    svc = Service(launcher=standin(restriction), SANDLOT_DATA_DIR=data or data_dir(), **{"MAX_WORKERS": "2", **env})
    return svc


@pytest.fixture(scope="module")
def container():
    if not IS_ROOT:
        pytest.skip("the stand-in for a container narrows root's privileges")
    svc = serving().start()
    yield svc
    svc.stop()
    shutil.rmtree(svc.env["SANDLOT_DATA_DIR"], ignore_errors=True)


@needs_root
@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_every_shared_case_in_a_default_container(container, case):
    body = {"language": case["language"], "code": case["code"], "enable_network": case["enable_network"]}
    if "timeout" in case:
        body["timeout"] = case["timeout"]
    envelope = container.run(**body)
    assert envelope["code"] == 0, envelope
    test_cases.check(case["expect"], envelope["data"])


# what a run sees of the tree: its interpreter's files, the layer, certificates, zoneinfo, four devices
CHROOT_CASES = {
    # runs are dumpable to their uid (tmp/caps.py, tmp/held.py): a core_pattern piping to the host's handler (apport,
    # systemd-coredump) would be handed a crashing run's memory at RLIMIT_CORE 0; 1 stops that as it stops a file
    "no core dump, not even to a core_pattern's program": (
        "import resource\nprint(resource.getrlimit(resource.RLIMIT_CORE))",
        "(1, 1)\n",
    ),
    # the zygote's prepared Landlock rules hold descriptors of its tree: none of them reaches the run
    "only its stdio and its exit report are open": (
        "import os\nopen_fds = []\nfor fd in range(1024):\n    try:\n        os.fstat(fd)\n"
        "        open_fds.append(fd)\n    except OSError:\n        pass\nprint(open_fds)",
        "[0, 1, 2, 3]\n",
    ),
    "no root, no groups, no capability": (
        "import os\nprint(os.getuid() != 0, os.getgroups())\n"
        "worked = []\nopen('f', 'w').close()\n"
        "for name, call in (('chown', lambda: os.chown('f', 12345, 12345)), ('setuid', lambda: os.setuid(0)),\n"
        "                   ('mknod', lambda: os.mknod('null', 0o600 | 0o20000, os.makedev(1, 3))),\n"
        "                   ('mknod block', lambda: os.mknod('sda', 0o600 | 0o60000, os.makedev(8, 0)))):\n"
        "    try:\n        call()\n        worked.append(name)\n    except OSError:\n        pass\n"
        "print(worked)",
        "True []\n[]\n",
    ),
    "a literal /tmp of its own": (
        "import os, stat\nown = os.environ['TMPDIR']\ninfo = os.stat(own)\n"
        "print(own == os.getcwd() == os.environ['HOME'] == '/tmp', oct(stat.S_IMODE(info.st_mode)),"
        " info.st_uid == os.getuid(), os.listdir(own))\n"
        "open('/tmp/report.txt', 'w').write('kept')\nprint(os.listdir('/tmp'), open('/tmp/report.txt').read())",
        "True 0o700 True []\n['report.txt'] kept\n",
    ),
    "nothing of the host is visible": (
        "import os\n"
        "for p in ('/etc/shadow', '/etc/passwd', '/proc', '/sys', '/work', '/home', '/run', '/var/log', '/dev/shm',\n"
        "          '/boot', '/var/lib/sandlot'):\n"
        "    print(p, os.path.exists(p))\nprint(sorted(os.listdir('/dev')))",
        "".join(
            f"{p} False\n"
            for p in (
                "/etc/shadow",
                "/etc/passwd",
                "/proc",
                "/sys",
                "/work",
                "/home",
                "/run",
                "/var/log",
                "/dev/shm",
                "/boot",
                "/var/lib/sandlot",
            )
        )
        + "['null', 'random', 'urandom', 'zero']\n",
    ),
    "no write reaches the tree (files, directories, modes, links)": (
        "import os, sys, json\nfiles = [sys.executable, os.__file__, json.__file__, '/etc/resolv.conf', '/dev/null']\n"
        "dirs = ['/', '/etc', '/usr', '/dev', os.path.dirname(os.__file__)] + [p for p in sys.path if p]\n"
        "done = []\ndef attempt(name, call):\n"
        "    try:\n        call()\n        done.append(name)\n    except OSError:\n        pass\n"
        "for f in files[:-1]:\n"
        "    attempt('append ' + f, lambda: open(f, 'a').close())\n"
        "    attempt('chmod ' + f, lambda: os.chmod(f, 0o777))\n"
        "    attempt('utime ' + f, lambda: os.utime(f, (0, 0)))\n"
        "    attempt('link ' + f, lambda: os.link(f, 'hard'))\n"
        "    attempt('rename ' + f, lambda: os.rename(f, f + '.x'))\n"
        "for d in dirs:\n"
        "    attempt('create in ' + d, lambda: open(os.path.join(d, 'x'), 'w').close())\n"
        "    attempt('mkdir in ' + d, lambda: os.mkdir(os.path.join(d, 'x')))\n"
        "    attempt('chmod ' + d, lambda: os.chmod(d, 0o777))\n"
        "print(done)",
        "[]\n",
    ),
    "no setuid file helps": (
        "import os, stat\nopen('s', 'w').close()\n"
        "try:\n    os.chmod('s', 0o4755)\nexcept OSError:\n    pass\n"
        "found = []\n"
        "for d, _, names in os.walk('/'):\n"
        "    for n in names:\n"
        "        path = os.path.join(d, n)\n"
        "        try:\n"
        "            m = os.lstat(path).st_mode\n"
        "        except OSError:\n"
        "            continue\n"
        "        if stat.S_ISREG(m) and m & (stat.S_ISUID | stat.S_ISGID) and not path.startswith(os.getcwd()):\n"
        "            found.append(path)\n"
        "print(found)",
        "[]\n",  # the tree holds none; one of its own would need an exec, and no_new_privs ignores the bit
    ),
    "no second chroot, no way out through a directory descriptor": (
        "import os, ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nos.mkdir('cell')\n"
        "print(libc.chroot(b'cell'), libc.unshare(0x00020000), libc.mount(b'none', b'cell', b'tmpfs', 0, None))\n"
        "root = os.open('/', os.O_RDONLY)\nos.chdir('cell')\nos.fchdir(root)\n"
        "for _ in range(64):\n    os.chdir('..')\n"
        "print(sorted(os.listdir('.')) == sorted(os.listdir('/')), os.path.exists('proc'), os.path.exists('boot'))\n"
        "print(sorted(int(fd) for fd in os.listdir('/dev/fd')) if os.path.exists('/dev/fd') else 'no /dev/fd')",
        "-1 -1 -1\nTrue False False\nno /dev/fd\n",
    ),
    "no process can be made, no other process named": (
        "import os\nmade = []\nfor call in (os.fork, lambda: os.posix_spawn('/bin/true', ['true'], {})):\n"
        "    try:\n        call()\n        made.append(call)\n    except OSError:\n        pass\n"
        "answers = set()\nfor p in range(1, 5000):\n    if p == os.getpid():\n        continue\n"
        "    try:\n        os.kill(p, 0)\n        answers.add('alive')\n    except ProcessLookupError:\n"
        "        answers.add('none')\n    except PermissionError:\n        answers.add('refused')\n"
        "print(made, sorted(answers))",
        "[] ['refused']\n",  # no PID namespace here: the signal fence answers alike for every other pid
    ),
    "only the scrubbed environment": ("import os\nprint(sorted(os.environ))", "['HOME', 'LANG', 'TMPDIR']\n"),
}

CHROOT_NODE_CASES = {
    "no root, its own /tmp": (
        "const fs = require('fs'), os = require('os')\n"
        "console.log(process.getuid() !== 0, os.tmpdir() === '/tmp', process.cwd() === os.tmpdir(),"
        " JSON.stringify(fs.readdirSync(os.tmpdir())))\n"  # the startup snapshot copy is gone before the run
        "fs.writeFileSync('/tmp/report.txt', 'kept')\nconsole.log(fs.readFileSync('/tmp/report.txt', 'utf8'))",
        "true true true []\nkept\n",
    ),
    "nothing of the host is visible": (
        "const fs = require('fs')\n"
        "for (const p of ['/etc/shadow', '/etc/passwd', '/proc', '/sys', '/work', '/var/log', '/dev/shm'])"
        " console.log(p, fs.existsSync(p))",
        "".join(
            f"{p} false\n" for p in ("/etc/shadow", "/etc/passwd", "/proc", "/sys", "/work", "/var/log", "/dev/shm")
        ),
    ),
    "nothing but its /tmp is writable": (
        "const fs = require('fs'), path = require('path')\n"
        "const targets = ['/x', '/cells/x', '/etc/x', '/usr/x', '/opt/sandlot/wrapper.js', process.execPath,"
        " path.dirname(process.execPath) + '/x']\n"
        "const written = targets.filter(t => {\n"
        "  try { fs.appendFileSync(t, ''); return true } catch (e) { return false }\n})\n"
        "fs.writeFileSync(process.env.TMPDIR + '/mine', 'x')\nconsole.log(JSON.stringify(written))",
        "[]\n",
    ),
    "a written shared object cannot be loaded": (
        "const fs = require('fs')\n"
        "const lib = ['/lib/x86_64-linux-gnu/libc.so.6', '/lib/aarch64-linux-gnu/libc.so.6',"
        " '/usr/lib/x86_64-linux-gnu/libc.so.6'].find(p => fs.existsSync(p))\n"
        "fs.copyFileSync(lib, process.env.TMPDIR + '/evil.node')\n"
        "try { process.dlopen({exports: {}}, process.env.TMPDIR + '/evil.node'); console.log('loaded') }"
        " catch (e) { console.log('refused') }",
        "refused\n",  # loading native code needs exec mappings of a file, which the filter refuses
    ),
}


@needs_root
@pytest.mark.parametrize("name", CHROOT_CASES)
def test_python_in_the_chroot_jail(container, name):
    code, expected = CHROOT_CASES[name]
    assert output(container, code, enable_network=True) == expected


@needs_root
@pytest.mark.parametrize("name", CHROOT_NODE_CASES)
def test_nodejs_in_the_chroot_jail(container, name):
    code, expected = CHROOT_NODE_CASES[name]
    assert output(container, code, language="nodejs", enable_network=True) == expected


@needs_root
def test_the_layers_show_at_a_fixed_path_and_the_data_dirs_stays_out_of_view(container):
    test_isolation.layers_out_of_view(container)


@needs_root
def test_a_concurrent_run_reaches_neither_the_files_nor_the_process_of_another(container):
    holder = (
        "import os, time\nopen('secret', 'w').write('a')\nprint(os.getuid(), os.getpid(), flush=True)\n"
        "time.sleep(3)\nprint(sorted(os.listdir('.')))"
    )
    looker = (
        "import os, signal, glob\nresults = []\n"
        "for uid in range(os.getuid() - 8, os.getuid() + 9):\n"
        "    if uid == os.getuid():\n        continue\n"
        "    for path in (f'/tmp/{uid}', f'/cells/{uid}/tmp', f'/tmp/../../{uid}/tmp', f'/../cells/{uid}/tmp'):\n"
        "        for call in (lambda: os.listdir(path), lambda: open(f'{path}/secret').read()):\n"
        "            try:\n                results.append(call())\n"
        "            except (PermissionError, FileNotFoundError):\n                pass\n"
        "signals = []\nfor p in range(1, 5000):\n    if p != os.getpid():\n"
        "        try:\n            os.kill(p, signal.SIGKILL)\n            signals.append(p)\n"
        "        except OSError:\n            pass\n"
        "print(results, signals, glob.glob('/tmp/*'))"
    )
    a, b = together(container, ("python3", holder), ("python3", looker))
    assert a.splitlines()[1] == "['secret']"  # it lived on, its file untouched
    assert b == "[] [] []\n"


@needs_root
def test_what_a_run_plants_in_its_tmp_never_meets_the_next_run_of_its_uid(container):
    """Its directory goes once the run is over; the uid comes back (the block's free list gives the last one
    back first) only to a fresh, empty one."""
    planter = (
        "import os\nos.symlink('/etc', 'link')\nos.symlink('/tmp/link', 'loop')\n"
        "os.makedirs('a/b/c')\nopen('a/b/c/f', 'w').write('x')\nos.link('a/b/c/f', 'hard')\n"
        "print(os.getuid())"
    )
    looker = "import os\nprint(os.getuid(), sorted(os.listdir('.')))"
    planted = {int(output(container, planter)) for _ in range(3)}
    seen = [output(container, looker).split(" ", 1) for _ in range(12)]
    assert all(listing == "[]\n" for _uid, listing in seen), seen
    assert planted & {int(uid) for uid, _listing in seen}, "no uid came back: the case proves nothing"


# Files a run holds after their names went: no directory shows them, its /proc entries do (tmp/caps.py, tmp/held.py).
# 120 MiB against the 64 MiB cap, each file within RLIMIT_FSIZE; before, only the disk floor stood behind them.
HELD_UNNAMED = {
    ("python3", "deleted while open"): (
        "import os, time\nheld = []\nfor i in range(6):\n"
        "    fd = os.open(f'h{i}', os.O_CREAT | os.O_RDWR, 0o600)\n    os.unlink(f'h{i}')\n"
        "    os.write(fd, b'x' * (20 << 20))\n    held.append(fd)\n"
        "print('held', flush=True)\ntime.sleep(30)"
    ),
    ("python3", "O_TMPFILE"): (
        "import os, time\nheld = []\nfor i in range(6):\n"
        "    fd = os.open('.', os.O_TMPFILE | os.O_RDWR, 0o600)\n"
        "    os.write(fd, b'x' * (20 << 20))\n    held.append(fd)\n"
        "print('held', flush=True)\ntime.sleep(30)"
    ),
    ("python3", "held by threads after the leader ended alone"): (
        "import ctypes, os, threading, time\ndef hold():\n    time.sleep(0.5)  # the leader gone first\n"
        "    held = []\n    for i in range(6):\n"
        "        fd = os.open(f'h{i}', os.O_CREAT | os.O_RDWR, 0o600)\n        os.unlink(f'h{i}')\n"
        "        os.write(fd, b'x' * (20 << 20))\n        held.append(fd)\n"
        "    print('held', flush=True)\n    time.sleep(30)\n"
        "threading.Thread(target=hold).start()\n"
        "ctypes.CDLL(None).syscall({'x86_64': 60, 'aarch64': 93}[os.uname().machine], 0)  # exit: this thread alone"
    ),
    ("nodejs", "deleted while open"): (
        "const fs = require('fs'), dir = require('os').tmpdir()\nconst held = []\nfor (let i = 0; i < 6; i++) {\n"
        "  const fd = fs.openSync(dir + '/h' + i, 'w+')\n  fs.unlinkSync(dir + '/h' + i)\n"
        "  fs.writeSync(fd, Buffer.alloc(20 << 20, 120))\n  held.push(fd)\n}\n"
        "console.log('held')\nsetTimeout(() => {}, 30000)"
    ),
}


@needs_root
@pytest.mark.parametrize("key", HELD_UNNAMED, ids=[f"{lang}: {name}" for lang, name in HELD_UNNAMED])
def test_files_a_run_holds_after_their_names_went_count_against_its_tmp_cap(container, key):
    language, _name = key
    began = time.monotonic()
    envelope = container.run(HELD_UNNAMED[key], language=language, timeout=20)
    data = envelope["data"]
    assert data["exit_code"] == -1 and "error: /tmp size limit exceeded (64 MiB)" in data["error"], data
    assert time.monotonic() - began < 10, "ended by its timeout, not by the cap"
    assert container.run("print('next')")["data"]["stdout"] == "next\n"


@needs_root
@pytest.mark.parametrize(
    ("code", "fields", "error"),
    [
        (
            "import threading, time\n[threading.Thread(target=lambda: time.sleep(60)).start() for _ in range(8)]\n"
            "while True: pass",
            {"timeout": 1},
            "error: timeout",
        ),
        ("import sys\nwhile True: sys.stdout.write('x' * 65536)", {}, "error: output limit exceeded"),
        (
            "import os\nfor i in range(10):\n    open(f'big{i}', 'wb').write(b'x' * (10 << 20))\nimport time\n"
            "time.sleep(30)",
            {"timeout": 20},
            "error: /tmp size limit exceeded (64 MiB)",
        ),
        (
            "for i in range(3000):\n    open(f'f{i}', 'w').close()\nimport time\ntime.sleep(30)",
            {"timeout": 20},
            "error: /tmp file limit exceeded (2048 files)",
        ),
    ],
    ids=["timeout", "output limit", "tmp size", "tmp files"],
)
def test_a_run_ended_by_the_service_leaves_no_process_of_its_uid(container, code, fields, error):
    uid = int(output(container, "import os\nprint(os.getuid())"))  # the free list gives it back next
    envelope = container.run(f"import os\nprint(os.getuid(), flush=True)\n{code}", **fields)
    data = envelope["data"]
    assert data["exit_code"] == -1 and error in data["error"], data
    run_uid = int(data["stdout"].split()[0]) if data["stdout"][:1].isdigit() else uid
    assert wait_for(lambda: not processes_with_uid_in(run_uid, run_uid), timeout=10)
    tree_tmp = glob.glob(os.path.join(container.env["SANDLOT_DATA_DIR"], "trees", "*", "cells", str(run_uid), "tmp"))
    assert wait_for(lambda: not any(os.path.exists(p) for p in tree_tmp), timeout=30), tree_tmp


@needs_root
def test_node_runs_start_from_their_own_copy_of_the_startup_snapshot(container):
    code = (
        "const fs = require('fs')\n"
        "const copy = process.env.TMPDIR + '/.sandlot-snapshot'\n"
        "console.log(process.execArgv.includes('--snapshot-blob'), fs.existsSync(copy))"
    )
    assert output(container, code, language="nodejs") == "true false\n"


# ---- network ---------------------------------------------------------------------------------------------

LOOPBACK_PROBE = """
import socket, sys
for host, port in {targets!r}:
    try:
        socket.create_connection((host, port), timeout=2).close()
        print(host, "reached")
    except OSError as exc:
        print(host, type(exc).__name__, exc.errno)
"""


@pytest.fixture
def loopback_service():
    """A TCP service on the container's loopback, as the container's own services would be."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    yield server.getsockname()[1]
    server.close()


@needs_root
def test_without_net_admin_runs_asking_for_network_get_none_and_are_told_why(container, loopback_service):
    code = LOOPBACK_PROBE.format(targets=[("127.0.0.1", loopback_service)])
    envelope = container.run(code, enable_network=True)
    assert envelope["data"]["stdout"] == "127.0.0.1 PermissionError 1\n"
    node = f"require('net').connect({loopback_service}, '127.0.0.1').on('error', e => console.log(e.code, e.message))"
    said = output(container, node, language="nodejs", enable_network=True)
    assert said.startswith("EPERM connect EPERM: network is not available to runs here") and "NET_ADMIN" in said


READ_RESOLV_CONF = "print(repr(open('/etc/resolv.conf').read()))"


def host_nameservers() -> str:
    """What a run with filtered egress is to read: the host's nameserver lines, nothing else of its file."""
    return tree_files.run_resolv_conf(egress.resolvers())


@needs_root
@pytest.mark.parametrize("network", [True, False])
def test_without_net_admin_a_runs_resolv_conf_names_no_resolver(container, network):
    """No network to resolve with: the tree's resolv.conf says so, and holds nothing of the host's."""
    said = output(container, READ_RESOLV_CONF, enable_network=network)
    assert said == f"{tree_files.NO_RESOLVER!r}\n"
    assert said.count("nameserver") == 0


@needs_root
@pytest.mark.parametrize(("setting", "expected"), [("allow", "reached"), ("refuse", "-500")])
def test_the_operator_chooses_unfiltered_egress_or_refusal(setting, expected, loopback_service):
    svc = serving(SANDLOT_UNFILTERED_EGRESS=setting, NODEJS_PATH="/nonexistent/node").start()
    try:
        envelope = svc.run(LOOPBACK_PROBE.format(targets=[("127.0.0.1", loopback_service)]), enable_network=True)
        if expected == "reached":  # what the operator asked for: the container's loopback too
            assert envelope["data"]["stdout"] == "127.0.0.1 reached\n"
            assert "unfiltered" in svc.output()
        else:
            assert envelope["code"] == -500 and envelope["message"].startswith("runs with network are refused")
            assert svc.run("print('still served')")["data"]["stdout"] == "still served\n"
        assert (
            svc.detail()["runtimes"]["python3"]["protections"]["network"]
            == {
                "allow": "unfiltered",
                "refuse": "refused",
            }[setting]
        )
    finally:
        svc.stop()
        shutil.rmtree(svc.env["SANDLOT_DATA_DIR"], ignore_errors=True)


@needs_root
def test_with_net_admin_runs_with_network_reach_no_loopback_service_and_no_private_range(loopback_service):
    """A container granted NET_ADMIN (the compose file's): the full jail's egress rules by uid. The refused
    addresses are refused by this host's own rules before any packet leaves."""
    caps = ",".join([*DOCKER_DEFAULT_CAPS, "net_admin"])
    svc = serving(["--caps", caps, "--profile", "docker-default"], NODEJS_PATH="/nonexistent/node").start()
    try:
        protections = svc.detail()["runtimes"]["python3"]["protections"]
        assert protections["mode"] == "chroot" and protections["network"] == "filtered" and protections["egress_filter"]
        targets = [("127.0.0.1", loopback_service), ("10.0.0.1", 80), ("192.168.1.1", 80), ("169.254.169.254", 80)]
        lines = output(svc, LOOPBACK_PROBE.format(targets=targets), enable_network=True).splitlines()
        assert [line.split()[0] for line in lines] == [host for host, _port in targets]
        assert all("reached" not in line for line in lines), lines
        # its resolv.conf: the host's resolvers (the rules admit them), no search domain or option of the host's
        assert output(svc, READ_RESOLV_CONF, enable_network=True) == f"{host_nameservers()!r}\n"
    finally:
        svc.stop()
        shutil.rmtree(svc.env["SANDLOT_DATA_DIR"], ignore_errors=True)


# ---- restarts ----------------------------------------------------------------------------------------------


@needs_root
def test_a_killed_service_once_restarted_leaves_nothing_behind():
    data = data_dir()
    svc = serving(data=data, NODEJS_PATH="/nonexistent/node").start()
    first, last = svc.detail()["runtimes"]["python3"]["uid_range"]
    long_run = ThreadPoolExecutor(1).submit(svc.run, "import time\nopen('left', 'w').write('x')\ntime.sleep(60)")
    assert wait_for(lambda: processes_with_uid_in(first, last), timeout=10)
    time.sleep(1)
    assert glob.glob(os.path.join(data, "trees", "*", "cells", "*", "tmp", "left"))
    svc.process.kill()  # SIGKILL: no stop, no clean-up of its own
    svc.process.wait()
    with contextlib.suppress(Exception):
        long_run.result(timeout=30)
    # its zygote and runs die by parent-death signals, not by anything the dead service does
    assert wait_for(lambda: not processes_with_uid_in(first, last), timeout=10)
    svc.stop()  # (dead already: its log closed and removed)
    again = serving(data=data, NODEJS_PATH="/nonexistent/node").start()
    try:
        assert "built in" not in again.output()  # the same tree, found finished: not built again
        # the dead run's directory (its file in it) is gone; one of the same name may be a fresh one of the new
        # instance, which may hold the same uid block now
        marker = os.path.join(data, "trees", "*", "cells", "*", "tmp", "left")
        assert wait_for(lambda: not glob.glob(marker), timeout=10), glob.glob(marker)
        assert again.run("import os\nprint(os.listdir('.'))")["data"]["stdout"] == "[]\n"
    finally:
        again.stop()
        shutil.rmtree(data, ignore_errors=True)


# ---- trees and layers ---------------------------------------------------------------------------------------


@needs_root
def test_at_rest_the_cells_no_child_is_in_go_and_runs_after_get_theirs_again():
    """A busy spell leaves a cell (the tree's directories again, a name per file: kernel memory charged to the
    container) per uid it used. Once the service is at rest (no run for 20 s, the surplus ready children gone) only
    the ready children's cells stay, and the next uid's; a run after that is served in a cell of its own."""
    data = data_dir()
    svc = serving(data=data, NODEJS_PATH="/nonexistent/node").start()
    cells = os.path.join(data, "trees", "*", "cells", "*")
    try:
        with ThreadPoolExecutor(8) as pool:  # runs at once: more uids, each with its cell
            answers = list(pool.map(lambda _: svc.run("import time\ntime.sleep(1)\nprint(1)"), range(8)))
        assert all(answer["data"]["stdout"] == "1\n" for answer in answers), answers
        busy = len(glob.glob(cells))
        assert busy > 3, glob.glob(cells)  # more than are kept at rest
        # at rest: the lean zygote's one ready child, the next uid's, and maybe a child of the preloaded one that
        # was being made as it went idle
        # nothing left behind either (a retired cell is renamed to a trash name, then removed)
        assert wait_for(lambda: len(glob.glob(cells)) <= 3 and not glob.glob(cells + ".trash-*"), timeout=60), (
            glob.glob(cells)
        )
        answer = svc.run(
            "open('/tmp/x', 'w').write('kept')\nprint(open('/tmp/x').read(), len(__import__('os').listdir('/tmp')))"
        )
        assert answer["data"]["stdout"] == "kept 1\n", answer
    finally:
        svc.stop()
        shutil.rmtree(data, ignore_errors=True)


@needs_root
def test_a_new_layer_gets_its_own_tree_and_the_old_one_goes_once_unused(tmp_path):
    """The tree is swapped together with its layer: runs after the switch see the new packages, runs in
    flight finish on the old tree, which is removed once its last zygote is gone; rotated zygotes of one
    layer share one tree."""
    data = data_dir()
    wheels = os.path.join(data, "wheels")
    os.mkdir(wheels)
    for version in ("1.0.0", "2.0.0"):
        test_layers.make_wheel(Path(wheels), "sandlot-tree-probe", version, {"tree_probe.py": f"V = '{version}'\n"})
    requirements = os.path.join(data, "requirements.txt")
    with open(requirements, "w") as f:
        f.write("sandlot-tree-probe==1.0.0\n")
    test_layers.readable(Path(data))
    svc = Service(
        SANDLOT_JAIL="chroot",
        SANDLOT_DATA_DIR=data,
        SANDLOT_PYTHON_REQUIREMENTS=requirements,
        SANDLOT_PIP_FIND_LINKS=wheels,
        SANDLOT_ZYGOTE_MAX_FORKS="10",
        NODEJS_PATH="/nonexistent/node",
        MAX_WORKERS="1",
    ).start()
    trees_dir = os.path.join(data, "trees")
    try:
        for _ in range(25):  # past the fork limit, twice: new zygotes on the same tree
            assert output(svc, "import tree_probe\nprint(tree_probe.V)") == "1.0.0\n"
        assert wait_for(lambda: len(os.listdir(trees_dir)) == 1, 10), os.listdir(trees_dir)
        [old] = os.listdir(trees_dir)
        slow = ThreadPoolExecutor(1).submit(output, svc, "import time, tree_probe\ntime.sleep(3)\nprint(tree_probe.V)")
        time.sleep(1)
        with open(requirements, "w") as f:
            f.write("sandlot-tree-probe==2.0.0\n")
        with svc.client() as client:
            answer = client.post("/v1/sandbox/dependencies/update", json={"language": "python3"}, timeout=300)
        assert answer.json()["code"] == 0, answer.text
        assert output(svc, "import tree_probe\nprint(tree_probe.V)") == "2.0.0\n"
        assert slow.result(timeout=30) == "1.0.0\n"  # finished on the tree it started in
        assert wait_for(lambda: len(os.listdir(trees_dir)) == 1 and old not in os.listdir(trees_dir), 60), os.listdir(
            trees_dir
        )
    finally:
        svc.stop()
        shutil.rmtree(data, ignore_errors=True)


@needs_root
def test_a_uid_whose_cell_cannot_be_made_goes_back_and_runs_go_on_once_it_can():
    """A run's /tmp that cannot be made (a full disk, a cell that cannot be built) fails the spawn, not the uid:
    it goes back to the block, so that the block is not used up by failures once their cause is gone."""
    container = serving().start()  # of its own: only the first uids have cells
    try:
        _cells_that_cannot_be_made(container)
    finally:
        container.stop()
        shutil.rmtree(container.env["SANDLOT_DATA_DIR"], ignore_errors=True)


def _cells_that_cannot_be_made(container) -> None:
    status = container.detail()["runtimes"]["python3"]
    first, last = status["uid_range"]
    idle = status["uids_in_use"]
    tree_dirs = glob.glob(os.path.join(container.env["SANDLOT_DATA_DIR"], "trees", "*", "cells"))
    planted = []
    for cells in tree_dirs:  # no cell can be made for a uid that has none yet: a file holds its name
        for uid in range(first, last + 1):
            path = os.path.join(cells, str(uid))
            if not os.path.exists(path):
                open(path, "w").close()
                planted.append(path)
    with ThreadPoolExecutor(16) as pool:  # runs that hold their uids a while: more uids than have cells
        answers = list(pool.map(lambda _: container.run("import time\ntime.sleep(1)", enable_network=True), range(32)))
    assert any(answer["code"] != 0 for answer in answers), "no spawn failed: the case proves nothing"
    for path in planted:
        os.unlink(path)
    assert wait_for(lambda: container.run("print(1)")["data"]["stdout"] == "1\n", timeout=30)
    # what failed gave its uids back: as many are in use as before, give or take the ready children in flight
    assert wait_for(lambda: container.detail()["runtimes"]["python3"]["uids_in_use"] <= idle + 2, timeout=30), (
        container.detail()["runtimes"]["python3"]
    )
