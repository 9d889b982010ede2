"""A literal /tmp in the `landlock` jail (issue 30): where a mode cannot give a run a /tmp of its own, the error
says where to write instead.

Runs there share the service's uid, with no mount namespace and no tree: /tmp is the platform's, and the run's
Landlock domain lets it write only under its own directory (its working directory, TMPDIR, what
tempfile.gettempdir() and os.tmpdir() answer). A refused write to /tmp/name ends its printed error with one line
saying so and naming that directory, the same words in both languages; an error elsewhere prints as it did; and
writing under the directory it names works. Through the HTTP API of a whole service started under the stand-in
of a restricted pod, as tests/test_landlock_mode.py starts one.
"""

from __future__ import annotations

import glob
import os
import threading
import time

import pytest
import test_landlock_mode
from unprivileged import NOBODY

from runtimes.jail import modes

pod = test_landlock_mode.pod  # the fixture: a whole service in a restricted pod's stand-in (landlock)

NOTE = "sandlot: /tmp is not writable in the landlock jail; write under the working directory (TMPDIR={}) instead"


def test_only_modes_without_a_tmp_of_their_own_carry_the_note():
    for mode in (modes.FULL, modes.USERNS, modes.CHROOT_MODE):
        assert mode.own_tmp and mode.tmp_note == ""
    assert not modes.LANDLOCK_MODE.own_tmp
    assert modes.LANDLOCK_MODE.tmp_note == NOTE.format("{tmpdir}")
    assert "in the single jail" in modes.SINGLE.tmp_note


def _failed(svc, code: str, language: str) -> tuple[str, str]:
    """A run that prints its working directory and then fails: (that directory, what it printed on stderr)."""
    envelope = svc.run(code, language)
    assert envelope["code"] == 0, envelope
    data = envelope["data"]
    assert data["exit_code"] == 1, data
    return data["stdout"].strip(), data["stderr"]


WRITE_TMP = {
    "python3": "import os; print(os.getcwd()); open('/tmp/report.pdf', 'w').write('pdf')",
    "nodejs": "console.log(process.cwd()); require('fs').writeFileSync('/tmp/report.pdf', 'pdf')",
}


@pytest.mark.parametrize("language", list(WRITE_TMP))
def test_a_refused_write_to_tmp_says_where_to_write(pod, language):
    directory, stderr = _failed(pod, WRITE_TMP[language], language)
    assert directory.startswith("/") and directory != "/tmp"
    assert "EACCES" in stderr or "PermissionError: [Errno 13]" in stderr
    assert NOTE.format(directory) in stderr.splitlines(), stderr


ASYNC_WRITE_TMP = {
    # a directory under /tmp, the run's own directory reached from its parent, a promise's rejection
    "python3": "import os; print(os.getcwd()); os.makedirs('/tmp/out/reports')",
    "nodejs": "console.log(process.cwd()); require('fs').promises.writeFile('../beside-my-directory', 'x')",
}


@pytest.mark.parametrize("language", list(ASYNC_WRITE_TMP))
def test_other_calls_and_relative_paths_under_tmp_get_the_note_too(pod, language):
    directory, stderr = _failed(pod, ASYNC_WRITE_TMP[language], language)
    assert NOTE.format(directory) in stderr.splitlines(), stderr


ELSEWHERE = {
    # refused, but not under /tmp
    ("python3", "refused"): "print(1); open('/etc/shadow')",
    ("nodejs", "refused"): "console.log(1); require('fs').readFileSync('/etc/shadow')",
    # under /tmp, but not refused (no such file)
    ("python3", "missing"): "print(1); open('/tmp/sandlot-no-such-file')",
    ("nodejs", "missing"): "console.log(1); require('fs').readFileSync('/tmp/sandlot-no-such-file')",
    # refused, not by the jail, under the run's own directory
    ("python3", "own"): "print(1); raise PermissionError(13, 'Permission denied', 'mine.txt')",
    ("nodejs", "own"): (
        "console.log(1); throw Object.assign(new Error('EACCES: permission denied'), "
        "{code: 'EACCES', path: process.cwd() + '/mine.txt'})"
    ),
}


@pytest.mark.parametrize(("language", "case"), list(ELSEWHERE))
def test_an_error_elsewhere_prints_as_it_did(pod, language, case):
    _, stderr = _failed(pod, ELSEWHERE[(language, case)], language)
    assert ("Error" in stderr) and "sandlot:" not in stderr, stderr


