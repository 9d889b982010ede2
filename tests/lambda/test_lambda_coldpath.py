"""A fresh environment's first run (issue 31): what the cold path skips or does at build time, and that it is safe.

- the first run of a function does not wait for the layer's preload (Python) or a startup snapshot's build
  (Node: the image's baked one, loaded with rehashing); the zygotes after it are the usual ones;
- the role's credentials leave a Lambda runtime process as its interpreter starts (the image's .pth hook);
- the platform probe runs in a forked child beside the imports, and its record is the one the process
  would have probed itself;
- the first zygote's interpreter starts beside the imports too, as any zygote starts, and goes if unused;
- the function's process imports asyncio without ssl.
"""

import json
import os
import subprocess
import sys
import time

import pytest
from functions import FAKE_CREDENTIALS, REPO
from simulated import SIM_UID, SYSTEM_PYTHON, lay_out_image, start_floor, start_simulated

from runtimes.function.early import CREDENTIALS, ENTRYPOINT_PREFIX

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))

from service import IS_ROOT  # noqa: E402
from test_lambda_runtime import result_of  # noqa: E402

HELD = "import sys; print(sorted(m for m in ('requests', 'httpx', 'jinja2') if m in sys.modules))"


@pytest.fixture(scope="module")
def image():
    return lay_out_image()


@pytest.mark.skipif(not IS_ROOT, reason="needs root: the simulation changes to an unprivileged uid")
@pytest.mark.skipif(not os.access(SYSTEM_PYTHON, os.X_OK), reason=f"needs {SYSTEM_PYTHON} (any uid can run it)")
def test_the_first_run_waits_for_no_preload_and_later_runs_find_the_layer_preloaded(image):
    instance = start_simulated(image, "python3", uid=SIM_UID + 40, SANDLOT_REQUIRE_SECCOMP="false")
    try:
        assert instance.ready, instance.output()
        # its zygote imported nothing of the layer; the layer is there all the same: the run imports what it uses
        code = f"{HELD}\nimport requests\nprint(requests.__name__)"
        first = result_of(instance, {"language": "python3", "code": code, "enable_network": True})
        assert first["stdout"] == "[]\nrequests\n", first
        later = result_of(instance, {"language": "python3", "code": HELD, "enable_network": True})
        assert later["stdout"] == "['httpx', 'jinja2', 'requests']\n", later
        assert "the first run is over: replacing the zygote" in instance.output()
    finally:
        instance.stop()


@pytest.mark.skipif(not IS_ROOT, reason="needs root: the simulation changes to an unprivileged uid")
@pytest.mark.skipif(not os.access(SYSTEM_PYTHON, os.X_OK), reason=f"needs {SYSTEM_PYTHON} (any uid can run it)")
@pytest.mark.skipif(not os.access("/usr/bin/node", os.X_OK), reason="needs node at /usr/bin/node")
def test_node_first_run_starts_on_the_baked_snapshot_loaded_with_rehashing(image):
    site = os.path.join(image, "venv", "lib", "python3.11", "site-packages")
    with open(os.path.join(site, "runtimes", "nodejs", "baked", "snapshot.json")) as f:
        baked = json.load(f)
    assert "--no-rehash-snapshot" not in baked["flags"]  # its seed is in every copy of the image: never used
    instance = start_simulated(image, "nodejs", uid=SIM_UID + 41, SANDLOT_REQUIRE_SECCOMP="false")
    try:
        assert instance.ready, instance.output()
        code = "console.log(typeof require, [1, 2].map((x) => x * 2).join())"
        for _ in range(2):  # the first on the baked snapshot, the next on the zygote's own
            result = result_of(instance, {"language": "nodejs", "code": code, "enable_network": True})
            assert result["stdout"] == "function 2,4\n", result
        assert "the first run is over: replacing the zygote" in instance.output()
        assert "no startup snapshot" not in instance.output()
    finally:
        instance.stop()


