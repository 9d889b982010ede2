"""Hostile code against the jail, in every mode the suite can run here: no run has any privilege,
sees anything but the tree and its own /tmp, or can reach another run or the service.

Modes: `auto` (as root the full jail: a uid per run), `reduced` as root (the userns jail, its zygote
dropped to a uid of the block), and the whole service started as an unprivileged uid (nobody: the
userns jail as a developer without root gets it). Each case asserts the exact output. Cross-run
cases run two runs at once.
"""

from __future__ import annotations

import os

import pytest
import unprivileged
from service import IS_ROOT, Service, output, together

MODES = ["auto", "reduced", "unprivileged"]
pytestmark = pytest.mark.namespaces  # every mode here has them


@pytest.fixture(scope="module", params=MODES)
def jail(request):
    if request.param == "unprivileged":
        if unprivileged.unavailable():
            pytest.skip(unprivileged.unavailable())
        svc = unprivileged.service()
    elif request.param == "reduced":
        if not IS_ROOT:
            pytest.skip("reduced as root is what this mode tests; without root it is the auto mode")
        svc = Service(SANDLOT_JAIL="reduced")
    else:
        svc = Service()
    svc.start()
    svc.mode = request.param
    yield svc
    svc.stop()


PYTHON_CASES = {
    "no root, no groups": (
        "import os\nprint(os.getuid() != 0, os.geteuid() != 0, os.getgid() != 0, os.getgroups())",
        "True True True []\n",
    ),
    "no capability works": (
        "import os, ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nopen('/tmp/f', 'w').close()\nworked = []\n"
        "for name, call in (('chown', lambda: os.chown('/tmp/f', 12345, 12345)), ('setuid', lambda: os.setuid(0)),\n"
        "                   ('mknod', lambda: os.mknod('/tmp/null', 0o600 | 0o20000, os.makedev(1, 3)))):\n"
        "    try:\n        call()\n        worked.append(name)\n    except OSError:\n        pass\n"
        "print(worked, libc.sethostname(b'x', 1))",
        "[] -1\n",
    ),
    "nothing of the host is visible": (
        "import os\n"
        "for p in ('/etc/shadow', '/etc/passwd', '/root/.bash_history', '/proc', '/sys', '/work', '/home',\n"
        "          '/run', '/var/tmp', '/dev/shm', '/boot'):\n"
        "    print(p, os.path.exists(p))",
        "".join(
            f"{p} False\n"
            for p in (
                "/etc/shadow",
                "/etc/passwd",
                "/root/.bash_history",
                "/proc",
                "/sys",
                "/work",
                "/home",
                "/run",
                "/var/tmp",
                "/dev/shm",
                "/boot",
            )
        ),
    ),
    "nothing but /tmp is writable (tree, layer, interpreter)": (
        "import os, sys, json\n"
        "targets = ['/x', '/etc/x', '/usr/x', '/var/tmp/x', '/dev/shm/x', os.path.dirname(json.__file__) + '/x',\n"
        "           sys.executable, os.__file__] + [p + '/x' for p in sys.path if p]\n"
        "written = []\n"
        "for t in targets:\n"
        "    try:\n        open(t, 'a').close()\n        written.append(t)\n"
        "    except OSError:\n        pass\n"
        "print(written)",
        "[]\n",
    ),
    "only the scrubbed environment": ("import os\nprint(sorted(os.environ))", "['HOME', 'LANG', 'TMPDIR']\n"),
    "/tmp is capped in size": (
        "import os\ntry:\n    for i in range(10):\n"
        "        with open(f'/tmp/big{i}', 'wb') as f:\n            f.write(b'x' * (10 << 20))\n"
        "    print('wrote 100 MiB')\nexcept OSError as e:\n    print('capped', e.errno)",
        "capped 28\n",
    ),
    "/tmp is capped in files": (
        "try:\n    for i in range(3000):\n        open(f'/tmp/f{i}', 'w').close()\n"
        "    print('made 3000 files')\nexcept OSError as e:\n    print('capped', e.errno)",
        "capped 28\n",
    ),
    "no 3000 threads": (
        "import threading\nstop = threading.Event()\nstarted = 0\n"
        "try:\n    for _ in range(3000):\n        threading.Thread(target=stop.wait).start()\n        started += 1\n"
        "except RuntimeError:\n    pass\nstop.set()\nprint(started < 100)",
        "True\n",
    ),
    "no other process exists for it": (
        "import os\nanswers = set()\nfor p in range(1, 5000):\n"
        "    if p == os.getpid():\n        continue\n"
        "    try:\n        os.kill(p, 0)\n        answers.add('alive')\n"
        "    except ProcessLookupError:\n        answers.add('none')\n"
        "    except PermissionError:\n        answers.add('refused')\n"
        "print(os.getpid(), sorted(answers))",
        "1 ['refused']\n",  # pid 1 of its own namespace; the fence answers alike for every other pid
    ),
    "kill(-1) reaches nobody": (
        "import os, signal\ntry:\n    os.kill(-1, signal.SIGKILL)\n"
        "except OSError as e:\n    print('refused', e.errno)\nprint('alive')",
        "refused 1\nalive\n",  # the signal fence: EPERM for anything but itself
    ),
    "no namespace, mount or chroot of its own": (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.unshare(0x10000000), libc.unshare(0x00020000), libc.chroot(b'/tmp'),\n"
        "      libc.mount(b'none', b'/tmp', b'tmpfs', 0, None))",
        "-1 -1 -1 -1\n",
    ),
    "no raw socket even with network": (
        "import socket\ntry:\n    socket.socket(socket.AF_INET, socket.SOCK_RAW, 1)\n    print('raw socket')\n"
        "except PermissionError:\n    print('refused')",
        "refused\n",
    ),
}

