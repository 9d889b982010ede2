"""Small leaks between runs and out of the service: pids, locks, secrets shared in time, paths,
operator settings that reopen the jail, request parsing, files left after stop."""

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import needs_root
from service import Service, descendants, wait_for

from handler.settings import SettingsError, load_settings


@pytest.fixture(scope="module")
def reduced_service():
    try:
        svc = Service(SANDLOT_JAIL="reduced").start()
    except RuntimeError as exc:
        pytest.skip(f"the reduced jail is not offered here: {exc}")
    yield svc
    svc.stop()


@pytest.fixture(params=["default", "reduced"])
def jailed(request, service):
    """The service as it starts here (the root jail as root), and the reduced jail."""
    return service if request.param == "default" else request.getfixturevalue("reduced_service")


def run(service, code, language="python3", **fields):
    envelope = service.run(code, language=language, **fields)
    assert envelope["code"] == 0, envelope
    return envelope["data"]


# ---- which pids exist ------------------------------------------------------------------

PY_PIDS = """
import os, ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
def answer(call, *args):
    ctypes.set_errno(0)
    r = call(*args)
    return errno.errorcode.get(ctypes.get_errno(), 'ok') if r == -1 else 'ok'
for pid in {pids!r}:
    print(pid, ' '.join([
        answer(libc.kill, pid, 0),
        answer(libc.getpgid, pid),
        answer(libc.getsid, pid),
        answer(libc.sched_getscheduler, pid),
        answer(libc.sched_getaffinity, pid, 128, ctypes.create_string_buffer(128)),
        answer(libc.prlimit, pid, 7, None, ctypes.create_string_buffer(16)),
    ]))
os.kill(os.getpid(), 0)
print('self', os.getpgid(0) > 0, len(os.sched_getaffinity(0)) > 0)
"""

JS_PIDS = """
for (const pid of {pids}) {{
  try {{ process.kill(pid, 0); console.log(pid, 'ok'); }} catch (e) {{ console.log(pid, e.code); }}
}}
process.kill(process.pid, 0);
console.log('self ok');
"""


def probe_pids(service) -> list[int]:
    """pids that exist (the service, its zygotes, the host's pid 2) and one that cannot (above pid_max). (pid 1
    is the run itself, the first process of its PID namespace.)"""
    with open("/proc/sys/kernel/pid_max") as f:
        beyond = int(f.read()) + 1
    return [2, service.process.pid, *descendants(service.process.pid)[:2], beyond]


def test_a_python_run_cannot_tell_which_pids_exist(jailed):
    pids = probe_pids(jailed)
    data = run(jailed, PY_PIDS.format(pids=pids))
    lines = data["stdout"].splitlines()
    assert lines[:-1] == [f"{pid} EPERM EPERM EPERM EPERM EPERM EPERM" for pid in pids], data
    assert lines[-1] == "self True True", data


def test_a_nodejs_run_cannot_tell_which_pids_exist(jailed):
    pids = probe_pids(jailed)
    data = run(jailed, JS_PIDS.format(pids=pids), "nodejs")
    assert data["stdout"].splitlines() == [f"{pid} EPERM" for pid in pids] + ["self ok"], data


SIGNAL_OWNER = """
import ctypes, fcntl, os, errno
libc = ctypes.CDLL(None, use_errno=True)
r, w = os.pipe()
for name, command, arg in (('F_SETOWN', 8, {pid}), ('F_SETSIG', 10, 9), ('F_SETOWN_EX', 15, 0)):
    ctypes.set_errno(0)
    result = libc.fcntl(r, command, ctypes.c_long(arg))
    print(name, errno.errorcode.get(ctypes.get_errno(), 'ok') if result == -1 else 'ok')
ctypes.set_errno(0)
result = libc.ioctl(r, 0x8901, ctypes.byref(ctypes.c_int({pid})))  # FIOSETOWN
print('FIOSETOWN', errno.errorcode.get(ctypes.get_errno(), 'ok') if result == -1 else 'ok')
"""


def test_no_signal_owner_can_be_set_on_a_descriptor(jailed):
    # F_SETOWN + F_SETSIG + O_ASYNC would have the kernel signal another process on the run's behalf
    data = run(jailed, SIGNAL_OWNER.format(pid=jailed.process.pid))
    assert data["stdout"] == "F_SETOWN EPERM\nF_SETSIG EPERM\nF_SETOWN_EX EPERM\nFIOSETOWN EPERM\n", data


