"""The `landlock` jail: runs share the service's uid, each in a Landlock domain of its own
(jail/policy/landlock_mode.py).

Two levels. The domain itself, in a forked process of the service's uid (nobody) confined as a child of that
mode is: every reach of issue 30's list (the data dir and its keys, a layer's build directory, another run's
files, /dev/shm, a same-uid process's signals and /proc files, an abstract unix socket) is refused, at this
kernel's ABI and as older ABIs would give it (the seccomp part standing in); the same attempts with no rule at
all, and with Landlock alone where the ABI lacks a right, succeed, so each assertion can fail. Then a whole
service started as nobody under a stand-in of a restricted pod (no capabilities, no_new_privs, a seccomp
profile refusing namespaces): it picks `landlock`, serves both languages, and its runs reach none of those.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import unprivileged
from service import OUTER_FILTER, Service, descendants
from test_container import HELD_UNNAMED
from test_hostile import _cmdline

from runtimes.jail import modes
from runtimes.jail.policy import allowlist, landlock_mode
from runtimes.linux import landlock, syscalls
from runtimes.linux.procfs import stat_fields
from runtimes.linux.protections import Protections, in_child
from runtimes.linux.rootfs import DEVICES

NOBODY = unprivileged.NOBODY
KERNEL_ABI = 0
try:
    KERNEL_ABI = landlock.abi_version()
except OSError:
    pass
needs_landlock = pytest.mark.skipif(KERNEL_ABI < 6, reason="needs a kernel with Landlock ABI 6 or later")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as the service's uid (nobody)")

RESTRICTED = Protections(
    euid=1000680000,
    seccomp=True,
    no_new_privs=True,
    dumpable=True,
    pdeathsig=True,
    user_namespaces=False,
    mount_namespaces=False,
    pid_namespaces=False,
    net_namespaces=False,
    chroot=False,
    setuid=False,
    rlimits=True,
    landlock=7,
    cgroups=False,
    errors={"user_namespaces": "PermissionError: [Errno 1] Operation not permitted"},
)
NO_LANDLOCK = dataclasses.replace(RESTRICTED, landlock=0, errors={"landlock": "OSError: [Errno 38]"})


# ---- the mode record ----------------------------------------------------------------------------------------


def test_a_restricted_pod_gets_the_landlock_jail():
    chosen = modes.select("auto", RESTRICTED, False)
    assert chosen.name == "landlock" and chosen.narrow_domain and chosen.shares_uid
    assert chosen.tree == modes.NO_TREE and chosen.tmp == modes.DIRECTORY and chosen.clone_flags == 0
    assert modes.select("landlock", RESTRICTED, False).name == "landlock"
    # one run at a time (a Lambda function, `sandlot run --local`) keeps the single jail, as before
    assert modes.select("auto", RESTRICTED, True).name == "single"


@pytest.mark.parametrize(
    ("record", "requested", "why"),
    [
        (dataclasses.replace(RESTRICTED, landlock=0, errors={"landlock": "OSError: [Errno 38]"}), "auto", "landlock"),
        (
            dataclasses.replace(RESTRICTED, landlock=0, errors={"landlock": "OSError: [Errno 38]"}),
            "landlock",
            "[Errno 38]",
        ),
        (dataclasses.replace(RESTRICTED, seccomp=False), "landlock", "missing: seccomp"),
        (dataclasses.replace(RESTRICTED, euid=0), "landlock", "would run user code as root"),
    ],
)
def test_the_landlock_jail_fails_closed(record, requested, why):
    with pytest.raises(modes.JailRefused) as refused:
        modes.select(requested, record, False)
    assert why in str(refused.value)


def test_what_seccomp_holds_for_each_abi():
    assert landlock_mode.what_seccomp_adds(7) == [
        "a file's mode, times, owner and extended attributes, by path and by descriptor",
        "directories its owner cannot list (mkdir's mode, the umask)",
        "pipes grown past their default size (buffers counted per uid)",
    ]
    assert "truncate by path" not in landlock_mode.what_seccomp_adds(3)
    assert any("no Landlock scopes" in held for held in landlock_mode.what_seccomp_adds(5))
    assert "truncate by path" in landlock_mode.what_seccomp_adds(2)


# ---- the domain, in a process of the service's uid ----------------------------------------------------------


@pytest.fixture(scope="module")
def places():
    """What a run must not reach, all of them the service's uid's (nobody): a data dir with a key, a layer
    beside its build directory, another run's directory, a /dev/shm file, a same-uid process (the service
    stand-in) listening on an abstract unix socket."""
    if os.geteuid() != 0:
        pytest.skip("needs root to act as the service's uid (nobody)")
    base = tempfile.mkdtemp(prefix="sandlot-landlock-", dir="/var/tmp")
    os.chmod(base, 0o755)
    paths = {
        "key": os.path.join(base, "data", "keys", "api.key"),
        "build": os.path.join(base, "data", "layers", "python", "build-1", "setup.py"),
        "layer": os.path.join(base, "data", "layers", "python", "layer-1", "module.py"),
        "other_run": os.path.join(base, "runs", "run-other", "secret.txt"),
        "own_run": os.path.join(base, "runs", "run-own", "mine.txt"),
        "shm": f"/dev/shm/sandlot-landlock-{os.getpid()}",
    }
    for path in paths.values():
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write("secret\n")
    for root, dirs, files in os.walk(base):
        for name in [*dirs, *files]:
            os.chown(os.path.join(root, name), NOBODY, NOBODY)
    os.chown(base, NOBODY, NOBODY)
    os.chown(paths["shm"], NOBODY, NOBODY)
    abstract = f"sandlot-landlock-{os.getpid()}"
    service = subprocess.Popen(
        [
            unprivileged.SYSTEM_PYTHON,
            "-c",
            "import socket, sys, time\n"
            "s = socket.socket(socket.AF_UNIX)\n"
            "s.bind('\\0' + sys.argv[1]); s.listen(8)\n"
            "print('up', flush=True)\n"
            "time.sleep(600)\n",
            abstract,
        ],
        user=NOBODY,
        group=NOBODY,
        extra_groups=[],
        stdout=subprocess.PIPE,
        env={"API_KEY": "the-service-key"},
    )
    assert service.stdout.readline() == b"up\n"
    yield {**paths, "base": base, "service": service.pid, "abstract": abstract}
    service.kill()
    service.wait()
    shutil.rmtree(base, ignore_errors=True)
    os.unlink(paths["shm"])


def _attempts(places: dict) -> dict:
    """What a run might try, each returning "ok" or the errno's name."""

    def read(path):
        return lambda: open(path).read()

    def grow_pipe():
        r, w = os.pipe()
        try:
            fcntl.fcntl(w, 1031, 1 << 20)  # F_SETPIPE_SZ
        finally:
            os.close(r)
            os.close(w)

    def connect():
        with socket.socket(socket.AF_UNIX) as s:
            s.connect("\0" + places["abstract"])

    return {
        "read the data dir's key": read(places["key"]),
        "list the data dir": lambda: os.listdir(os.path.dirname(os.path.dirname(places["key"]))),
        "read a layer's build directory": read(places["build"]),
        "read another run's file": read(places["other_run"]),
        "write into another run's directory": lambda: open(places["other_run"] + ".new", "w").close(),
        "read another's /dev/shm file": read(places["shm"]),
        "signal the service": lambda: os.kill(places["service"], 0),
        "read the service's environment": read(f"/proc/{places['service']}/environ"),
        "list processes": lambda: os.listdir("/proc"),
        "connect to the service's abstract socket": connect,
        "chmod the data dir": lambda: os.chmod(os.path.dirname(places["key"]), 0o755),  # its mode: no harm done
        "truncate the data dir's key": lambda: os.truncate(places["key"], 0),
        "grow a pipe's buffer (counted per uid)": grow_pipe,
    }


