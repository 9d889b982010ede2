"""Dependency layers: real versions, updates without restart, failed builds, imports for free."""

import ast
import base64
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import zipfile
from pathlib import Path

import httpx
import pytest
import unprivileged
from conftest import needs_root
from service import DOCKER_DEFAULT, IS_ROOT, Service, descendants, parent_of, standin

from layers import isolation
from runtimes.config import default_data_dir

BUILD_UID = 1_499_999_999  # a layer build's uid (SANDLOT_UID_BASE - 1 by default)


def make_wheel(
    wheelhouse: Path, name: str, version: str, modules: dict[str, str], requires: tuple[str, ...] = ()
) -> Path:
    """A pure-Python wheel with its requirements, written by hand: no index, no build backend."""
    dist = f"{name.replace('-', '_')}-{version}"
    path = wheelhouse / f"{dist}-py3-none-any.whl"
    files = dict(modules)
    files[f"{dist}.dist-info/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    files[f"{dist}.dist-info/WHEEL"] = (
        "Wheel-Version: 1.0\nGenerator: sandlot-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = []
    for file, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{file},sha256={digest},{len(text.encode())}")
    record.append(f"{dist}.dist-info/RECORD,,")
    files[f"{dist}.dist-info/RECORD"] = "\n".join(record) + "\n"
    with zipfile.ZipFile(path, "w") as wheel:
        for file, text in files.items():
            wheel.writestr(file, text)
    return path


def readable(path: Path) -> None:
    """Builds run as an unprivileged uid: what they read must be world-readable."""
    for p in [path, *path.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)


def reachable_place(prefix: str):
    """Where a build without a tree (a container on default privileges: nothing can be mounted for it) reaches
    what it reads by the real path, as its unprivileged uid: not under pytest's mode-700 /tmp/pytest-of-root."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def tmp_path():
    """This module's tmp_path: one a build's uid can reach (reachable_place)."""
    yield from reachable_place("sandlot-layers-")


@pytest.fixture(scope="module")
def wheelhouse():
    places = reachable_place("sandlot-wheelhouse-")
    house = next(places) / "wheelhouse"
    house.mkdir()
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(house), "requests", "httpx", "jinja2"],
        check=True,
    )
    make_wheel(
        house,
        "sandlot-probe",
        "1.2.3",
        {"sandlot_probe.py": "VALUE = 'probe-ok'\n", "sandlot_broken.py": "raise ImportError('broken on purpose')\n"},
    )
    readable(house)
    yield house
    next(places, None)  # removed


@pytest.fixture
def requirements(tmp_path):
    path = tmp_path / "requirements.txt"
    path.write_text("requests\nhttpx\njinja2\n")
    readable(tmp_path)
    return path


@pytest.fixture
def data_dir():
    """Layers may not live under /tmp (runs get their own /tmp): a scratch data dir elsewhere."""
    path = tempfile.mkdtemp(prefix="sandlot-test-", dir="/var/tmp")
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def layer_service(requirements, wheelhouse, data_dir, **env) -> Service:
    """A service whose Python layer comes from requirements, built offline from the wheelhouse."""
    return Service(
        SANDLOT_PYTHON_REQUIREMENTS=str(requirements),
        SANDLOT_PIP_FIND_LINKS=str(wheelhouse),
        SANDLOT_DATA_DIR=data_dir,
        **{"MAX_WORKERS": "1", **env},
    ).start()


@pytest.fixture
def layered(requirements, wheelhouse, data_dir):
    svc = layer_service(requirements, wheelhouse, data_dir, MAX_WORKERS="2")
    yield svc
    svc.stop()


def test_update_adds_a_package_without_restart(layered, requirements):
    before = layered.detail()["runtimes"]["python3"]["layer"]
    requirements.write_text("requests\nhttpx\njinja2\nsandlot-probe==1.2.3\n")
    answers, stop = [], threading.Event()

    def keep_running():
        while not stop.is_set():
            answers.append(layered.run("print('still')")["data"]["stdout"])

    runner = threading.Thread(target=keep_running)
    runner.start()
    try:
        with layered.client() as client:
            response = client.post("/v1/sandbox/dependencies/update", json={"language": "python3"}, timeout=300)
    finally:
        stop.set()
        runner.join()
    assert response.json() == {"code": 0, "message": "success", "data": {}}
    assert answers and all(a == "still\n" for a in answers)  # the service kept answering
    data = layered.run("import sandlot_probe\nprint(sandlot_probe.VALUE)")["data"]
    assert data["stdout"] == "probe-ok\n", data
    listed = {d["name"]: d["version"] for d in layered.detail_dependencies()}
    assert listed["sandlot-probe"] == "1.2.3"
    python = layered.detail()["runtimes"]["python3"]
    assert python["layer"] != before
    assert "sandlot_probe" in python["preloaded"]
    assert "sandlot_broken" in python["preload_failed"]  # logged and left out; start-up went on
    deadline = time.monotonic() + 10
    while os.path.exists(before) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(before)  # the old layer, once unused, is removed


def test_failed_build_leaves_the_old_layer_serving(layered, requirements):
    layer = layered.detail()["runtimes"]["python3"]["layer"]
    requirements.write_text("requests\nno-such-package-sandlot==9.9\n")
    with layered.client() as client:
        updated = client.post("/v1/sandbox/dependencies/update", json={"language": "python3"}, timeout=300).json()
        refreshed = client.get("/v1/sandbox/dependencies/refresh", params={"language": "python3"}, timeout=300)
    for envelope in (updated, refreshed.json()):
        assert envelope["code"] == -500 and envelope["data"] is None
        assert "pip failed" in envelope["message"] and "no-such-package-sandlot" in envelope["message"]
    assert layered.detail()["runtimes"]["python3"]["layer"] == layer
    assert layered.run("import requests\nprint('old layer')")["data"]["stdout"] == "old layer\n"


def test_concurrent_updates_are_serialized(layered):
    with layered.client() as client:

        def update():
            return client.post("/v1/sandbox/dependencies/update", json={"language": "python3"}, timeout=300).json()

        results = []
        threads = [threading.Thread(target=lambda: results.append(update())) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert [r["code"] for r in results] == [0, 0]
    assert layered.run("import httpx\nprint('ok')")["data"]["stdout"] == "ok\n"


def test_numpy_and_pandas_compute_inside_the_jail(requirements):
    # measured: both run on the default allow-list; no system call had to be added for them
    requirements.write_text("numpy\npandas\n")
    svc = Service(
        SANDLOT_PYTHON_REQUIREMENTS=str(requirements), SANDLOT_DATA_DIR=default_data_dir(), MAX_WORKERS="1"
    ).start()
    try:
        data = svc.run("import numpy; print(numpy.arange(10).sum())")["data"]
        assert data["stdout"] == "45\n", data
        code = "import numpy\nprint(round(float(numpy.linalg.det(numpy.eye(3) * 2)), 6))"
        assert svc.run(code)["data"]["stdout"] == "8.0\n"
        code = (
            "import pandas as pd\ndf = pd.DataFrame({'a': [1, 2, 3], 'b': ['x', 'y', 'x']})\n"
            "print(df.groupby('b')['a'].sum().to_dict())\nprint(pd.Timestamp('2024-01-01', tz='Asia/Shanghai'))"
        )
        data = svc.run(code)["data"]
        assert data["stdout"] == "{'x': 4, 'y': 2}\n2024-01-01 00:00:00+08:00\n", data
        python = svc.detail()["runtimes"]["python3"]
        assert {"numpy", "pandas"} <= set(python["preloaded"])
        env = svc.run("import os\nprint(sorted(os.environ))")["data"]["stdout"]
        assert env == "['HOME', 'LANG', 'TMPDIR']\n"
        zygote = next(p for p in descendants(svc.process.pid) if _threads(p) and _is_zygote(p, svc.process.pid))
        assert _threads(zygote) == 1  # still safe to fork after numpy's import
    finally:
        svc.stop()


def _threads(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            return int(next(line for line in f if line.startswith("Threads:")).split()[1])
    except (OSError, StopIteration):
        return 0


def _is_zygote(pid: int, service: int) -> bool:
    """The Python zygote: the service's own child (its children are forks with the same command line)."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return b"runtimes.python.runner" in f.read() and parent_of(pid) == service


def test_periodic_refresh(requirements, wheelhouse, data_dir):
    svc = layer_service(requirements, wheelhouse, data_dir, PYTHON_DEPS_UPDATE_INTERVAL="2s")
    try:
        first = svc.detail()["runtimes"]["python3"]["layer"]
        deadline = time.monotonic() + 90
        while svc.detail()["runtimes"]["python3"]["layer"] == first and time.monotonic() < deadline:
            time.sleep(0.5)
        assert svc.detail()["runtimes"]["python3"]["layer"] != first
        assert svc.run("import jinja2\nprint('ok')")["data"]["stdout"] == "ok\n"
    finally:
        svc.stop()


def test_node_layer_from_a_local_package(tmp_path, data_dir):
    package = local_node_package(tmp_path)
    svc = Service(SANDLOT_NODEJS_PACKAGE=str(package), SANDLOT_DATA_DIR=data_dir, MAX_WORKERS="1")
    svc.start()
    try:
        data = svc.run("console.log(require('sandlot-hello')('jail'))", language="nodejs")["data"]
        assert data["stdout"] == "hello jail\n", data
        with svc.client() as client:
            listed = client.get("/v1/sandbox/dependencies", params={"language": "nodejs"}).json()["data"]
        assert listed["dependencies"] == [{"name": "sandlot-hello", "version": "2.0.1"}]
    finally:
        svc.stop()


def local_node_package(tmp_path: Path) -> Path:
    """A layer package.json whose one dependency is a tarball packed here (no registry needed)."""
    source = tmp_path / "sandlot-hello"
    source.mkdir()
    (source / "package.json").write_text(json.dumps({"name": "sandlot-hello", "version": "2.0.1", "main": "index.js"}))
    (source / "index.js").write_text("module.exports = (name) => `hello ${name}`;\n")
    subprocess.run(
        ["npm", "pack", "--silent", "--pack-destination", str(tmp_path)], cwd=source, check=True, capture_output=True
    )
    package = tmp_path / "layer" / "package.json"
    package.parent.mkdir()
    package.write_text(
        json.dumps(
            {
                "name": "layer",
                "version": "1.0.0",
                "private": True,
                "dependencies": {"sandlot-hello": f"file:{tmp_path}/sandlot-hello-2.0.1.tgz"},
            }
        )
    )
    readable(tmp_path)
    return package


def test_configured_paths_are_the_configuration_not_npms_comments(tmp_path):
    """`npm config list` ends with comments about the caller (`; cwd = /`, `; HOME = /root`): none is a path
    the build must read, and "/" read-only over the build's tree would leave it no tree (the Docker image's
    `WORKDIR /` made every first start fail so)."""
    listing = tmp_path / "listing"
    listing.write_text(
        '; "user" config from /root/.npmrc\n\ncafile = "/etc/ssl/certs/ca-certificates.crt"\nprefix = "/"\n'
        "; node bin location = /usr/bin/node\n; npm local prefix = /\n; cwd = /\n; HOME = /root\n"
        "# a comment = /etc\n"
    )
    lines = isolation.listing(["cat", str(listing)])
    assert isolation.configured_paths(lines) == ["/etc/ssl/certs/ca-certificates.crt"]


def test_a_builds_plan_is_parsed_once_and_what_it_cannot_follow_is_refused():
    """The jailer's one argument (layers/jailer.py): what the service writes comes back the same; anything else is
    refused before any step is taken."""
    from layers.jailer import Plan, PlanError

    plain = Plan(argv=("/bin/true",), env={}, workdir="/w", uid=1, gid=1, writable=("/t",), reap=True)
    # the landlock mode's: reads only these, lists only those, connects only to these ports
    narrow = Plan(
        argv=("/bin/true",),
        env={},
        workdir="/w",
        uid=1,
        gid=1,
        writable=("/t",),
        reap=True,
        readable=("/usr",),
        listable=("/s",),
        connect_ports=(443,),
    )
    tree = Plan(
        argv=("/bin/true", "-x"),
        env={"A": "b"},
        workdir="/w",
        uid=2,
        gid=2,
        root="/r",
        spec={"binds": ["/usr"]},
        user_namespace=True,
        netns_ruleset="table inet t {}",
        netns_socket=5,
    )
    for plan in (plain, narrow, tree):
        assert Plan.parse(plan.to_json()) == plan
    good = json.loads(plain.to_json())
    for bad in (
        "[]",
        "not json",
        json.dumps({**good, "argv": "/bin/true"}),
        json.dumps({**good, "argv": []}),
        json.dumps({**good, "uid": "1"}),
        json.dumps({**good, "workdir": "w"}),
        json.dumps({**good, "env": {"A": 1}}),
        json.dumps({**good, "surprise": 1}),
        json.dumps({key: value for key, value in good.items() if key != "workdir"}),
        json.dumps({**good, "spec": {}}),  # a tree's spec without a tree
        json.dumps({**json.loads(tree.to_json()), "user_namespace": False}),  # a network namespace without one
        json.dumps({**json.loads(tree.to_json()), "reap": True}),
        json.dumps({**good, "connect_ports": [0]}),
        json.dumps({**good, "connect_ports": "443"}),
        json.dumps({**good, "readable": "/usr"}),
        json.dumps({**json.loads(tree.to_json()), "readable": ["/usr"]}),  # a tree is what it reads
        json.dumps({**json.loads(tree.to_json()), "connect_ports": [443]}),  # a tree's egress is its network's
    ):
        with pytest.raises(PlanError):
            Plan.parse(bad)


def test_layers_build_and_serve_with_the_root_directory_as_working_directory(tmp_path, wheelhouse, data_dir):
    """The image's `WORKDIR /`: both layers build (the Node.js one after the Python one) and serve."""
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("sandlot-probe==1.2.3\n")
    package = local_node_package(tmp_path)
    svc = Service(
        cwd="/",
        SANDLOT_PYTHON_REQUIREMENTS=str(requirements),
        SANDLOT_PIP_FIND_LINKS=str(wheelhouse),
        SANDLOT_NODEJS_PACKAGE=str(package),
        SANDLOT_DATA_DIR=data_dir,
        MAX_WORKERS="1",
    ).start()
    try:
        assert svc.run("import sandlot_probe\nprint(sandlot_probe.VALUE)")["data"]["stdout"] == "probe-ok\n"
        data = svc.run("console.log(require('sandlot-hello')('root'))", language="nodejs")["data"]
        assert data["stdout"] == "hello root\n", data
    finally:
        svc.stop()


@needs_root
def test_builds_run_unprivileged_in_a_tree_of_their_own(tmp_path_factory):
    work = tmp_path_factory.mktemp("build") / "work"  # under /tmp: the tree shows no /var
    work.mkdir()
    code = (
        "import os\nprint(os.getuid(), os.getgid(), os.getgroups())\nprint(sorted(os.listdir('/')))\n"
        "open('inside', 'w').write('x')\n"
        "try:\n    open('/usr/evil', 'w')\nexcept OSError as e:\n    print('denied', e.errno)\n"
    )
    result = isolation.run([sys.executable, "-c", code], str(work), [sys.prefix, sys.base_prefix], {}, 1_499_999_999)
    lines = result.stdout.decode().splitlines()
    assert result.returncode == 0, result.stdout
    assert lines[0] == "1499999999 1499999999 []"
    shown = set(ast.literal_eval(lines[1]))
    # only what the build needs: no /proc, and no /var unless this checkout's interpreter lives there
    needed = {path.split(os.sep)[1] for path in (sys.prefix, sys.base_prefix, str(work))}
    assert "proc" not in shown
    assert "var" not in shown - needed
    assert lines[2].startswith("denied")
    assert (work / "inside").read_text() == "x"


def test_the_builds_copy_of_the_requirements_names_the_same_included_files(tmp_path):
    from runtimes.python import layer as python_layer

    base = tmp_path / "requirements.txt"
    base.write_text("-r extra.txt\n--constraint=pins.txt\nrequests>=2  # pinned below\n-c /etc/pins.txt\n")
    assert python_layer.copied(base).splitlines() == [
        f"-r {tmp_path}/extra.txt",
        f"--constraint {tmp_path}/pins.txt",
        "requests>=2  # pinned below",
        "-c /etc/pins.txt",
    ]


IN_A_DEFAULT_CONTAINER = """
import logging, os, sys
from pathlib import Path
logging.basicConfig(level=logging.INFO, format="%(name)s %(message)s")
from runtimes.python import layer as python_layer
work = Path(sys.argv[1])
python_layer.build(Path(sys.argv[2]), work, int(sys.argv[4]), find_links=sys.argv[3])
info = os.stat(work / "sandlot_probe.py")
print("built", info.st_uid)
"""


@needs_root
def test_without_mount_namespaces_builds_run_as_the_build_uid_and_say_so(wheelhouse, data_dir):
    """A container on default privileges: no tree can be mounted, the build still never runs as root."""
    if unprivileged.unavailable():
        pytest.skip(unprivileged.unavailable())
    python = unprivileged.venv_python()  # pip must be runnable by the build uid (the pyenv one is under /root)
    # without a tree the build reaches what it reads by the real paths: none under root's mode-700 places
    place = Path(data_dir)
    wheels = place / "wheels"
    wheels.mkdir()
    for wheel in wheelhouse.glob("sandlot_probe-*.whl"):
        shutil.copy(wheel, wheels)
    requirements = place / "requirements.txt"
    requirements.write_text("sandlot-probe==1.2.3\n")
    work = place / "work"
    work.mkdir()
    readable(place)
    requirements.chmod(0o600)  # the operator's file may be root's alone: the build reads the service's copy
    result = subprocess.run(
        [
            *standin(DOCKER_DEFAULT),
            python,
            "-c",
            IN_A_DEFAULT_CONTAINER,
            str(work),
            str(requirements),
            str(wheels),
            str(BUILD_UID),
        ],
        env={**os.environ, "PYTHONPATH": unprivileged.source()},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"built {BUILD_UID}" in result.stdout
    assert f"layer build runs as uid {BUILD_UID} without a tree of its own" in result.stderr
    assert "mount namespaces are refused" in result.stderr


@needs_root
def test_without_mount_namespaces_the_build_has_no_privilege_and_a_tmp_of_its_own(data_dir):
    if unprivileged.unavailable():
        pytest.skip(unprivileged.unavailable())
    work = Path(data_dir) / "work"
    work.mkdir()
    code = (
        "import os\nstatus = dict(l.split(':', 1) for l in open('/proc/self/status'))\n"
        "print(os.getuid(), os.getgid(), os.getgroups(), status['CapEff'].strip(), status['NoNewPrivs'].strip())\n"
        "tmp = os.environ['TMPDIR']\nst = os.stat(tmp)\nprint(oct(st.st_mode & 0o777), st.st_uid == os.getuid())\n"
        "open('inside', 'w').write('x')\n"
    )
    inner = (
        "import sys\nfrom layers import isolation\n"
        f"r = isolation.run([sys.executable, '-c', {code!r}], {str(work)!r}, [], {{}}, {BUILD_UID})\n"
        "print(r.stdout.decode(), end='')\n"
    )
    python = unprivileged.venv_python()
    result = subprocess.run(
        [*standin(DOCKER_DEFAULT), python, "-c", inner],
        env={**os.environ, "PYTHONPATH": unprivileged.source()},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"{BUILD_UID} {BUILD_UID} [] 0000000000000000 1", "0o700 True"]
    assert (work / "inside").read_text() == "x"


@pytest.mark.skipif(IS_ROOT, reason="as root builds are confined; this checks the fallback")
def test_builds_without_root_run_as_the_service_user(tmp_path):
    result = isolation.run([sys.executable, "-c", "import os; print(os.getuid())"], str(tmp_path), [], {}, 12345)
    assert result.stdout.decode().strip() == str(os.getuid())


def test_a_layer_another_instance_uses_is_not_removed(requirements, wheelhouse, data_dir):
    first = layer_service(requirements, wheelhouse, data_dir)
    second = layer_service(requirements, wheelhouse, data_dir)
    try:
        shared = first.detail()["runtimes"]["python3"]["layer"]
        assert second.detail()["runtimes"]["python3"]["layer"] == shared
        with first.client() as client:
            assert (
                client.post("/v1/sandbox/dependencies/update", json={"language": "python3"}, timeout=300).json()["code"]
                == 0
            )
        time.sleep(1)
        assert os.path.isdir(shared)  # the second instance still runs on it
        assert second.run("import requests\nprint('fine')")["data"]["stdout"] == "fine\n"
    finally:
        second.stop()
        first.stop()


def test_dify_sandbox_requirements_location_is_honoured(tmp_path, wheelhouse, data_dir):
    workdir = tmp_path / "dify"
    (workdir / "dependencies").mkdir(parents=True)
    (workdir / "dependencies" / "python-requirements.txt").write_text("sandlot-probe==1.2.3\n")
    readable(workdir)
    os.chmod(tmp_path, 0o755)
    svc = Service(
        cwd=str(workdir), SANDLOT_PIP_FIND_LINKS=str(wheelhouse), SANDLOT_DATA_DIR=data_dir, MAX_WORKERS="1"
    ).start()
    try:
        assert [d["name"] for d in svc.detail_dependencies()] == ["sandlot-probe"]
        assert svc.run("import sandlot_probe\nprint(sandlot_probe.VALUE)")["data"]["stdout"] == "probe-ok\n"
    finally:
        svc.stop()


def listings_during_a_build(monkeypatch, build) -> tuple[list[list[str]], list[tuple[str, ...]]]:
    """The configuration listings a build ran, and what it would have let its build reach (the build itself
    is not run)."""
    listed, reached = [], []
    run = subprocess.run

    def counting(argv, *args, **kwargs):
        if "config" in argv:
            listed.append(list(argv))
        return run(argv, *args, **kwargs)

    def not_run(argv, workdir, readable, env, uid, on_output=None, reaches=()):
        reached.append(reaches)
        return subprocess.CompletedProcess(argv, 0, b"", b"")

    monkeypatch.setattr(subprocess, "run", counting)
    monkeypatch.setattr(isolation, "run", not_run)
    build()
    return listed, reached


def test_a_python_build_asks_pips_configuration_once_and_a_later_start_finds_it_kept(monkeypatch, tmp_path):
    """pip's configuration is asked once (`pip config list`, and `pip config debug` for the files it read: two pips
    side by side, some 0.2 s inside the operator's start), then kept in the data dir and in the image's cache: a
    later build (a restart, a new volume of the image) asks no pip, until a file pip reads changes."""
    from runtimes.linux import rootfs
    from runtimes.python import layer as python_layer

    image_cache = tmp_path / "image-cache"
    image_cache.mkdir()
    monkeypatch.setattr(rootfs, "IMAGE_CACHE", str(image_cache))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))  # a place pip reads, and this test may write
    monkeypatch.delenv("PIP_CONFIG_FILE", raising=False)
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("requests\n")

    def build(data: str) -> tuple[list[list[str]], list[tuple[str, ...]]]:
        work = tmp_path / f"work-{len(os.listdir(tmp_path))}"
        work.mkdir()
        return listings_during_a_build(
            monkeypatch,
            lambda: python_layer.build(requirements, work, BUILD_UID, find_links=str(tmp_path), cache_dir=data),
        )

    first, _ = build(str(tmp_path / "data-1"))
    assert sorted(argv[-1] for argv in first) == ["debug", "list"]
    again, _ = build(str(tmp_path / "data-1"))  # a restart: the data dir's
    assert again == []
    other, _ = build(str(tmp_path / "data-2"))  # a new volume: the image's
    assert other == []
    (tmp_path / "xdg" / "pip").mkdir(parents=True)
    (tmp_path / "xdg" / "pip" / "pip.conf").write_text("[global]\nextra-index-url = http://index.example.invalid:9/\n")
    changed, reached = build(str(tmp_path / "data-2"))  # a file pip reads came: asked again, and heeded
    assert sorted(argv[-1] for argv in changed) == ["debug", "list"]
    assert "http://index.example.invalid:9" in reached[0]