# ---- locks on shared files -----------------------------------------------------------

HOLDER = """
import fcntl, json, os, struct, time
held = []
for path in ('/etc/hosts', '/dev/null', json.__file__):
    f = open(path, 'rb')
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    fcntl.fcntl(f, fcntl.F_SETLK, struct.pack('hhqqi', fcntl.F_RDLCK, 0, 0, 0, 0))
    held.append(f)
print('holding')
time.sleep(2)
"""

PROBER = """
import fcntl, json, os, struct, time
time.sleep(0.7)
for path in ('/etc/hosts', '/dev/null', json.__file__):
    with open(path, 'rb') as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            flock = 'free'
        except BlockingIOError:
            flock = 'held'
        query = fcntl.fcntl(f, fcntl.F_GETLK, struct.pack('hhqqi', fcntl.F_WRLCK, 0, 0, 0, 0))
        record = 'free' if struct.unpack('hhqqi', query)[0] == fcntl.F_UNLCK else 'held'
        print(os.path.basename(path), flock, record)
"""


def test_a_lock_on_a_shared_file_is_not_seen_by_a_concurrent_run(jailed):
    with ThreadPoolExecutor(2) as pool:
        holder = pool.submit(run, jailed, HOLDER)
        prober = pool.submit(run, jailed, PROBER)
        assert holder.result()["stdout"] == "holding\n", holder.result()
        assert prober.result()["stdout"] == "hosts free free\nnull free free\n__init__.py free free\n", prober.result()


def test_locks_on_the_runs_own_files_still_work(jailed):
    code = (
        "import fcntl, sqlite3\n"
        "with open('l', 'w') as f:\n"
        "    fcntl.flock(f, fcntl.LOCK_EX)\n    fcntl.lockf(f, fcntl.LOCK_EX)\n    fcntl.lockf(f, fcntl.LOCK_UN)\n"
        "db = sqlite3.connect('x.db')  # in the run's own directory\n"
        "db.execute('create table t (v)')\n"
        "db.executemany('insert into t values (?)', [(1,), (2,)])\n"
        "db.commit()\n"
        "print(db.execute('select sum(v) from t').fetchone()[0])\n"
    )
    assert run(jailed, code)["stdout"] == "3\n"


# ---- how long runs share a zygote's secrets -------------------------------------------


def test_the_zygote_is_replaced_after_its_maximum_age():
    svc = Service(SANDLOT_ZYGOTE_MAX_AGE="2", MAX_WORKERS="1").start()
    try:
        code = "print(hash('sandlot'), id(object()) >> 12)"
        first = run(svc, code)["stdout"]
        assert run(svc, code)["stdout"].split()[0] == first.split()[0]  # one zygote: one secret
        generation = svc.detail()["runtimes"]["python3"]["zygote_generation"]
        time.sleep(2.5)
        run(svc, code)  # served by a child made earlier; the refill after it finds the zygote too old
        assert wait_for(lambda: svc.detail()["runtimes"]["python3"]["zygote_generation"] > generation, 30)
        assert run(svc, code)["stdout"].split()[0] != first.split()[0]
    finally:
        svc.stop()


def test_the_zygote_is_replaced_after_its_maximum_forks():
    """Runs share a hash secret only within a zygote's SANDLOT_ZYGOTE_MAX_FORKS children: past them, a new
    interpreter (a new PYTHONHASHSEED, a new address layout) serves."""
    svc = Service(SANDLOT_ZYGOTE_MAX_FORKS="10", MAX_WORKERS="1").start()
    try:
        code = "print(hash('sandlot'))"
        seen = [run(svc, code)["stdout"]]
        for _ in range(40):
            seen.append(run(svc, code)["stdout"])
            if len(set(seen)) > 1:
                break
        assert len(set(seen)) > 1, "one hash secret over 41 runs with a zygote replaced every 10 forks"
    finally:
        svc.stop()