def _confined_attempt(places: dict, name: str, abi: int, landlock_rules: bool, seccomp_rules: bool):
    readable = (os.path.dirname(places["layer"]),)
    writable = (os.path.dirname(places["own_run"]),)

    def attempt():
        os.setgroups([])
        os.setresgid(NOBODY, NOBODY, NOBODY)
        os.setresuid(NOBODY, NOBODY, NOBODY)
        syscalls.set_no_new_privs()
        if landlock_rules:
            landlock.Prepared(abi, DEVICES, readable).restrict(writable)
        if seccomp_rules:
            allowlist.compile_program(allowlist.shared_uid_rules(abi)).load()
            allowlist.fence_program(os.getpid()).load()
            if abi < landlock_mode.SCOPES_ABI:  # the runner's allow-list: no AF_UNIX socket but socketpair
                flt = allowlist.build(network=True)
                allowlist.compile_program(flt).load()
        try:
            _attempts(places)[name]()
        except OSError as exc:
            return errno.errorcode[exc.errno]
        return "ok"

    value, error = in_child(attempt)
    assert not error, error
    return value


ATTEMPTS = list(_attempts({"key": "/k/k/k", "build": "", "other_run": "", "shm": "", "service": 0, "abstract": ""}))
# what Landlock alone leaves open at an ABI, for the seccomp part to hold (and which it does)
LANDLOCK_ALONE_OPEN = {
    7: {"chmod the data dir", "grow a pipe's buffer (counted per uid)"},
    5: {
        "chmod the data dir",
        "grow a pipe's buffer (counted per uid)",
        "signal the service",
        "connect to the service's abstract socket",
    },
    2: {
        "chmod the data dir",
        "grow a pipe's buffer (counted per uid)",
        "signal the service",
        "connect to the service's abstract socket",
        "truncate the data dir's key",
    },
}