def test_a_nodejs_builds_listing_reads_the_operators_npmrc_and_leaves_nothing_in_home(monkeypatch, tmp_path):
    from runtimes.nodejs import layer as node_layer

    node = shutil.which("node")
    if not node:
        pytest.skip("needs node")
    home = tmp_path / "home"
    home.mkdir()
    (home / ".npmrc").write_text("registry=http://registry.example.invalid:4873/\n")
    monkeypatch.setenv("HOME", str(home))
    package = tmp_path / "package.json"
    package.write_text('{"name": "x", "version": "1.0.0", "dependencies": {}}\n')
    work = tmp_path / "work"
    work.mkdir()
    listed, reached = listings_during_a_build(
        monkeypatch, lambda: node_layer.build([package], work, os.path.realpath(node), BUILD_UID)
    )
    assert len(listed) == 1
    assert "http://registry.example.invalid:4873" in reached[0]  # the operator's ~/.npmrc was read
    assert [p.name for p in home.rglob("*")] == [".npmrc"]  # no ~/.npm/_logs, no update notifier's state


SLOW_BACKEND = """
import base64, hashlib, os, time, zipfile

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    time.sleep(float(os.environ.get("SLOW_SECONDS", "4")))  # a slow build (an sdist compiling for seconds)
    dist = "slowpkg-1.0"
    files = {"slowpkg.py": "VALUE = 'slow-ok'\\n",
             dist + ".dist-info/METADATA": "Metadata-Version: 2.1\\nName: slowpkg\\nVersion: 1.0\\n",
             dist + ".dist-info/WHEEL": "Wheel-Version: 1.0\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"}
    record = [f"{f},sha256={base64.urlsafe_b64encode(hashlib.sha256(t.encode()).digest()).rstrip(b'=').decode()},"
              f"{len(t.encode())}" for f, t in files.items()]
    files[dist + ".dist-info/RECORD"] = "\\n".join(record + [dist + ".dist-info/RECORD,,"]) + "\\n"
    name = dist + "-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as wheel:
        for f, t in files.items():
            wheel.writestr(f, t)
    return name
"""