def test_a_baked_snapshot_serves_only_the_node_wrapper_and_heap_it_was_built_for(tmp_path):
    from runtimes.nodejs import snapshot
    from runtimes.nodejs.runtime import WRAPPER

    node = "/usr/bin/node"
    if not os.access(node, os.X_OK):
        pytest.skip("needs node at /usr/bin/node")
    made = snapshot.bake(node, WRAPPER, 512, str(tmp_path))
    assert made is not None and snapshot.NO_REHASH not in made.flags
    assert snapshot.baked(node, WRAPPER, 512, str(tmp_path)) == made
    assert snapshot.baked(node, WRAPPER, 256, str(tmp_path)) is None  # another heap limit
    other = tmp_path / "wrapper.js"
    with open(WRAPPER) as f:
        other.write_text(f.read() + "\n// changed\n")
    assert snapshot.baked(node, str(other), 512, str(tmp_path)) is None  # another wrapper
    meta = json.loads((tmp_path / "snapshot.json").read_text())
    meta["flags"].append(snapshot.NO_REHASH)
    (tmp_path / "snapshot.json").write_text(json.dumps(meta))
    assert snapshot.baked(node, WRAPPER, 512, str(tmp_path)) is None  # never loaded with the image's seed


def test_a_snapshot_baked_on_another_cpu_is_handed_out_only_where_node_takes_it(tmp_path, monkeypatch):
    # V8's tag covers the CPU's features: node refuses (exit 14, the run lost) a blob baked where they differ, as an
    # arm64 image built under qemu-user was on a Cortex-A72; the first zygote then builds a snapshot of its own
    from runtimes.nodejs import snapshot
    from runtimes.nodejs.runtime import WRAPPER

    node = "/usr/bin/node"
    if not os.access(node, os.X_OK):
        pytest.skip("needs node at /usr/bin/node")
    here = snapshot.cpu_features()
    assert here and here.startswith(os.uname().machine) and len(here.split()) > 3  # this machine's flags
    with monkeypatch.context() as m:
        m.setattr(snapshot, "cpu_features", lambda: f"{os.uname().machine}: fpu sse2 avx512f")  # the build's CPU
        made = snapshot.bake(node, WRAPPER, 512, str(tmp_path))
        assert made is not None
        assert snapshot.baked(node, WRAPPER, 512, str(tmp_path)) == made  # on that CPU, as recorded
    assert snapshot.baked(node, WRAPPER, 512, str(tmp_path)) == made  # here too: node's tag is the blob's
    # the features V8 uses differ: another tag in the blob, which node refuses
    blob = tmp_path / "wrapper.blob"
    data = bytearray(blob.read_bytes())
    offset = snapshot._tag_offset(bytes(data[:4096]))
    data[offset : offset + 4] = (int.from_bytes(data[offset : offset + 4], "little") ^ 0x5A5A).to_bytes(4, "little")
    blob.write_bytes(bytes(data))
    refused = subprocess.run([node, *made.flags, "--snapshot-blob", str(blob), "-e", "1"], capture_output=True)
    assert refused.returncode == 14 and b"startup snapshot" in refused.stderr
    assert snapshot.baked(node, WRAPPER, 512, str(tmp_path)) is None
    monkeypatch.setattr(snapshot, "cpu_features", lambda: None)  # a CPU that does not say: node's tag decides too
    assert snapshot.bake(node, WRAPPER, 512, str(tmp_path)) == made
    assert snapshot.baked(node, WRAPPER, 512, str(tmp_path)) == made