def test_zygote_max_age_is_a_setting(monkeypatch):
    monkeypatch.setenv("SANDLOT_ZYGOTE_MAX_AGE", "-1")
    with pytest.raises(SettingsError, match="SANDLOT_ZYGOTE_MAX_AGE"):
        load_settings()
    monkeypatch.setenv("SANDLOT_ZYGOTE_MAX_AGE", "90")
    assert load_settings().runtime_config().zygote_max_age == 90


# ---- the service's own paths -------------------------------------------------------------

SERVICE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize(
    ("language", "code", "expected"),
    [
        ("python3", "def f(:\n    pass", 'File "<string>", line 1'),
        ("python3", "def f():\n    raise ValueError('boom')\nf()", "ValueError: boom"),
        ("python3", "import atexit\natexit.register(lambda: 1 / 0)", "ZeroDivisionError"),
        ("python3", "import json\njson.loads('{')", "json.decoder.JSONDecodeError"),
        ("nodejs", "let x = ;", "SyntaxError: Unexpected token ';'"),
        ("nodejs", "function f() { null.x }\nf()", "at f (main.js:1:"),
        ("nodejs", "setTimeout(() => { throw new Error('later') }, 1)", "Error: later"),
        ("nodejs", "console.log(new Error('mine').stack)", "at main.js:1:"),
    ],
)
def test_error_texts_do_not_show_the_services_paths(jailed, language, code, expected):
    data = run(jailed, code, language)
    text = data["error"] + data["stdout"] + data["stderr"]
    assert expected in text, data
    for secret in ("runner.py", "wrapper.js", "runtimes/", SERVICE_ROOT):
        assert secret not in text, (secret, data)


# Every string a Python run can reach from the objects it inherits (the zygote's modules, frames, their
# locals, the config it was started with): none names the service's install path. The path is given
# reversed, and the one string made from it (the needle itself) is left out of the search.
PY_INSTALL_PATH = """
import gc, sys
needle = {reversed_root!r}[::-1]
found = set()
def look(value):
    if isinstance(value, str) and value is not needle and needle in value:
        found.add(value[:120])
for thing in gc.get_objects():
    values = thing.values() if isinstance(thing, dict) else thing if isinstance(thing, (list, tuple, set)) else ()
    for value in list(values):
        look(value)
frame = sys._getframe()
while frame:
    for value in list(frame.f_locals.values()) + [frame.f_code.co_filename]:
        look(value)
    frame = frame.f_back
for value in sys.orig_argv + sys.argv + sys.path:
    look(value)
print(sorted(found))
"""

JS_INSTALL_PATH = """
const needle = {reversed_root!r}.split('').reverse().join('');
const seen = [process.argv, process.execArgv, process.execPath, process.cwd(), module.paths, module.filename,
  require.main && require.main.filename, Object.keys(require.cache), new Error('x').stack,
  JSON.stringify(process.env), JSON.stringify(process.report.getReport().header.commandLine)];
console.log(JSON.stringify(seen).includes(needle) ? 'seen' : 'unseen');
"""


def test_a_python_run_finds_no_string_naming_the_services_install_path(jailed):
    data = run(jailed, PY_INSTALL_PATH.format(reversed_root=SERVICE_ROOT[::-1]))
    assert data["stdout"] == "[]\n", data


def test_a_nodejs_run_finds_nothing_naming_the_services_install_path(jailed):
    data = run(jailed, JS_INSTALL_PATH.format(reversed_root=SERVICE_ROOT[::-1]), "nodejs")
    assert data["stdout"] == "unseen\n", data


# ---- settings that would reopen the jail -----------------------------------------------


def native(name: str) -> int:
    """A call's number on this machine: ALLOWED_SYSCALLS takes the running architecture's numbers."""
    from runtimes.linux.seccomp import syscall_number

    number = syscall_number(name)
    assert number is not None, name
    return number


@pytest.mark.parametrize(
    "name",
    [
        "io_uring_setup",
        "io_uring_enter",
        "io_uring_register",
        "memfd_create",
        "shmget",
        "semget",
        "msgget",
        "mq_open",
        "socket",
        "socketpair",
        "bind",
        "listen",
        "accept",
        "accept4",
        "ioctl",
        "fcntl",
        "flock",
        "kill",
        "tkill",
        "tgkill",
        "getpgid",
        "prlimit64",
        "inotify_add_watch",
        "open_by_handle_at",
        "personality",
    ],
)
def test_allowed_syscalls_cannot_reopen_what_the_jail_closes(monkeypatch, name):
    monkeypatch.setenv("ALLOWED_SYSCALLS", f"0,{native(name)}")
    with pytest.raises(SettingsError) as info:
        load_settings()
    assert "ALLOWED_SYSCALLS" in str(info.value) and name in str(info.value)