def slow_sdist(house: Path) -> None:
    """An sdist whose build takes seconds (its in-tree backend sleeps), built offline: it needs nothing else."""
    files = {
        "pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "slowbackend"\nbackend-path = ["."]\n',
        "slowbackend.py": SLOW_BACKEND,
        "PKG-INFO": "Metadata-Version: 2.1\nName: slowpkg\nVersion: 1.0\n",
    }
    with tarfile.open(house / "slowpkg-1.0.tar.gz", "w:gz") as sdist:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"slowpkg-1.0/{name}")
            info.size, info.mode = len(data), 0o644
            sdist.addfile(info, io.BytesIO(data))


def test_a_layer_built_at_start_is_built_while_the_service_serves(tmp_path, data_dir):
    """A first start whose layer must be built (an operator's additions on a new volume) serves meanwhile: /health
    answers at once (503: starting) instead of after the build, and a run sent during the build waits for it and
    gets the new layer. The start logs no ERROR of it."""
    house = tmp_path / "house"
    house.mkdir()
    slow_sdist(house)
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("slowpkg\n")
    readable(tmp_path)
    os.chmod(tmp_path, 0o755)
    svc = Service(
        SANDLOT_PYTHON_REQUIREMENTS=str(requirements),
        SANDLOT_PIP_FIND_LINKS=str(house),
        SANDLOT_DATA_DIR=data_dir,
        NODEJS_PATH="/nonexistent/node",  # Python's layer alone: no Node.js build beside it
        MAX_WORKERS="1",
    )
    started = time.monotonic()
    svc.start(wait=False)
    try:
        answered = None
        while answered is None and time.monotonic() - started < 60:
            try:
                status = httpx.get(svc.url + "/health", timeout=1).status_code
                answered = (time.monotonic() - started, status)
            except httpx.HTTPError:
                time.sleep(0.05)
        result = svc.run("import slowpkg\nprint(slowpkg.VALUE)")
        done = time.monotonic() - started
        assert result["data"]["stdout"] == "slow-ok\n", result
        assert answered is not None and answered[1] == 503, answered
        assert answered[0] + 2.0 < done, (answered, done)  # answered while the build (4 s) went on
    finally:
        svc.stop()
    errors = [line for line in svc.output().splitlines() if '"level":"ERROR"' in line]
    assert all("node is not installed" in line for line in errors), errors  # (no node here, on purpose)