ROUND_TRIP = {
    "python3": (
        "import os, tempfile\n"
        "for path in (os.path.join(tempfile.gettempdir(), 'a.pdf'), os.environ['TMPDIR'] + '/b.pdf', 'c.pdf'):\n"
        "    with open(path, 'w') as f:\n"
        "        f.write(path[-5:])\n"
        "print(sorted(open(name).read() for name in os.listdir('.')))\n"
    ),
    "nodejs": (
        "const fs = require('fs'), os = require('os'), path = require('path');\n"
        "for (const p of [path.join(os.tmpdir(), 'a.pdf'), process.env.TMPDIR + '/b.pdf', 'c.pdf'])"
        " fs.writeFileSync(p, p.slice(-5));\n"
        "console.log(JSON.stringify(fs.readdirSync('.').map((n) => fs.readFileSync(n, 'utf8')).sort()));\n"
    ),
}


@pytest.mark.parametrize("language", list(ROUND_TRIP))
def test_writing_where_the_note_says_works(pod, language):
    envelope = pod.run(ROUND_TRIP[language], language)
    assert envelope["code"] == 0, envelope
    out = envelope["data"]["stdout"].replace('"', "'").replace(", ", ",")
    assert out == "['a.pdf','b.pdf','c.pdf']\n", envelope["data"]


EVERYDAY_TMP = {
    "python3": (
        "import os, shutil, tempfile\n"
        "with tempfile.NamedTemporaryFile('w', delete=False, suffix='.csv') as f:\n"
        "    f.write('a,b\\n')\n"
        "d = tempfile.mkdtemp()\n"
        "shutil.copyfile(f.name, os.path.join(d, 'copy.csv'))\n"
        "os.makedirs('out/reports/2024', exist_ok=True)\n"
        "with tempfile.TemporaryDirectory() as t:\n"
        "    open(os.path.join(t, 'x'), 'w').write('x')\n"
        "shutil.rmtree(d)\n"
        "print(sorted(os.listdir('out')), os.path.exists(d))\n"
    ),
    "nodejs": (
        "const fs = require('fs'), os = require('os'), path = require('path');\n"
        "const d = fs.mkdtempSync(path.join(os.tmpdir(), 'x-'));\n"
        "fs.writeFileSync(path.join(d, 'a.csv'), 'a,b\\n');\n"
        "fs.copyFileSync(path.join(d, 'a.csv'), path.join(d, 'copy.csv'));\n"
        "fs.mkdirSync('out/reports/2024', {recursive: true});\n"
        "fs.rmSync(d, {recursive: true});\n"
        "console.log(JSON.stringify([fs.readdirSync('out'), fs.existsSync(d)]));\n"
    ),
}


@pytest.mark.parametrize("language", list(EVERYDAY_TMP))
def test_everyday_tmp_use_keeps_working(pod, language):
    """What the landlock jail's refusals of a file's mode and times (through descriptors too) leave working:
    temporary files and directories, copies of files' contents, nested directories, removal (issue 41)."""
    envelope = pod.run(EVERYDAY_TMP[language], language)
    assert envelope["code"] == 0 and envelope["data"]["exit_code"] == 0, envelope
    assert envelope["data"]["stdout"].replace('"', "'").replace(", ", ",") in (
        "['reports'] False\n",
        "[['reports'],false]\n",
    ), envelope["data"]


# ---- a directory the service cannot list (issue 41): runs share its uid, and it holds no capability -------------

LOCKS = (
    "import ctypes, os\n"
    "print(os.getcwd(), flush=True)\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "os.mkdir('d')\n"
    "def umasked():\n"
    "    os.umask(0o700); os.mkdir('u')\n"
    "def mkdirat():\n"
    "    if libc.mkdirat(-100, b'm', 0o300): raise OSError(ctypes.get_errno(), 'mkdirat')\n"
    "def fchmod_dir():\n"
    "    fd = os.open('d', os.O_RDONLY); os.fchmod(fd, 0)\n"
    "for name, attempt in [('mkdir 0300', lambda: os.mkdir('a', 0o300)), ('mkdir 0', lambda: os.mkdir('b', 0)),\n"
    "                      ('makedirs 0300', lambda: os.makedirs('c/c', 0o300)), ('umask 0700', umasked),\n"
    "                      ('mkdirat 0300', mkdirat), ('chmod 0300', lambda: os.chmod('d', 0o300)),\n"
    "                      ('fchmod 0', fchmod_dir)]:\n"
    "    try:\n"
    "        attempt()\n"
    "    except PermissionError:\n"
    "        pass\n"
    "print(sorted((n, oct(os.stat(n).st_mode & 0o777)) for n in os.listdir('.') if os.path.isdir(n)), flush=True)\n"
    "chunk = b'x' * (8 << 20)\n"
    "for i in range(14):\n"
    "    with open(f'd/f{i}', 'wb') as f:\n"
    "        f.write(chunk)\n"
    "import time; time.sleep(5)\n"
    "print('all written')\n"
)