@needs_root
@needs_landlock
@pytest.mark.parametrize("name", ATTEMPTS)
def test_with_no_rule_every_attempt_succeeds(places, name):
    """The control: the service's uid reaches all of it, so each refusal below is the rule's doing."""
    assert _confined_attempt(places, name, KERNEL_ABI, landlock_rules=False, seccomp_rules=False) == "ok"


@needs_root
@needs_landlock
@pytest.mark.parametrize("abi", [7, 5, 2])
@pytest.mark.parametrize("name", ATTEMPTS)
def test_a_run_reaches_none_of_it(places, name, abi):
    """At this kernel's ABI and as older kernels give it: Landlock, and seccomp where Landlock cannot."""
    abi = min(abi, KERNEL_ABI)
    result = _confined_attempt(places, name, abi, landlock_rules=True, seccomp_rules=True)
    assert result in ("EACCES", "EPERM"), f"{name} at ABI {abi}: {result}"
    alone = _confined_attempt(places, name, abi, landlock_rules=True, seccomp_rules=False)
    if name in LANDLOCK_ALONE_OPEN[abi]:
        assert alone == "ok", f"Landlock ABI {abi} alone already refuses {name}: {alone}"
    else:
        assert alone in ("EACCES", "EPERM"), f"{name} at ABI {abi}, Landlock alone: {alone}"