NODE_CASES = {
    "no root": ("console.log(process.getuid() !== 0, process.getgid() !== 0)", "true true\n"),
    "nothing of the host is visible": (
        "const fs = require('fs')\n"
        "for (const p of ['/etc/shadow', '/etc/passwd', '/proc', '/sys', '/work', '/var/tmp', '/dev/shm'])"
        " console.log(p, fs.existsSync(p))",
        "".join(
            f"{p} false\n" for p in ("/etc/shadow", "/etc/passwd", "/proc", "/sys", "/work", "/var/tmp", "/dev/shm")
        ),
    ),
    "nothing but /tmp is writable (tree, wrapper, node)": (
        "const fs = require('fs'), path = require('path')\n"
        "const targets = ['/x', '/etc/x', '/usr/x', '/opt/sandlot/wrapper.js', '/opt/sandlot/x', process.execPath,"
        " path.dirname(process.execPath) + '/x', ...(require.resolve.paths('x') || []).map(p => p + '/x')]\n"
        "const written = targets.filter(t => {\n"
        "  try { fs.appendFileSync(t, ''); return true } catch (e) { return false }\n})\n"
        "console.log(JSON.stringify(written))",
        "[]\n",
    ),
    "only the scrubbed environment": (
        "console.log(JSON.stringify(Object.keys(process.env).sort()))",
        '["HOME","LANG","TMPDIR"]\n',
    ),
    "the startup snapshot is gone before the run": (
        "const fs = require('fs'); console.log(JSON.stringify(fs.readdirSync('/tmp')))",
        "[]\n",
    ),
    "a written shared object cannot be loaded": (
        "const fs = require('fs')\n"
        "const lib = ['/lib/x86_64-linux-gnu/libc.so.6', '/lib/aarch64-linux-gnu/libc.so.6',"
        " '/usr/lib/x86_64-linux-gnu/libc.so.6'].find(p => fs.existsSync(p))\n"
        "fs.copyFileSync(lib, '/tmp/evil.node')\n"
        "try { process.dlopen({exports: {}}, '/tmp/evil.node'); console.log('loaded') }"
        " catch (e) { console.log('refused') }",
        "refused\n",
    ),
    "no other process exists for it": (
        "const answers = new Set()\nfor (let p = 1; p < 5000; p++) {\n  if (p === process.pid) continue\n"
        "  try { process.kill(p, 0); answers.add('alive') } catch (e) { answers.add(e.code) }\n}\n"
        "console.log(process.pid, [...answers].join())",  # its own threads and the rest: all alike
        "1 EPERM\n",
    ),
    "/tmp is capped in size": (
        "const fs = require('fs')\ntry { for (let i = 0; i < 10; i++) fs.writeFileSync('/tmp/big' + i,"
        " Buffer.alloc(10 << 20)); console.log('wrote 100 MiB') } catch (e) { console.log('capped', e.code) }",
        "capped ENOSPC\n",
    ),
}


@pytest.mark.parametrize("name", PYTHON_CASES)
def test_python(jail, name):
    code, expected = PYTHON_CASES[name]
    assert output(jail, code, enable_network=True) == expected


@pytest.mark.parametrize("name", NODE_CASES)
def test_nodejs(jail, name):
    code, expected = NODE_CASES[name]
    assert output(jail, code, language="nodejs", enable_network=True) == expected