@pytest.mark.skipif(not IS_ROOT, reason="needs root: the simulation changes to an unprivileged uid")
@pytest.mark.skipif(not os.access(SYSTEM_PYTHON, os.X_OK), reason=f"needs {SYSTEM_PYTHON} (any uid can run it)")
def test_a_lambda_runtime_process_drops_the_credentials_as_its_interpreter_starts(image):
    python = os.path.join(image, "venv", "bin", "python")
    show = (
        "import os, sys; print(json.dumps([open('/proc/self/environ', 'rb').read().decode(), "
        "'awslambdaric' in sys.modules]))"
    ).replace("json", "__import__('json')")
    env = {"PATH": "/usr/bin:/bin", **FAKE_CREDENTIALS}
    ran = subprocess.run([python, "-c", show], env={**env, "AWS_LAMBDA_RUNTIME_API": "127.0.0.1:9"}, **_text())
    environ, _ = json.loads(ran.stdout)
    assert "AWS_LAMBDA_RUNTIME_API" in environ
    for secret in FAKE_CREDENTIALS.values():
        assert secret not in environ  # not even in the block the kernel shows: the process was replaced
    # any other process of the venv (pip at build time) is left alone
    other = subprocess.run([python, "-c", show], env=env, **_text())
    assert all(secret in json.loads(other.stdout)[0] for secret in FAKE_CREDENTIALS.values())


@pytest.mark.skipif(not IS_ROOT, reason="needs root: the simulation changes to an unprivileged uid")
@pytest.mark.skipif(not os.access(SYSTEM_PYTHON, os.X_OK), reason=f"needs {SYSTEM_PYTHON} (any uid can run it)")
def test_the_images_entrypoint_starts_the_interpreter_without_the_credentials(image):
    """The Dockerfiles' ENTRYPOINT (env(1) first) drops them before the interpreter starts: no re-exec needed."""
    python = os.path.join(image, "venv", "bin", "python")
    show = "import os; print(open('/proc/self/environ', 'rb').read().decode().replace(chr(0), chr(10)))"
    env = {"PATH": "/usr/bin:/bin", **FAKE_CREDENTIALS, "AWS_LAMBDA_RUNTIME_API": "127.0.0.1:9"}
    ran = subprocess.run([*ENTRYPOINT_PREFIX, python, "-c", show], env=env, **_text())
    assert "AWS_LAMBDA_RUNTIME_API=127.0.0.1:9" in ran.stdout.splitlines()
    assert set(CREDENTIALS) >= set(FAKE_CREDENTIALS)
    for name, secret in FAKE_CREDENTIALS.items():
        assert secret not in ran.stdout and name not in ran.stdout


@pytest.mark.skipif(not IS_ROOT, reason="needs root: the simulation changes to an unprivileged uid")
@pytest.mark.skipif(not os.access(SYSTEM_PYTHON, os.X_OK), reason=f"needs {SYSTEM_PYTHON} (any uid can run it)")
def test_a_runtime_functions_probe_starts_as_its_interpreter_starts(image):
    """In the image, a runtime function's process forks its probe from the early hook, before anything else is
    imported (awslambdaric's imports run beside it too); the record is the one its init reads."""
    python = os.path.join(image, "venv", "bin", "python")
    show = (
        "import json, sys; from runtimes.function import early; started = early._started; early.record(); "
        "print(json.dumps([started, early.probe_seconds == early.probe_seconds, 'awslambdaric' in sys.modules]))"
    )
    env = {"PATH": "/usr/bin:/bin", "AWS_LAMBDA_RUNTIME_API": "127.0.0.1:9"}
    handler = "runtimes.python.lambda_function.handler"  # in argv, as `python -m awslambdaric <handler>` has it
    ran = subprocess.run([python, "-c", show, handler], env=env, **_text())
    assert json.loads(ran.stdout) == [True, True, False]
    for other in ([python, "-c", show, handler], [python, "-c", show, "other.handler"]):  # not a runtime function
        ran = subprocess.run(other, env=env if other[-1] != handler else {"PATH": "/usr/bin:/bin"}, **_text())
        assert json.loads(ran.stdout) == [False, False, False]