@needs_root
@needs_landlock
def test_a_run_still_uses_its_own_directory_and_the_layer(places):
    def own():
        return open(places["own_run"]).read() + open(places["layer"]).read()

    def attempt():
        os.setgroups([])
        os.setresgid(NOBODY, NOBODY, NOBODY)
        os.setresuid(NOBODY, NOBODY, NOBODY)
        syscalls.set_no_new_privs()
        landlock.Prepared(KERNEL_ABI, DEVICES, (os.path.dirname(places["layer"]),)).restrict(
            (os.path.dirname(places["own_run"]),)
        )
        allowlist.compile_program(allowlist.shared_uid_rules(KERNEL_ABI)).load()
        own_dir = os.path.dirname(places["own_run"])
        with open(os.path.join(own_dir, "new.txt"), "w") as f:
            f.write("x")
            mode = os.fstat(f.fileno()).st_mode
            os.fchmod(f.fileno(), 0o600)  # answered without a change (seccomp sees no path: its own files too)
            if os.fstat(f.fileno()).st_mode != mode:
                return "fchmod changed a mode"
        os.makedirs(os.path.join(own_dir, "a", "b"))  # mkdir's default mode (0777) keeps the owner's r and x
        try:
            os.mkdir(os.path.join(own_dir, "unlistable"), 0o300)
            return "an unlistable directory was made"
        except PermissionError:
            pass
        return own()

    value, error = in_child(attempt)
    assert not error and value == "secret\nsecret\n"


# ---- a whole service in a restricted pod's stand-in ---------------------------------------------------------

# nobody, no capabilities (not root), no_new_privs, a seccomp profile refusing unshare and clone with CLONE_NEW*
# (Docker's default: the RuntimeDefault profile a restricted pod gets): no user namespaces
RESTRICTED_POD = [sys.executable, OUTER_FILTER, "--uid", str(NOBODY), "--profile", "docker-default", "--"]


@pytest.fixture(scope="module")
def pod():
    if unprivileged.unavailable():
        pytest.skip(unprivileged.unavailable())
    if KERNEL_ABI < 1:
        pytest.skip("needs Landlock")
    svc = unprivileged.service()
    svc.user = None  # outer_filter changes to it, after its filter is loaded as root
    svc.launcher = RESTRICTED_POD
    svc.start()
    yield svc
    svc.stop()


def _out(envelope: dict) -> str:
    assert envelope["code"] == 0, envelope
    return envelope["data"]["stdout"] + envelope["data"]["stderr"]


def test_the_restricted_pod_serves_both_languages_in_the_landlock_jail(pod):
    detail = pod.detail()
    for language in ("python3", "nodejs"):
        runtime = detail["runtimes"][language]
        assert runtime["ready"], runtime["error"]
        assert runtime["protections"]["mode"] == "landlock"
        assert runtime["protections"]["landlock_scopes"] is (KERNEL_ABI >= 6)
        assert runtime["protections"]["network"] == "none"  # SANDLOT_UNFILTERED_EGRESS=no-network
    assert _out(pod.run("import requests, json; print(json.dumps([1]))")) == "[1]\n"
    assert _out(pod.run("console.log(require('crypto').createHash('sha1').update('a').digest('hex'))", "nodejs"))


SERVICE_REACH = {
    "the data dir": "import os; os.listdir({data!r})",
    "the layers' directory": "import os; os.listdir({data!r} + '/layers/python')",
    "a process list": "import os; os.listdir('/proc')",
    "the service's environment": "open('/proc/{service}/environ').read()",
    "the service's signals": "import os; os.kill({service}, 0)",
    "the service's files' modes": "import os; os.chmod({data!r}, 0o700)",
    "the service's code": "open({source!r} + '/runtimes/python/runner.py').read()",
    "the service's code, listed": "import os; os.listdir({source!r} + '/runtimes')",
}


@pytest.mark.parametrize("name", list(SERVICE_REACH))
def test_a_run_cannot_reach_the_service(pod, name):
    # the stand-in launcher execs the service: its pid is the service's
    code = SERVICE_REACH[name].format(data=pod.env["SANDLOT_DATA_DIR"], service=pod.process.pid, source=pod.source)
    out = _out(pod.run(code + "\nprint('reached')"))
    assert "reached" not in out and ("PermissionError" in out), out