def _gone(path: str, seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while os.path.lexists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not os.path.lexists(path)


def test_a_run_makes_no_directory_it_cannot_list_and_its_writes_stay_capped(pod):
    """Every way to a directory without its owner's read and search bits is refused (or, fchmod, answered
    without a change); 112 MiB written under the directory it made end the run at the 64 MiB cap, and nothing of
    the run is left once it ended. Before: a 0300 directory kept 112 MiB past the cap, and outlived the run."""
    envelope = pod.run(LOCKS, timeout=20)
    assert envelope["code"] == 0, envelope
    data = envelope["data"]
    directory, modes_seen = data["stdout"].splitlines()[:2]
    assert modes_seen == "[('c', '0o755'), ('d', '0o755')]", data  # makedirs' parents keep the default mode
    assert "all written" not in data["stdout"] and "error: /tmp size limit exceeded (64 MiB)" in data["error"], data
    assert _gone(directory), os.listdir(directory)


def test_a_directory_the_service_cannot_list_ends_the_run_and_goes(pod):
    """Should a run's directory lose its owner's bits anyway (here the test takes them away, as root, while the run
    lives), the watcher ends the run instead of leaving what it holds uncounted, and removal gives the bits back:
    nothing of the run is left."""
    code = (
        "import os, time\n"
        "print(os.getcwd(), flush=True)\n"
        "os.makedirs('locked/inner')\n"
        "open('locked/inner/f', 'wb').write(b'x' * 4096)\n"
        "open('ready', 'w').close()\n"
        "for i in range(100):\n"
        "    open(f'locked/g{i}', 'wb').write(b'y')\n"  # changes: the watcher scans again
        "    time.sleep(0.05)\n"
        "print('not ended')\n"
    )
    result = {}
    runner = threading.Thread(target=lambda: result.setdefault("envelope", pod.run(code, timeout=20)))
    runner.start()
    directory = None
    deadline = time.monotonic() + 10
    while directory is None and time.monotonic() < deadline:
        for parent in test_landlock_mode._run_parents():
            for run in os.listdir(parent):
                if os.path.exists(os.path.join(parent, run, "ready")):
                    directory = os.path.join(parent, run)
        time.sleep(0.02)
    assert directory, "the run's directory was not found"
    os.chmod(os.path.join(directory, "locked", "inner"), 0)
    os.chmod(os.path.join(directory, "locked"), 0o300)
    runner.join()
    data = result["envelope"]["data"]
    assert "not ended" not in data["stdout"], data
    assert "error: /tmp could not be checked: a directory in it cannot be listed" in data["error"], data
    assert _gone(directory), os.listdir(directory)


def test_a_killed_instances_unlistable_leftovers_go_at_the_next_start(pod):
    """What a killed instance left (its runs' parent, under a pid that is gone, and a trash name an earlier
    release's failed removal left) goes at the next start, however its directories' modes were set."""
    dead = next(pid for pid in range(4_000_000, 4_100_000) if not os.path.exists(f"/proc/{pid}"))
    planted = [f"/tmp/sandlot-python3-{dead}-leftover", f"/tmp/sandlot-python3-{dead}-older.trash-{'0' * 32}"]
    for parent in planted:
        locked = os.path.join(parent, "run-x", "locked")
        os.makedirs(os.path.join(locked, "inner"))
        with open(os.path.join(locked, "inner", "f"), "wb") as f:
            f.write(b"x" * 4096)
        for root, dirs, files in os.walk(parent):
            for name in [*dirs, *files]:
                os.chown(os.path.join(root, name), NOBODY, NOBODY)
        os.chown(parent, NOBODY, NOBODY)
        os.chmod(os.path.join(locked, "inner"), 0)
        os.chmod(locked, 0o300)
    pod.stop()
    pod.start()
    assert _out_ok(pod.run("print('serving')")) == "serving\n"
    left = glob.glob(f"/tmp/sandlot-python3-{dead}-*")  # under its name, or renamed to a trash name and left there
    assert left == [], left


def _out_ok(envelope: dict) -> str:
    assert envelope["code"] == 0 and envelope["data"]["exit_code"] == 0, envelope
    return envelope["data"]["stdout"]