def test_a_layer_that_cannot_be_built_at_start_refuses_its_runs_saying_why_and_the_service_serves(tmp_path, data_dir):
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("no-such-package-anywhere\n")
    (tmp_path / "house").mkdir()
    readable(tmp_path)
    os.chmod(tmp_path, 0o755)
    svc = Service(
        SANDLOT_PYTHON_REQUIREMENTS=str(requirements),
        SANDLOT_PIP_FIND_LINKS=str(tmp_path / "house"),
        SANDLOT_DATA_DIR=data_dir,
        NODEJS_PATH="/nonexistent/node",
        MAX_WORKERS="1",
    ).start(wait=False)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                answer = svc.run("print(1)")
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, svc.output()
                time.sleep(0.1)
        assert answer["code"] == -500, answer
        assert "the python3 layer could not be built: LayerBuildError: pip failed" in answer["message"], answer
        assert svc.process.poll() is None and httpx.get(svc.url + "/health", timeout=5).status_code == 503
        assert not [p for p in Path(data_dir, "layers", "python").iterdir()]  # nothing half-built left
    finally:
        svc.stop()


def test_pips_configuration_changed_while_it_is_listed_is_not_kept_as_listed(monkeypatch, tmp_path):
    """A file pip reads its configuration from, changed while pip lists it (an operator's edit landing during the
    first build), is not kept under its new state with the listing of its old one: the next build asks again and
    heeds it (an index URL, a `target` that makes a seeded build wrong)."""
    from runtimes.linux import rootfs
    from runtimes.python import layer as python_layer

    image_cache = tmp_path / "image-cache"
    image_cache.mkdir()
    monkeypatch.setattr(rootfs, "IMAGE_CACHE", str(image_cache))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("PIP_CONFIG_FILE", raising=False)
    conf = tmp_path / "xdg" / "pip" / "pip.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text("[global]\nextra-index-url = http://old.example.invalid:9/\n")
    listing = isolation.listing

    def edited_meanwhile(command, env=None):
        lines = listing(command, env)
        if command[-1] == "list":  # pip read the file; the operator's edit lands before the service keys it
            conf.write_text("[global]\nextra-index-url = http://new.example.invalid:9/\n")
        return lines

    monkeypatch.setattr(isolation, "listing", edited_meanwhile)
    data = str(tmp_path / "data")
    first = python_layer.pip_configuration(python_layer.pip_package(), data)
    assert any("old.example.invalid" in line for line in first)
    monkeypatch.setattr(isolation, "listing", listing)
    again = python_layer.pip_configuration(python_layer.pip_package(), data)
    assert any("new.example.invalid" in line for line in again), again