def test_a_run_learns_nothing_of_the_services_install_path(pod):
    """The shared case (tests/cases/run_cases.json), and the path itself searched for in what a run inherits."""
    from test_cases import CASES, check
    from test_leaks import JS_INSTALL_PATH, PY_INSTALL_PATH

    case = next(c for c in CASES if c["id"] == "py-no-install-path")
    check(case["expect"], pod.run(case["code"])["data"])
    assert _out(pod.run(PY_INSTALL_PATH.format(reversed_root=pod.source[::-1]))) == "[]\n"
    assert _out(pod.run(JS_INSTALL_PATH.format(reversed_root=pod.source[::-1]), "nodejs")) == "unseen\n"


def test_a_run_sees_no_data_dir_and_cannot_read_the_node_snapshot(pod):
    """Issue 41: the layer at a fixed name (a Jinja2 traceback, requests.__file__, sys.path; node's command line,
    its snapshot its own copy), the data dir's name nowhere in them; the data dir's snapshot blob unreadable; the
    layer still imported."""
    from test_cases import CASES, check

    data = pod.env["SANDLOT_DATA_DIR"]
    for case in CASES:
        if case["id"] in ("py-jinja2-traceback-fixed-names", "js-command-line-fixed-names"):
            check(case["expect"], pod.run(case["code"], case["language"])["data"])
    shown = _out(
        pod.run(
            "import sys, traceback, jinja2, requests\ntry:\n    jinja2.Template('{{ 1 / 0 }}').render()\n"
            "except ZeroDivisionError:\n    traceback.print_exc(file=sys.stdout)\n"
            "print(requests.__file__, sys.path, requests.get.__code__.co_filename)"
        )
    )
    assert "ZeroDivisionError" in shown and "requests/__init__.py" in shown and data not in shown, shown
    line = _out(pod.run("console.log(JSON.stringify(process.report.getReport().header.commandLine))", "nodejs"))
    assert "--snapshot-blob" in line and data not in line, line
    assert "/proc/self/fd/" in line, line  # the zygote's sealed copy: closed before the run's code
    fd = line.split("/proc/self/fd/")[1].split('"')[0]
    read = "try {{ require('fs').readFileSync({!r}); console.log('read') }} catch (e) {{ console.log(e.code) }}"
    held = f"const fs = require('fs'); try {{ console.log(fs.readlinkSync('/proc/self/fd/{fd}')) }} catch (e) {{}}"
    assert "memfd" not in _out(pod.run(held, "nodejs"))  # (the number reused by node: /dev/null, a pipe)
    blobs = [str(p) for p in Path(data, "snapshots").rglob("*") if p.is_file()]
    assert blobs, "no startup snapshot to try"
    for blob in blobs[:2]:
        read = (
            f"try {{ require('fs').readFileSync({blob!r}); console.log('read') }} catch (e) {{ console.log(e.code) }}"
        )
        assert _out(pod.run(read, "nodejs")) == "EACCES\n"
        assert "PermissionError" in _out(pod.run(f"open({blob!r}, 'rb').read(1)\nprint('read')"))


def test_a_run_cannot_reach_another_run(pod):
    """Run A keeps a file in its /tmp and sleeps; run B, knowing A's path and pid, can neither read, nor write
    beside, nor signal, nor open A's /proc entries."""
    results = {}
    marker = f"marker-{os.getpid()}-{time.monotonic_ns()}"
    a = threading.Thread(
        target=lambda: results.setdefault(
            "a", pod.run(f"open('{marker}', 'w').write('secret'); import time; time.sleep(4); print('a done')")
        )
    )
    a.start()
    found = None
    deadline = time.monotonic() + 10
    while found is None and time.monotonic() < deadline:
        for root in _run_parents():
            for run in os.listdir(root):
                if os.path.exists(os.path.join(root, run, marker)):
                    found = os.path.join(root, run)
        time.sleep(0.05)
    assert found, "run A's directory was not found"
    pid = _pid_with_cwd(found)
    code = (
        "import os\n"
        f"for attempt in (lambda: open({found!r} + '/{marker}').read(), lambda: open({found!r} + '/x', 'w'),\n"
        f"                lambda: os.listdir({found!r}), lambda: os.kill({pid}, 0),\n"
        f"                lambda: open('/proc/{pid}/environ').read(), lambda: os.readlink('/proc/{pid}/cwd')):\n"
        "    try:\n"
        "        attempt(); print('reached')\n"
        "    except PermissionError:\n"
        "        print('refused')\n"
    )
    out = _out(pod.run(code))
    a.join()
    assert out == "refused\n" * 6, out
    assert _out(results["a"]) == "a done\n"


