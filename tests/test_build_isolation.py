"""A layer build ends completely and reaches nothing: code that runs at build time (an sdist's setup.py, an npm
package's scripts) starts a daemon that probes the service, the layers and later builds; it must find nothing
and be gone when its build ends. In each mode this machine can give: root with namespaces (`full`, `reduced`),
as uid 65534 (`userns`), and root in the default-container stand-in (`chroot`)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import pytest
import unprivileged
from conftest import needs_root
from service import DOCKER_DEFAULT, OUTER_FILTER, standin

from runtimes.jail.policy.tree_files import LAYER_IN_TREE
from runtimes.linux import landlock

BUILD_UID = 1_499_999_999
# a restricted pod's stand-in (as tests/test_landlock_mode.py starts it): nobody, no capabilities, no_new_privs,
# Docker's default seccomp profile (no namespaces): the service picks the landlock jail
RESTRICTED_POD = [sys.executable, OUTER_FILTER, "--uid", str(unprivileged.NOBODY), "--profile", "docker-default", "--"]
try:
    LANDLOCK_ABI = landlock.abi_version()
except OSError:
    LANDLOCK_ABI = 0

# What setup.py or an install script runs: a daemon (double fork, new session, its output closed) that
# probes what the red team reached, writes what it found into its own layer, then stays.
DAEMON = r"""
import json, os, signal, sys, time
token, layer, work, targets = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
work = os.environ["HOME"] if work == "HOME" else work  # pip's HOME is the layer it builds
extra = sys.argv[5:]  # more places to plant into: the data directory, the packages list
if os.fork():  # the build itself: it goes on (for a while) once the daemon has looked around
    for _ in range(200):
        if os.path.exists(os.path.join(work, "findings.json")):
            break
        time.sleep(0.05)
    os._exit(0)
os.setsid()
if os.fork():
    os._exit(0)
found = []
for pid in targets:
    for name in ("environ", "mem", "fd/0"):
        try:
            os.close(os.open(f"/proc/{pid}/{name}", os.O_RDONLY))
            found.append(f"opened /proc/{pid}/{name}")
        except OSError:
            pass
    try:
        os.kill(pid, 0)
        found.append(f"may signal {pid}")
    except (ProcessLookupError, PermissionError):
        pass
for place in (layer, os.path.join(layer, "requests"), *extra):
    try:
        with open(os.path.join(place, "planted-" + token), "w") as f:
            f.write("x")
        found.append(f"wrote into {place}")
    except OSError:
        pass
    try:
        for name in os.listdir(place):
            if name.endswith(".json"):
                with open(os.path.join(place, name), "a"):
                    found.append(f"opened {name} in {place} for writing")
    except OSError:
        pass
with open(os.path.join(work, "findings.json.new"), "w") as f:
    json.dump(found, f)
os.rename(os.path.join(work, "findings.json.new"), os.path.join(work, "findings.json"))
for fd in range(0, 3):
    os.close(fd)
while True:  # a leftover that would plant into whatever comes next
    try:
        later = [os.path.join(os.path.dirname(layer), n) for n in os.listdir(os.path.dirname(layer))]
    except OSError:
        later = []
    for place in (layer, work, *later):
        try:
            open(os.path.join(place, "later-" + token), "w").close()
        except OSError:
            pass
    time.sleep(0.05)