def test_allowed_syscalls_still_adds_harmless_calls(monkeypatch):
    getcpu = native("getcpu")  # which CPU the caller is on
    monkeypatch.setenv("ALLOWED_SYSCALLS", str(getcpu))
    settings = load_settings()
    assert [getcpu] == settings.ALLOWED_SYSCALLS


def test_start_up_refuses_io_uring_with_a_message():
    svc = Service(ALLOWED_SYSCALLS=str(native("io_uring_setup")))
    result = subprocess.run(
        [sys.executable, "-m", "handler.cli", "serve"], env=svc.env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "ALLOWED_SYSCALLS" in result.stderr and "io_uring_setup" in result.stderr


def test_the_health_detail_names_the_added_calls_on_this_architecture():
    """Through the API: ALLOWED_SYSCALLS read as this machine's numbers, each named, beside the architecture."""
    getcpu = native("getcpu")
    svc = Service(ALLOWED_SYSCALLS=str(getcpu)).start()
    try:
        with svc.client() as client:
            detail = client.get("/v1/sandbox/health").json()["data"]
    finally:
        svc.stop()
    assert detail["allowed_syscalls"] == {"architecture": os.uname().machine, "added": {str(getcpu): "getcpu"}}


# ---- request parsing ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 100_000 + b"]" * 100_000,
        b'{"code": ' * 50_000 + b"1" + b"}" * 50_000,
        b'{"language": "python3", "code": "print(1)", "dependencies": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    ],
    ids=["list", "object", "inside-a-field"],
)
def test_deeply_nested_json_gets_400(service, body):
    with service.client() as client:
        response = client.post("/v1/sandbox/run", content=body)
        assert response.status_code == 400, response.text
        assert response.json()["code"] == -400
        assert "nested too deeply" in response.json()["message"]
        update = client.post("/v1/sandbox/dependencies/update", content=body)
        assert update.status_code == 400 and update.json()["code"] == -400
    assert run(service, "print('alive')")["stdout"] == "alive\n"


# ---- what a stopped service leaves -------------------------------------------------------


@needs_root
def test_no_lock_file_is_left_in_run_sandlot_after_stop():
    base = 3_000_000_000 + (os.getpid() % 1000) * 4096  # a block no other test uses
    svc = Service(SANDLOT_UID_BASE=str(base)).start()
    try:
        uid_ranges = [r["uid_range"] for r in svc.detail()["runtimes"].values() if r.get("uid_range")]
        files = [f"/run/sandlot/uids-{first}.lock" for first, _last in uid_ranges]
        assert files and all(os.path.exists(f) for f in files)
    finally:
        svc.stop()
    assert [f for f in files if os.path.exists(f)] == []


def test_a_zygote_slower_than_its_start_timeout_is_given_up_saying_so(monkeypatch):
    """SANDLOT_ZYGOTE_START_TIMEOUT: how long a zygote may take to be ready (the preloaded Python zygote imports
    the whole layer from source, minutes on an emulated arm64 machine); past it the runtime says why it is not
    ready, naming the setting."""
    monkeypatch.setenv("SANDLOT_ZYGOTE_START_TIMEOUT", "0")
    with pytest.raises(SettingsError, match="SANDLOT_ZYGOTE_START_TIMEOUT"):
        load_settings()
    monkeypatch.setenv("SANDLOT_ZYGOTE_START_TIMEOUT", "240")
    assert load_settings().runtime_config().zygote_start_timeout == 240
    svc = Service(SANDLOT_ZYGOTE_START_TIMEOUT="0.01", NODEJS_PATH="/nonexistent/node").start(wait=False)

    def given_up() -> bool:
        try:
            error = svc.detail()["runtimes"]["python3"].get("error") or ""
        except Exception:  # not listening yet
            return False
        return "not ready in 0.01 s (SANDLOT_ZYGOTE_START_TIMEOUT)" in error

    try:
        assert wait_for(given_up, 60), svc.output()[-2000:]
    finally:
        svc.stop()