def test_a_run_cannot_read_another_runs_shm_file(pod):
    path = f"/dev/shm/sandlot-landlock-run-{os.getpid()}"
    with open(path, "w") as f:
        f.write("secret")
    os.chown(path, NOBODY, NOBODY)  # the service's uid's, as another run of it would have made it
    try:
        out = _out(pod.run(f"print(open({path!r}).read())"))
        assert "PermissionError" in out and "secret" not in out
    finally:
        os.unlink(path)


def _run_parents() -> list[str]:
    parents = []
    for name in os.listdir("/tmp"):
        if name.startswith("sandlot-python3-") and os.stat(os.path.join("/tmp", name)).st_uid == NOBODY:
            parents.append(os.path.join("/tmp", name))
    return parents


def _pid_with_cwd(directory: str) -> int:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/cwd") == directory:
                    return int(entry)
            except OSError:
                pass
    raise AssertionError(f"no process works in {directory}")


def test_a_runs_tmp_is_capped_by_the_watcher(pod):
    """Many small files, none past RLIMIT_FSIZE, together past SANDLOT_TMP_SIZE_MB (64): the watcher ends the
    run, as in the chroot mode (without it, a run sharing the uid could fill the service's disk)."""
    code = (
        "import os\n"
        "chunk = b'x' * (8 << 20)\n"
        "for i in range(12):\n"
        "    with open(f'f{i}', 'wb') as f:\n"
        "        f.write(chunk)\n"
        "import time; time.sleep(3)\n"
        "print('all written')\n"
    )
    envelope = pod.run(code)
    assert envelope["code"] == 0 and "all written" not in envelope["data"]["stdout"], envelope
    assert "/tmp" in envelope["data"]["error"], envelope


@pytest.mark.parametrize("key", HELD_UNNAMED, ids=[f"{lang}: {name}" for lang, name in HELD_UNNAMED])
def test_files_a_run_holds_after_their_names_went_count_against_its_tmp_cap(pod, key):
    """As in the chroot jail (test_container): the watcher, the runs' uid already, reads their descriptor tables."""
    language, _name = key
    began = time.monotonic()
    envelope = pod.run(HELD_UNNAMED[key], language, timeout=20)
    assert envelope["code"] == 0, envelope
    assert "error: /tmp size limit exceeded (64 MiB)" in envelope["data"]["error"], envelope
    assert envelope["data"]["duration"] < 10, "ended by its timeout, not by the cap"
    assert time.monotonic() - began < 10, "ended by its timeout, not by the cap"


def test_names_show_contents_do_not(pod):
    """What Landlock leaves visible, as the docs say: a host file's name and metadata (stat), never its
    contents, nor a directory's listing."""
    code = (
        "import os\n"
        "for path in ('/etc/shadow', '/etc/passwd', '/root'):\n"
        "    print(path, os.path.exists(path), end=' ')\n"
        "    try:\n"
        "        open(path).read() if not os.path.isdir(path) else os.listdir(path)\n"
        "        print('read')\n"
        "    except PermissionError:\n"
        "        print('refused')\n"
    )
    assert _out(pod.run(code)) == "/etc/shadow True refused\n/etc/passwd True refused\n/root True refused\n"