"""


def alive_with(token: str) -> list[int]:
    """Processes whose command line carries token (the daemon's own)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if token.encode() in f.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


@pytest.fixture
def place():
    path = Path(tempfile.mkdtemp(prefix="sandlot-buildiso-", dir="/var/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def layout(place: Path, owner: int) -> tuple[Path, Path]:
    """A layer in use (with a package directory in it) and the new build's own directory."""
    layer = place / "layers" / "in-use"
    (layer / "requests").mkdir(parents=True)
    (layer / "requests" / "__init__.py").write_text("")
    work = place / "layers" / "new.build"
    work.mkdir()
    for path in (place, place / "layers", layer, layer / "requests", work):
        os.chown(path, owner, owner)
        path.chmod(0o755)
    return layer, work


RUN_BUILD = """
import json, os, sys
from layers import isolation
token, layer, work, python, daemon, targets = sys.argv[1:7]
targets = json.loads(targets) + [os.getpid()]
argv = [python, "-c", daemon, token, layer, work, json.dumps(targets)]
result = isolation.run(argv, work, [os.path.dirname(os.path.dirname(python)), sys.base_prefix], {}, int(sys.argv[7]))
print(json.dumps({"code": result.returncode, "output": result.stdout.decode(errors="replace")}))
"""


def build_with_daemon(mode: str, place: Path, targets: list[int]) -> tuple[dict, Path, Path, str]:
    """isolation.run of the daemon's build command as the service would in mode; (result, layer, work, token)."""
    token = "sandlot-daemon-" + os.urandom(4).hex()
    python = sys.executable
    launcher: list[str] = []
    identity: dict = {}
    owner = 0
    if mode in ("userns", "chroot"):
        if unprivileged.unavailable():
            pytest.skip(unprivileged.unavailable())
        python = unprivileged.venv_python()
    if mode == "userns":
        owner = unprivileged.NOBODY
        identity = {"user": owner, "group": owner, "extra_groups": []}
    if mode == "chroot":
        launcher = standin(DOCKER_DEFAULT)
    layer, work = layout(place, owner)
    result = subprocess.run(
        [*launcher, python, "-c", RUN_BUILD, token, str(layer), str(work), python, DAEMON, json.dumps(targets)]
        + [str(BUILD_UID)],
        env={**os.environ, "PYTHONPATH": unprivileged.source()},
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
        **identity,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1]), layer, work, token


@needs_root
@pytest.mark.parametrize("mode", ["full", "userns", "chroot"])
def test_a_daemon_a_build_starts_finds_nothing_and_is_gone_when_it_ends(mode, place):
    # a ready child of the service's uid stands in for the zygotes and ready children: same uid, in reach
    owner = unprivileged.NOBODY if mode == "userns" else 0
    neighbour = subprocess.Popen(
        ["sleep", "300"], user=owner if owner else None, group=owner if owner else None, extra_groups=[]
    )
    try:
        result, layer, work, token = build_with_daemon(mode, place, [neighbour.pid, os.getpid()])
        assert result["code"] == 0, result["output"]
        time.sleep(0.5)
        assert alive_with(token) == [], f"the build's daemon outlived its build ({mode})"
        findings = json.loads((work / "findings.json").read_text())
        assert findings == [], findings
        assert sorted(p.name for p in layer.rglob("*") if token in p.name) == []
        before = {p.name for p in work.iterdir()}
        time.sleep(0.3)
        assert {p.name for p in work.iterdir()} == before, "something still writes into the new layer"
    finally:
        neighbour.kill()
        neighbour.wait()
        for pid in alive_with("sandlot-daemon-"):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass


# ---- the same through the real build tools: pip building an sdist, npm installing a package ----------------

LAYER_BUILD = """
import json, sys
from pathlib import Path
from runtimes.nodejs import layer as nodejs_layer
from runtimes.python import layer as python_layer
from layers.store import LayerBuildError
tool, work, source, uid = sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
try:
    if tool == "pip":
        python_layer.build(Path(source) / "requirements.txt", work, uid, find_links=source)
    else:
        nodejs_layer.build([Path(source) / "package.json"], work, "/usr/bin/node", uid)
    print(json.dumps({"error": ""}))
except LayerBuildError as exc:
    print(json.dumps({"error": str(exc)}))
"""


@pytest.fixture(scope="module")
def build_wheels():
    """setuptools for pip's isolated build of the sdist, fetched once from the index (no upload anywhere)."""
    house = Path(tempfile.mkdtemp(prefix="sandlot-buildiso-wheels-", dir="/var/tmp"))
    house.chmod(0o755)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(house), "setuptools", "wheel"],
        check=True,
        timeout=300,
    )
    for path in house.iterdir():
        path.chmod(0o644)
    yield house
    shutil.rmtree(house, ignore_errors=True)