@pytest.mark.skipif(not IS_ROOT, reason="needs root: the simulation changes to an unprivileged uid")
@pytest.mark.skipif(not os.access(SYSTEM_PYTHON, os.X_OK), reason=f"needs {SYSTEM_PYTHON} (any uid can run it)")
def test_the_benchs_floor_starts_exactly_as_the_runtime_functions_do(image):
    """bench/lambda_bench.py's floor (a bare awslambdaric function) is started by the command that starts the
    runtime functions, up to the interpreter: the images' ENTRYPOINT drops the credentials before it starts, so
    the floor pays no re-exec of the venv's early hook (a bare function on Lambda pays none); its interpreter
    never held them."""
    floor = start_floor(image, uid=SIM_UID + 42)
    function = start_simulated(image, "python3", uid=SIM_UID + 43, SANDLOT_REQUIRE_SECCOMP="false")
    try:
        assert floor.ready, floor.output()
        assert function.ready, function.output()
        result = floor.invoke({"floor": True})
        assert (result.kind, json.loads(result.body)) == ("response", "hello")

        def started_by(instance) -> list[str]:
            args = list(instance.process.args)
            return [arg for arg in args[: args.index(instance.python)] if not arg.isdigit()]  # the uids differ

        assert started_by(floor) == started_by(function)
        assert started_by(floor)[-len(ENTRYPOINT_PREFIX) :] == list(ENTRYPOINT_PREFIX)
        with open(f"/proc/{floor.process.pid}/environ", "rb") as f:
            environ = f.read().decode()
        assert "AWS_LAMBDA_RUNTIME_API" in environ
        assert not any(secret in environ for secret in FAKE_CREDENTIALS.values())
    finally:
        floor.stop()
        function.stop()


def _zygote_huge_kib(function_pid: int) -> tuple[int, int] | None:
    """(pid, AnonHugePages in KiB) of the function's live Python zygote, or None while it has none."""
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read()
        except (OSError, ValueError):
            continue
        if parent == function_pid and command.endswith(b"runtimes.python.runner\0"):
            try:
                with open(f"/proc/{entry}/smaps_rollup") as f:
                    huge = next(line for line in f if line.startswith("AnonHugePages:"))
            except OSError:
                continue  # retired meanwhile
            return int(entry), int(huge.split()[1])
    return None


@pytest.mark.skipif(not IS_ROOT, reason="needs root: the simulation changes to an unprivileged uid")
@pytest.mark.skipif(not os.access(SYSTEM_PYTHON, os.X_OK), reason=f"needs {SYSTEM_PYTHON} (any uid can run it)")
def test_the_first_runs_zygote_makes_no_huge_pages_and_the_usual_one_after_it_does(image):
    """The first run's zygote forks one child and is replaced: it does not copy its heap into huge pages (a cost
    paid once to make every later fork cheaper); the usual zygote after it does, where the kernel can."""
    instance = start_simulated(image, "python3", uid=SIM_UID + 44, SANDLOT_REQUIRE_SECCOMP="false")
    try:
        assert instance.ready, instance.output()
        first, first_huge = _zygote_huge_kib(instance.process.pid) or (0, -1)
        result = result_of(instance, {"language": "python3", "code": "print(6 * 7)", "enable_network": True})
        assert result["stdout"] == "42\n", result
        deadline = time.monotonic() + 20
        found = None
        while time.monotonic() < deadline:  # replaced once the answer is posted (between invocations)
            found = _zygote_huge_kib(instance.process.pid)
            if found is not None and found[0] != first:
                break
            time.sleep(0.05)
        later, later_huge = found or (first, -1)
        assert later != first, instance.output()
        assert first_huge == 0
        if later_huge == 0:
            pytest.skip("this kernel or platform makes no huge page of a zygote's heap (MADV_COLLAPSE, Linux 6.1+)")
    finally:
        instance.stop()


def test_the_early_probe_records_what_the_process_would_have_probed():
    script = (
        "import json\n"
        "from runtimes.function import early\n"
        "from runtimes.linux import protections\n"
        "early._start_probe()\n"
        "early.record()\n"
        "forked = protections.platform_protections().to_dict()\n"
        "assert early.probe_seconds == early.probe_seconds, 'the early record was not taken'\n"
        "print(json.dumps([forked, protections.probe().to_dict()]))\n"
    )
    ran = subprocess.run([sys.executable, "-c", script], cwd=REPO, **_text())
    forked, own = json.loads(ran.stdout)
    assert forked == own