def test_a_node_layer_modules_stack_names_no_data_dir(tmp_path):
    """A package of the Node.js layer (from a local tarball): its stack frames and require.resolve show the
    layer's link, not the data dir (node runs with --preserve-symlinks where the layer is a link)."""
    import io
    import tarfile

    if unprivileged.unavailable():
        pytest.skip(unprivileged.unavailable())
    if KERNEL_ABI < 1 or not shutil.which("node"):
        pytest.skip("needs Landlock and node")
    base = Path(tempfile.mkdtemp(prefix="sandlot-landlock-node-", dir="/var/tmp"))
    data = base / "data"
    data.mkdir()
    os.chown(data, NOBODY, NOBODY)
    files = {
        "package/package.json": b'{"name": "stacked", "version": "1.0.0", "main": "index.js"}',
        "package/index.js": b"module.exports = () => new Error('from the layer').stack;\n",
    }
    with tarfile.open(base / "stacked-1.0.0.tgz", "w:gz") as tar:
        for name, body in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(body), 0o644
            tar.addfile(info, io.BytesIO(body))
    dependency = {"stacked": f"file:{base}/stacked-1.0.0.tgz"}
    (base / "package.json").write_text(
        f'{{"name": "l", "version": "1.0.0", "dependencies": {dependency}}}'.replace("'", '"')
    )
    for path in (base, base / "package.json", base / "stacked-1.0.0.tgz"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    svc = unprivileged.service(SANDLOT_DATA_DIR=str(data), SANDLOT_NODEJS_PACKAGE=str(base / "package.json"))
    svc.user = None
    svc.launcher = RESTRICTED_POD
    try:
        svc.start()
        out = _out(svc.run("console.log(require('stacked')()); console.log(require.resolve('stacked'))", "nodejs"))
        assert "from the layer" in out and "/node_modules/stacked/index.js" in out and str(data) not in out, out
    finally:
        svc.stop()
        shutil.rmtree(base, ignore_errors=True)


OPENSHIFT_UID = 1000680000


def test_the_openshift_restricted_stand_in_serves_in_the_landlock_jail():
    """Issue 30's stand-in as it is: an arbitrary uid, gid 0, no groups, no_new_privs, no capabilities, under a
    seccomp profile refusing namespaces (setpriv below the outer filter, as a container runtime would start it)."""
    if unprivileged.unavailable():
        pytest.skip(unprivileged.unavailable())
    if KERNEL_ABI < 1 or not shutil.which("setpriv"):
        pytest.skip("needs Landlock and setpriv (util-linux)")
    data = tempfile.mkdtemp(prefix="sandlot-openshift-", dir="/var/tmp")
    os.chown(data, OPENSHIFT_UID, 0)
    os.chmod(data, 0o770)
    svc = Service(cwd="/", SANDLOT_DATA_DIR=data, HOME="/nonexistent")
    svc.python, svc.source = unprivileged.venv_python(), unprivileged.source()
    svc.launcher = [
        sys.executable,
        OUTER_FILTER,
        "--profile",
        "docker-default",
        "--",
        "setpriv",
        f"--reuid={OPENSHIFT_UID}",
        "--regid=0",
        "--clear-groups",
        "--no-new-privs",
        "--bounding-set=-all",
        "--",
    ]
    try:
        svc.start()
        detail = svc.detail()["runtimes"]
        for language in ("python3", "nodejs"):
            assert detail[language]["ready"] and detail[language]["protections"]["mode"] == "landlock"
            assert (
                detail[language]["platform"]["euid"] == OPENSHIFT_UID and detail[language]["platform"]["no_new_privs"]
            )
        assert _out(svc.run("import os; print(os.getuid(), os.getgid(), os.getgroups())")) == f"{OPENSHIFT_UID} 0 []\n"
        assert _out(svc.run("console.log(process.getuid())", "nodejs")) == f"{OPENSHIFT_UID}\n"
    finally:
        svc.stop()
        shutil.rmtree(data, ignore_errors=True)


def test_the_service_and_its_zygotes_are_not_dumpable_and_no_run_opens_a_ready_child(pod):
    """Sharing their uid with the runs, the service's and the zygotes' /proc entries (environment, memory,
    descriptors) belong to root: closed to a run even where Landlock's own ptrace rule were missing. A ready
    child is dumpable to the uid (a node child since it exec'ed node; every child since the watcher reads its
    descriptor table for files held after their names went, tmp/held.py): what closes it to a run is its
    Landlock domain (and the run's, which has no /proc at all), asserted here from a run."""
    processes = [pod.process.pid, *descendants(pod.process.pid)]
    zygotes = [
        pid for pid in processes if b"runtimes.jail.zygote.loop" in _cmdline(pid) and _parent(pid) == pod.process.pid
    ]
    children = [pid for pid in processes if _parent(pid) in zygotes]
    assert len(zygotes) >= 2 and len(children) >= 2, [_cmdline(pid) for pid in processes]
    for pid in [pod.process.pid, *zygotes]:
        assert os.stat(f"/proc/{pid}/environ").st_uid == 0, (pid, _cmdline(pid))
    probed = 0
    for pid in children:
        code = f"import ctypes, os\nif os.getpid() == {pid}:\n    raise SystemExit('itself')\n"  # it took that child
        code += f"print(ctypes.CDLL(None, use_errno=True).ptrace(16, {pid}, 0, 0), ctypes.get_errno())\n"
        code += f"open('/proc/{pid}/environ').read()"
        out = _out(pod.run(code))
        if out == "itself\n" or ("FileNotFoundError" in out and not os.path.exists(f"/proc/{pid}")):
            continue  # a ready python child an earlier probe's run took: gone
        probed += 1
        assert out.startswith("-1 1\n") and "PermissionError" in out, out
    assert probed >= 2


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return int(stat_fields(f.read())[1])


THREAD_BOMB = {
    "python3": (
        "import threading\n"
        "threading.stack_size(64 * 1024)\n"  # 3,000 of them fit the default memory limit
        "stop = threading.Event()\n"
        "for i in range(3000):\n"
        "    threading.Thread(target=stop.wait, daemon=True).start()\n"
        "    if i % 50 == 0:\n"
        "        print(i, flush=True)\n"
        "print('all started', flush=True)\n"
        "stop.wait(5)\n"
    ),
    "nodejs": (
        "const { Worker } = require('worker_threads');\n"
        "for (let i = 0; i < 200; i++) {\n"
        "  new Worker('setInterval(() => {}, 1000)', { eval: true, resourceLimits: { maxOldGenerationSizeMb: 4 } });\n"
        "}\n"
        "console.log('all started');\n"
        "setTimeout(() => process.exit(0), 5000);\n"
    ),
}


@pytest.mark.parametrize("language", list(THREAD_BOMB))
def test_a_runs_threads_are_capped(pod, language):
    """RLIMIT_NPROC would count every task of the uid the runs share with the service: the service counts each
    run's threads instead (jail/service/thread_cap.py), and ends one past the limit the other modes give (64)
    with a clear error. Before: one run started 3,000 threads. The service keeps serving."""
    envelope = pod.run(THREAD_BOMB[language], language, timeout=20)
    assert envelope["code"] == 0, envelope
    data = envelope["data"]
    assert "all started" not in data["stdout"], data
    assert "error: thread limit exceeded (64 threads)" in data["error"], data
    assert data["duration"] < 10, "ended by its timeout, not by the limit"
    assert _out(pod.run("print('alive')")) == "alive\n"
    assert _out(pod.run("console.log('alive')", "nodejs")) == "alive\n"


def test_runs_with_threads_below_the_limit_are_not_ended(pod):
    code = (
        "import threading, concurrent.futures\n"
        "with concurrent.futures.ThreadPoolExecutor(32) as pool:\n"
        "    print(sum(pool.map(lambda x: __import__('time').sleep(0.2) or x, range(64))))\n"
    )
    assert _out(pod.run(code)) == f"{sum(range(64))}\n"