# What setup.py also tries where the build shares the service's uid (landlock): list and open what is the
# service's, connect where a tenant must not; it writes what it reached into its own layer (probes.json).
PROBE = r"""
import json, os, socket, sys
asked = json.loads(sys.argv[1])
reached = []
for place in asked["list"]:
    try:
        os.listdir(place)
        reached.append(f"listed {place}")
    except OSError:
        pass
for path in asked["open"]:
    try:
        with open(path, "rb") as f:
            f.read(1)
        reached.append(f"opened {path}")
    except OSError:
        pass
for host, port in asked["connect"]:
    try:
        socket.create_connection((host, port), timeout=2).close()
        reached.append(f"connected to {host}:{port}")
    except PermissionError:
        pass  # refused by the build's domain, before any packet
    except OSError as exc:
        reached.append(f"tried {host}:{port} ({type(exc).__name__}): not refused by the build's domain")
with open(os.path.join(os.environ["HOME"], "probes.json"), "w") as f:
    json.dump(reached, f)
"""


def hostile_sdist(source: Path, daemon_args: list[str], probes: dict | None = None) -> None:
    """sandlot-hostile 1.0, an sdist whose setup.py starts the daemon (and, with probes, runs PROBE first),
    written here, and a requirements file."""
    name = "sandlot_hostile-1.0"
    tree = source / "sdist" / name
    tree.mkdir(parents=True)
    (tree / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: sandlot-hostile\nVersion: 1.0\n")
    (tree / "sandlot_hostile.py").write_text("VALUE = 1\n")
    probe = f"subprocess.run([sys.executable, '-c', {PROBE!r}, {json.dumps(probes)!r}])\n" if probes else ""
    (tree / "setup.py").write_text(
        f"import subprocess, sys\n{probe}subprocess.run([sys.executable, '-c', {DAEMON!r}, *{daemon_args!r}])\n"
        "from setuptools import setup\nsetup(name='sandlot-hostile', version='1.0', py_modules=['sandlot_hostile'])\n"
    )
    with tarfile.open(source / f"{name}.tar.gz", "w:gz") as tar:
        tar.add(tree, arcname=name)
    shutil.rmtree(source / "sdist")
    (source / "requirements.txt").write_text("sandlot-hostile==1.0\n")


def hostile_npm_package(source: Path, daemon_call: str) -> None:
    """A local package whose install scripts start the daemon, and a package.json that depends on it."""
    package = source / "hostile"
    package.mkdir()
    scripts = {name: daemon_call for name in ("preinstall", "install", "postinstall")}
    (package / "package.json").write_text(
        json.dumps({"name": "sandlot-hostile", "version": "1.0.0", "main": "index.js", "scripts": scripts})
    )
    (package / "index.js").write_text("module.exports = 1;\n")
    (source / "package.json").write_text(
        json.dumps({"name": "layer", "version": "1.0.0", "dependencies": {"sandlot-hostile": f"file:{package}"}})
    )


@needs_root
@pytest.mark.parametrize("mode", ["full", "userns", "chroot", "landlock"])
@pytest.mark.parametrize("tool", ["pip", "npm"])
def test_build_code_finds_nothing_and_is_gone_when_its_build_ends(tool, mode, place, build_wheels):
    if unprivileged.unavailable():
        pytest.skip(unprivileged.unavailable())
    if mode == "landlock" and LANDLOCK_ABI < 6:
        pytest.skip("needs Landlock ABI 6 (scopes: the build shares the neighbour's uid)")
    owner = unprivileged.NOBODY if mode in ("userns", "landlock") else 0
    token = "sandlot-daemon-" + os.urandom(4).hex()
    layer, work = layout(place, owner)
    source = place / "source"
    source.mkdir()
    python = unprivileged.venv_python()  # the daemon's interpreter: one every uid can run
    neighbour = subprocess.Popen(
        ["sleep", "300"], user=owner if owner else None, group=owner if owner else None, extra_groups=[]
    )
    targets = json.dumps([neighbour.pid, os.getpid()])
    daemon = place / "daemon.py"
    daemon.write_text(DAEMON)
    call = f"{python} {daemon} {token} {layer} {work} '{targets}'"
    if tool == "pip":
        hostile_sdist(source, [token, str(layer), str(work), targets])
        for wheel in build_wheels.iterdir():
            shutil.copy(wheel, source)
    else:
        hostile_npm_package(source, call)
    for path in [place, source, daemon, *source.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    launcher = standin(DOCKER_DEFAULT) if mode == "chroot" else RESTRICTED_POD if mode == "landlock" else []
    identity = {"user": owner, "group": owner, "extra_groups": []} if owner and mode != "landlock" else {}
    try:
        result = subprocess.run(
            [*launcher, python, "-c", LAYER_BUILD, tool, str(work), str(source), str(BUILD_UID)],
            # a home that is not there, under the test's own place: what `npm config list` writes there (its logs,
            # as the service's uid) goes with it
            env={**os.environ, "PYTHONPATH": unprivileged.source(), "HOME": str(place / "no-home")},
            capture_output=True,
            text=True,
            timeout=600,
            cwd="/",
            **identity,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        outcome = json.loads(result.stdout.splitlines()[-1])
        assert outcome["error"] == "", result.stderr[-3000:]
        time.sleep(0.5)
        assert alive_with(token) == [], f"the {tool} build's daemon outlived its build ({mode})"
        findings = work / "findings.json"
        if tool == "pip":  # setup.py ran (an sdist is built): what it found
            assert findings.exists(), result.stderr[-3000:]
        else:  # npm runs no package's scripts at all (--ignore-scripts: preinstall, install, postinstall, gyp)
            assert not findings.exists(), "npm ran the package's install scripts"
            assert (work / "node_modules" / "sandlot-hostile" / "index.js").exists(), result.stderr[-3000:]
        if findings.exists():
            assert json.loads(findings.read_text()) == []
        assert [p.name for p in layer.rglob("*") if token in p.name] == []
    finally:
        neighbour.kill()
        neighbour.wait()
        for pid in alive_with(token):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass


CONNECT = r"""
import socket, sys
for port in sys.argv[1:]:
    try:
        socket.create_connection(("127.0.0.1", int(port)), timeout=3).close()
        print(port, "reached")
    except OSError as exc:
        print(port, "refused", type(exc).__name__)
"""

RUN_CONNECT = """
import json, os, sys
from layers import isolation
work, python, code, mirror = sys.argv[1:5]
result = isolation.run(
    [python, "-c", code, *sys.argv[5:]], work, [os.path.dirname(os.path.dirname(python)), sys.base_prefix], {},
    int(os.environ["BUILD_UID"]), reaches=(mirror,),
)
print(json.dumps(result.stdout.decode(errors="replace")))
"""


def canary(port: int) -> socket.socket:
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(8)
    listener.settimeout(0.5)
    return listener


@needs_root
@pytest.mark.parametrize("mode", ["full", "userns"])
def test_a_build_reaches_its_mirror_and_no_other_loopback_service(mode, place):
    """The build's egress is the runs': a loopback canary (the service's own port, say) is never reached; the
    metadata address and private ranges fall under the same rules. The configured mirror (here on loopback) is
    reached. As root by nft rules on the build uid; as uid 65534 in a network namespace of the build's own, out
    through pasta."""
    if mode == "userns" and unprivileged.unavailable():
        pytest.skip(unprivileged.unavailable())
    owner = unprivileged.NOBODY if mode == "userns" else 0
    python = unprivileged.venv_python() if mode == "userns" else sys.executable
    identity = {"user": owner, "group": owner, "extra_groups": []} if owner else {}
    _layer, work = layout(place, owner)
    forbidden, mirror = canary(18611), canary(18612)
    try:
        result = subprocess.run(
            [python, "-c", RUN_CONNECT, str(work), python, CONNECT, "http://127.0.0.1:18612/simple", "18611", "18612"],
            env={**os.environ, "PYTHONPATH": unprivileged.source(), "BUILD_UID": str(BUILD_UID)},
            capture_output=True,
            text=True,
            timeout=120,
            cwd="/",
            **identity,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        said = json.loads(result.stdout.splitlines()[-1]).splitlines()
        assert [line.split()[:2] for line in said if line[:1].isdigit()] == [
            ["18611", "refused"],
            ["18612", "reached"],
        ], said
        with pytest.raises(TimeoutError):
            forbidden.accept()
    finally:
        forbidden.close()
        mirror.close()


# ---- the whole case through a service: an operator adds an sdist whose setup.py starts the daemon ----------

ADMIN_KEY = "admin-" + os.urandom(8).hex()


def _service(mode: str, data: str, source: Path, base: Path):
    from service import Service

    env = {
        "SANDLOT_PYTHON_REQUIREMENTS": str(base / "requirements.txt"),
        "SANDLOT_NODEJS_PACKAGE": str(base / "package.json"),
        "SANDLOT_PIP_FIND_LINKS": str(source),
        "SANDLOT_DATA_DIR": data,
        "SANDLOT_ADMIN_KEY": ADMIN_KEY,
        "MAX_WORKERS": "1",
    }
    if mode == "userns":
        return unprivileged.service(**env)
    if mode == "landlock":  # a restricted pod's stand-in (tests/test_landlock_mode.py): nobody, no namespaces
        svc = unprivileged.service(**env)
        svc.user = None  # outer_filter changes to it, after its filter is loaded as root
        svc.launcher = RESTRICTED_POD
        return svc
    if mode == "chroot":
        return Service(launcher=standin(DOCKER_DEFAULT), **env)
    if mode == "reduced":
        env["SANDLOT_JAIL"] = "reduced"
    return Service(**env)


def _build(svc, method: str, **kwargs) -> dict:
    import httpx

    with httpx.Client(base_url=svc.url, headers={"X-Api-Key": ADMIN_KEY}, timeout=60) as client:
        build_id = client.request(method, "/v1/sandlot/packages", **kwargs).json()["data"]["build"]["id"]
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            build = client.get(f"/v1/sandlot/builds/{build_id}", params={"tail": 1000}).json()["data"]
            if build["state"] in ("succeeded", "failed"):
                return build
            time.sleep(0.2)
    raise AssertionError(f"build {build_id} did not end:\n{svc.output()[-3000:]}")


def _mirrors(path: str) -> bool:
    """Whether path is in a materialized tree's copy of a layer (a tree shows its layer at LAYER_IN_TREE): the
    build's own, while that tree lives or is being removed (the layer itself may be collected by then); a file
    planted in another layer is found at that layer's own path."""
    inside = LAYER_IN_TREE.strip("/") + "/"
    return f"{os.sep}trees{os.sep}" in path and f"/{inside}" in path


def _probes(svc, data: Path, other_data: Path) -> dict:
    """What the landlock mode's build must not list, open or reach: the data dir and its parts, another
    instance's data dir, the package list, a Node snapshot, the service's venv configuration; the metadata
    address, a private address and the service's own port."""
    snapshots = data / "snapshots"
    blobs = [str(p) for p in snapshots.rglob("*") if p.is_file()] if snapshots.is_dir() else []
    venv_config = Path(svc.python).parent.parent / "pyvenv.cfg"
    return {
        "list": [str(data), str(data / "packages"), str(snapshots), str(data / "layers"), str(other_data)],
        "open": [str(data / "packages" / "python3.json"), *blobs[:2], str(venv_config), str(other_data / "key")],
        "connect": [["169.254.169.254", 80], ["10.0.0.1", 80], ["127.0.0.1", svc.port]],
    }


@needs_root
@pytest.mark.parametrize("mode", ["full", "reduced", "userns", "chroot", "landlock"])
def test_an_added_sdist_whose_setup_py_starts_a_daemon_finds_nothing_and_leaves_nothing(mode, place, build_wheels):
    from service import descendants

    if unprivileged.unavailable():
        pytest.skip(unprivileged.unavailable())
    if mode == "landlock" and LANDLOCK_ABI < 4:
        pytest.skip("needs Landlock ABI 4 (TCP port rules)")
    owner = unprivileged.NOBODY if mode in ("userns", "landlock") else 0
    token = "sandlot-daemon-" + os.urandom(4).hex()
    base, source, data = place / "base", place / "source", place / "data"
    other_data = place / "other-data"  # another instance's, of the same uid
    for path in (base, source, data):
        path.mkdir()
        os.chown(path, owner, owner)
    (base / "requirements.txt").write_text("setuptools\n")
    (base / "package.json").write_text('{"name": "layer", "version": "1.0.0", "private": true}\n')
    for wheel in build_wheels.iterdir():
        shutil.copy(wheel, source)
    for path in [place, base, source, *base.iterdir(), *source.iterdir()]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    svc = _service(mode, str(data), source, base).start()
    try:
        detail = svc.detail()["runtimes"]
        python_layer = detail["python3"]["layer"]
        assert mode != "landlock" or detail["python3"]["protections"]["mode"] == "landlock"
        # the service, its zygotes and ready children (Node's among them, dumpable after its exec)
        targets = [svc.process.pid, *descendants(svc.process.pid)]
        extra = [str(data), str(data / "packages")]
        if "nodejs" in detail:
            extra.append(detail["nodejs"]["layer"])
        probes = None
        if mode == "landlock":
            other_data.mkdir()
            (other_data / "key").write_text("secret\n")
            os.chown(other_data, owner, owner)
            os.chown(other_data / "key", owner, owner)
            probes = _probes(svc, data, other_data)
        hostile_sdist(source, [token, python_layer, "HOME", json.dumps(targets), *extra], probes)
        for path in source.iterdir():
            path.chmod(0o644)
        build = _build(svc, "POST", json={"language": "python3", "specs": ["sandlot-hostile==1.0"]})
        assert build["state"] == "succeeded", build["error"] + svc.output()[-4000:]
        time.sleep(0.5)
        assert alive_with(token) == [], f"the setup.py daemon outlived its build ({mode})"
        new_layer = Path(build["layer"])
        findings = json.loads((new_layer / "findings.json").read_text())
        assert findings == [], findings
        if probes:
            assert json.loads((new_layer / "probes.json").read_text()) == []
            assert (new_layer / "sandlot_hostile.py").is_file()  # the legitimate build installed
        # sealed before any run sees it: nothing in it writable by the build's uid or by others
        for path in [new_layer, *new_layer.rglob("*")]:
            info = path.lstat()
            if not path.is_symlink():
                assert info.st_uid in (0, owner) and not info.st_mode & 0o022, path
        # a later build (the package removed): nothing planted in it either
        later = _build(svc, "DELETE", params=[("language", "python3"), ("name", "sandlot-hostile")])
        assert later["state"] == "succeeded", later["error"]
        # what it wrote into its own layer while its build ran is its own (and served sealed): nothing elsewhere.
        # The chroot mode's trees (and their cells) hold that layer at LAYER_IN_TREE, not under its own name:
        # a file there that the layer itself holds is the layer's, mirrored; anything else is planted
        planted = [
            os.path.join(top, name)
            for top, dirs, files in os.walk(data)  # (trees being replaced meanwhile: errors ignored)
            for name in dirs + files
            if token in name and new_layer.name not in top and not _mirrors(os.path.join(top, name))
        ]
        assert planted == []
        assert svc.run("print('served')")["data"]["stdout"] == "served\n"
    finally:
        svc.stop()
        for pid in alive_with(token):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass


def test_a_builds_filter_admits_plain_tcp_and_udp_only():
    """The build's seccomp filter (layers/jailer.py): no MPTCP, SCTP or UDP-Lite socket, which the build's
    egress rules (Landlock's TCP ports, nft) would not see; TCP, UDP and unix sockets as before."""
    from layers import jailer
    from runtimes.linux.protections import in_child
    from runtimes.linux.syscalls import set_no_new_privs

    def attempts() -> str:
        set_no_new_privs()
        jailer._untraceable().load()
        seen = []
        for family, kind, protocol in (
            (2, 1, 0),
            (2, 1, 6),
            (10, 2, 17),
            (1, 1, 0),
            (2, 1, 262),
            (2, 1, 132),
            (2, 2, 136),
        ):
            try:
                socket.socket(family, kind, protocol).close()
                seen.append("opened")
            except OSError as exc:
                seen.append(str(exc.errno))
        return " ".join(seen)

    value, error = in_child(attempts)
    assert error == "" and value == "opened opened opened opened 1 1 1", (value, error)