def test_concurrent_runs_do_not_see_each_others_files_or_processes(jail):
    holder = (
        "import os, time\nopen('/tmp/secret-a', 'w').write('a')\n"
        "for d in ('/var/tmp', '/dev/shm', '/'):\n"
        "    try:\n        open(d + '/secret-a', 'w').write('a')\n    except OSError:\n        pass\n"
        "time.sleep(3)\nprint(sorted(os.listdir('/tmp')))"
    )
    looker = (
        "import os\nopen('/tmp/secret-b', 'w').write('b')\n"
        "others = [os.path.exists(d + '/secret-a') for d in ('/tmp', '/var/tmp', '/dev/shm', '/')]\n"
        "print(sorted(os.listdir('/tmp')), others)\n"
        "print([p for p in range(3, 5000) if os.path.exists(f'/proc/{p}')])\n"
        "alive = []\nfor p in range(3, 5000):\n"
        "    try:\n        os.kill(p, 0)\n        alive.append(p)\n    except (ProcessLookupError, PermissionError):\n"
        "        pass\n"
        "print(alive)"
    )
    a, b = together(jail, ("python3", holder), ("python3", looker))
    assert a == "['secret-a']\n"
    assert b == "['secret-b'] [False, False, False, False]\n[]\n[]\n"


def test_a_run_cannot_signal_a_concurrent_run_through_f_setown(jail):
    victim = "import time\ntime.sleep(3)\nprint('survived')"
    attacker = (
        "import fcntl, os, signal\nr, w = os.pipe()\nowned = 0\n"
        "for p in range(1, 5000):\n    if p == os.getpid():\n        continue\n"
        "    try:\n        fcntl.fcntl(r, fcntl.F_SETOWN, p)\n    except OSError:\n        continue\n"
        "    owned += 1\n    fcntl.fcntl(r, fcntl.F_SETSIG, signal.SIGKILL)\n"
        "    fcntl.fcntl(r, fcntl.F_SETFL, fcntl.fcntl(r, fcntl.F_GETFL) | os.O_ASYNC)\n"
        "    os.write(w, b'x')\n    os.read(r, 1)\n"
        "print(owned)"
    )
    a, b = together(jail, ("python3", victim), ("python3", attacker))
    assert a == "survived\n"
    assert b == "0\n"  # F_SETOWN is refused outright (seccomp); the PID namespace would leave only its own init


def test_a_run_cannot_reach_the_node_waiting_for_the_next_run(jail):
    attacker = (
        "import os\nopened = []\nfor p in range(1, 5000):\n"
        "    for f in ('fd/0', 'mem', 'environ'):\n"
        "        try:\n            os.close(os.open(f'/proc/{p}/{f}', os.O_RDWR))\n            opened.append(p)\n"
        "        except OSError:\n            pass\n"
        "print(opened)"
    )
    waiting = "const t = Date.now(); while (Date.now() - t < 1500) {}; console.log('mine')"
    a, b = together(jail, ("python3", attacker), ("nodejs", waiting), delay=0.1)
    assert a == "[]\n"
    assert b == "mine\n"
    assert output(jail, "console.log('next tenant')", language="nodejs") == "next tenant\n"


def test_the_layers_show_at_a_fixed_path_and_the_data_dirs_stays_out_of_view(jail):
    """A layer's path on the host names the data dir (a user's home without root, a volume): runs see the
    layer at /opt/sandlot/layer instead, and nothing of the data dir's path."""
    layers_out_of_view(jail)


def layers_out_of_view(jail) -> None:
    detail = jail.detail()["runtimes"]
    layer = detail["python3"]["layer"]
    assert layer and not layer.startswith("/opt/sandlot/")
    code = (
        "import os, sys, json\n"
        f"print(os.path.exists({layer!r}), os.path.exists({os.path.dirname(layer)!r}))\n"
        "print([p for p in sys.path if 'layer' in p], json.__file__.startswith('/opt'))\n"
        "import requests\nprint(requests.__file__)"
    )
    assert output(jail, code) == (
        "False False\n['/opt/sandlot/layer'] False\n/opt/sandlot/layer/requests/__init__.py\n"
    )
    node_layer = detail["nodejs"]["layer"]
    code = (
        "const fs = require('fs')\n"
        f"console.log(fs.existsSync({node_layer!r}), fs.existsSync({os.path.dirname(node_layer)!r}))\n"
        "console.log(JSON.stringify(require.resolve.paths('x').filter(p => p.includes('layer'))))"
    )
    assert output(jail, code, language="nodejs") == 'false false\n["/opt/sandlot/layer/node_modules"]\n'


def test_a_run_cannot_change_the_shared_files(jail):
    """The hostile corpus' case (issue 41) in these modes: the layer is mounted read-only, or another uid's."""
    import test_hostile

    test_hostile.test_a_run_cannot_change_the_shared_files(jail)