def _zygotes(function_pid: int) -> list[tuple[int, list[str], list[str], str]]:
    """(pid, argv, environment, cwd) of each zygote the function's process started that is still alive."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().decode().split("\0")[:-1]
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = sorted(f.read().decode().split("\0")[:-1])
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except (OSError, ValueError):
            continue
        if int(stat[1]) == function_pid and stat[0] != "Z" and argv[-1].endswith(".runner"):
            found.append((int(entry), argv, environ, cwd))
    return found


@pytest.mark.skipif(not IS_ROOT, reason="needs root: the simulation changes to an unprivileged uid")
@pytest.mark.skipif(not os.access(SYSTEM_PYTHON, os.X_OK), reason=f"needs {SYSTEM_PYTHON} (any uid can run it)")
@pytest.mark.parametrize("language", ["python3", "nodejs"])
def test_the_first_zygote_starts_with_the_interpreter_and_as_any_zygote_starts(image, language):
    """The first zygote's interpreter is started from the early hook, before the function's imports, and serves
    the first run; it is started as the runtime starts every zygote: the same argv (but the config's descriptor),
    environment and working directory as the usual zygote that replaces it after the first run."""
    if language == "nodejs" and not os.access("/usr/bin/node", os.X_OK):
        pytest.skip("needs node at /usr/bin/node")
    instance = start_simulated(image, language, uid=SIM_UID + 45, SANDLOT_REQUIRE_SECCOMP="false")
    try:
        assert instance.ready, instance.output()
        assert "zygote started ahead: used" in instance.output()
        (first,) = _zygotes(instance.process.pid)
        code = "print(6 * 7)" if language == "python3" else "console.log(6 * 7)"
        result = result_of(instance, {"language": language, "code": code, "enable_network": True})
        assert result["stdout"] == "42\n", result
        deadline = time.monotonic() + 20
        later = []
        while time.monotonic() < deadline and not later:  # replaced once the answer is posted
            later = [zygote for zygote in _zygotes(instance.process.pid) if zygote[0] != first[0]]
            time.sleep(0.05)
        assert later, instance.output()

        def started_as(zygote):
            _, argv, environ, cwd = zygote
            return argv[:-2] + argv[-1:], environ, cwd  # argv[-2]: the config's descriptor's number

        assert started_as(first) == started_as(later[0])
        assert started_as(first)[1] == ["HOME=/tmp", "LANG=C.UTF-8", "TMPDIR=/tmp"]
    finally:
        instance.stop()


@pytest.mark.skipif(not IS_ROOT, reason="needs root: the simulation changes to an unprivileged uid")
@pytest.mark.skipif(not os.access(SYSTEM_PYTHON, os.X_OK), reason=f"needs {SYSTEM_PYTHON} (any uid can run it)")
def test_a_zygote_started_ahead_that_the_runtime_does_not_take_is_gone_after_init(image):
    """A jail this platform cannot give (SANDLOT_JAIL=full, no namespaces here): the runtime refuses runs before
    it starts any zygote, and the one started ahead is killed; the function answers the probe, saying why."""
    instance = start_simulated(image, "python3", uid=SIM_UID + 46, SANDLOT_JAIL="full")
    try:
        assert instance.ready, instance.output()
        assert "zygote started ahead: unused" in instance.output()
        assert _zygotes(instance.process.pid) == []
        probe = instance.invoke({"action": "probe"})
        assert probe.kind == "response" and json.loads(probe.body)["refused"], probe.body
    finally:
        instance.stop()


@pytest.mark.skipif(not IS_ROOT, reason="needs root: the simulation changes to an unprivileged uid")
@pytest.mark.skipif(not os.access(SYSTEM_PYTHON, os.X_OK), reason=f"needs {SYSTEM_PYTHON} (any uid can run it)")
def test_the_functions_process_loads_no_tls_and_serves(image):
    """asyncio goes without ssl in the function's process (no libssl, no libcrypto loaded at init); runs are served."""
    instance = start_simulated(image, "python3", uid=SIM_UID + 47, SANDLOT_REQUIRE_SECCOMP="false")
    try:
        assert instance.ready, instance.output()
        with open(f"/proc/{instance.process.pid}/maps") as f:
            maps = f.read()
        assert "libpython" in maps or "python3" in maps  # the function's own interpreter
        assert "libssl" not in maps and "/_ssl." not in maps
        result = result_of(instance, {"language": "python3", "code": "print(6 * 7)", "enable_network": True})
        assert result["stdout"] == "42\n", result
    finally:
        instance.stop()


def test_asyncio_without_tls_leaves_ssl_importable():
    script = (
        "import sys\n"
        "from runtimes.function import early\n"
        "early._asyncio_without_tls()\n"
        "import asyncio.base_events, asyncio.sslproto\n"
        "assert 'ssl' not in sys.modules and asyncio.sslproto.ssl is None\n"
        "loop = asyncio.new_event_loop()\n"
        "assert loop.run_until_complete(asyncio.sleep(0, 'ran')) == 'ran'\n"
        "import ssl\n"
        "print(ssl.PROTOCOL_TLS_CLIENT is not None)\n"
    )
    ran = subprocess.run([sys.executable, "-c", script], cwd=REPO, **_text())
    assert ran.stdout == "True\n"


def test_a_zygote_started_ahead_serves_only_the_start_it_was_started_for():
    """zygote_start.take_ahead hands it only to a start with the very interpreter, environment, runner and import
    paths it was started with; any other start gets none, and that one is killed."""
    script = (
        "import json, sys\n"
        "from runtimes.jail import zygote_start as z\n"
        "env = {'LANG': 'C.UTF-8', 'HOME': '/tmp', 'TMPDIR': '/tmp'}\n"
        "paths = z.import_paths()\n"
        "ends = []\n"
        "for other in ({**env, 'HTTP_PROXY': 'http://p:1'}, env):\n"
        "    z.start_ahead(sys.executable, env, 'runtimes.python.runner')\n"
        "    process = z._ahead.process\n"
        "    taken = z.take_ahead(sys.executable, other, 'runtimes.python.runner', paths)\n"
        "    ends.append([taken is not None, process.poll()])\n"
        "    if taken is not None:\n"
        "        taken.discard()\n"
        "z.start_ahead(sys.executable, env, 'runtimes.python.runner')\n"
        "process = z._ahead.process\n"
        "ends.append([z.discard_ahead(), process.poll(), z.take_ahead(sys.executable, env, 'x', paths) is None])\n"
        "print(json.dumps(ends))\n"
    )
    ran = subprocess.run([sys.executable, "-c", script], cwd=REPO, **_text())
    assert json.loads(ran.stdout) == [[False, -9], [True, None], [True, -9, True]]


def test_a_zygote_started_ahead_exits_quietly_with_the_process_that_started_it():
    """Its config never comes (the function's process died in its init): the end of its pipe closes, and it
    exits without a word. run() returns once it has: it holds the same stderr."""
    script = (
        "import os, sys\n"
        "from runtimes.jail import zygote_start as z\n"
        "z.start_ahead(sys.executable, {'LANG': 'C.UTF-8'}, 'runtimes.python.runner')\n"
        "print(z._ahead.process.pid, flush=True)\n"
        "os._exit(0)\n"
    )
    ran = subprocess.run([sys.executable, "-c", script], cwd=REPO, **_text())
    pid = int(ran.stdout)
    assert ran.stderr == ""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # its stderr closed as it exits: gone, or a zombie, a moment later
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
        except FileNotFoundError:
            break
        time.sleep(0.01)
    else:
        raise AssertionError(f"the zygote started ahead ({pid}) outlived the process that started it")


def _text() -> dict:
    return {"capture_output": True, "text": True, "check": True, "timeout": 60}
