"""The runtime functions on a simulated Lambda: unprivileged, read-only code, prctl and seccomp refused."""

import glob
import json
import os
import sys
import time

import pytest
from functions import FAKE_CREDENTIALS
from simulated import (
    SIM_UID,
    SYSTEM_PYTHON,
    lay_out_image,
    live_processes_of,
    processes_of_sim_uid,
    start_simulated,
)

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))

from service import IS_ROOT, wait_for  # noqa: E402
from test_lambda_runtime import SECRET_HUNT, error_of, result_of, runtime_api_calls  # noqa: E402

pytestmark = [
    pytest.mark.skipif(not IS_ROOT, reason="needs root: the simulation changes to an unprivileged uid"),
    pytest.mark.skipif(not os.access(SYSTEM_PYTHON, os.X_OK), reason=f"needs {SYSTEM_PYTHON} (any uid can run it)"),
]


@pytest.fixture(scope="module")
def image():
    return lay_out_image()


@pytest.fixture(scope="module")
def strict(image):
    """The defaults: RequireSeccomp true."""
    instance = start_simulated(image, "python3")
    yield instance
    instance.stop()


@pytest.fixture(scope="module")
def lenient(image):
    """The operator set RequireSeccomp false."""
    instance = start_simulated(image, "python3", SANDLOT_REQUIRE_SECCOMP="false")
    assert instance.ready, instance.output()
    yield instance
    instance.stop()


def test_the_probe_reports_the_platform(strict):
    assert strict.ready, strict.output()
    probe = result_of(strict, {"action": "probe"})
    platform = probe["platform"]
    assert platform["euid"] == SIM_UID
    for refused in ("seccomp", "dumpable", "pdeathsig", "user_namespaces", "mount_namespaces", "chroot", "setuid"):
        assert platform[refused] is False, refused
        assert "Operation not permitted" in platform["errors"][refused]
    assert "/" not in platform["writable"] and "/usr" not in platform["writable"]
    assert probe["protections"]["seccomp"] is False and probe["protections"]["own_uid"] is False


def test_runs_without_a_tenant_id_are_refused_by_default_saying_why(strict):
    error = error_of(strict, {"language": "python3", "code": "print(1)", "enable_network": True})
    assert error["errorType"] == "TenantRefused"  # an Unavailable: nothing of the run was executed
    assert "seccomp filter cannot be installed" in error["errorMessage"] and "tenant id" in error["errorMessage"]


def test_a_refusal_by_sigsys_is_reported_and_refused_too(image):
    """Where refused calls kill the caller with SIGSYS (prctl, seccomp), the record says so and nothing of the
    runtime makes them: runs without a tenant id are refused, and a tenant's are served."""
    instance = start_simulated(image, "python3", sigsys=True)
    try:
        assert instance.ready, instance.output()
        probe = result_of(instance, {"action": "probe"})
        assert probe["platform"]["seccomp"] is False
        assert "SIGSYS" in probe["platform"]["errors"]["seccomp"]
        error = error_of(instance, {"language": "python3", "code": "print(1)", "enable_network": True})
        assert error["errorType"] in ("Unavailable", "TenantRefused") and "seccomp" in error["errorMessage"]
        event = {"language": "python3", "code": "import os\nprint(os.getpid() > 1)", "enable_network": True}
        for _ in range(2):  # the next run's child too: prepared between runs, with no refused call either
            invocation = instance.invoke(event, tenant_id="tenant-a")
            assert invocation.kind == "response", (invocation.body, instance.output()[-3000:])
            assert invocation.json()["stdout"] == "True\n"
    finally:
        instance.stop()


def test_node_too(image):
    instance = start_simulated(image, "nodejs", SANDLOT_REQUIRE_SECCOMP="false")
    try:
        assert instance.ready, instance.output()
        result = result_of(instance, {"language": "nodejs", "code": "console.log(6 * 7)", "enable_network": True})
        assert result["stdout"] == "42\n", result
    finally:
        instance.stop()


def test_zygotes_are_replaced_between_runs_without_a_false_tamper_alarm(image):
    """SANDLOT_ZYGOTE_MAX_FORKS bounds a zygote on Lambda too. Each node zygote brings a startup snapshot
    of its own into the runtime's files; a replacement made by the runtime is not taken for a run's
    tampering (which would replace the zygote once more and say so in the log)."""
    uid = SIM_UID + 2  # a uid of its own: it sweeps its uid after each run
    instance = start_simulated(image, "nodejs", uid=uid, SANDLOT_REQUIRE_SECCOMP="false", SANDLOT_ZYGOTE_MAX_FORKS="10")
    try:
        assert instance.ready, instance.output()
        client = instance.process.pid
        zygotes = set()
        for i in range(25):
            result = result_of(
                instance, {"language": "nodejs", "code": f"console.log({i} * 2)", "enable_network": True}
            )
            assert result["stdout"] == f"{i * 2}\n", result
            zygotes |= {pid for pid, parent, _ in live_processes_of(uid) if parent == client}
        assert len(zygotes) >= 3, zygotes  # replaced at least twice in 25 runs
        assert "touched the runtime's own files" not in instance.output()
    finally:
        instance.stop()


def test_without_seccomp_runs_serve_when_the_operator_allows_it(lenient):
    code = "import requests; print(1 + 1)"
    result = result_of(lenient, {"language": "python3", "code": code, "enable_network": True})
    assert result["stdout"] == "2\n" and result["exit_code"] == 0


def test_without_seccomp_enable_network_false_is_refused_not_ignored(lenient):
    error = error_of(lenient, {"language": "python3", "code": "print(1)", "enable_network": False})
    assert error["errorType"] == "Unavailable" and "enable_network false cannot be enforced" in error["errorMessage"]


def test_without_seccomp_no_run_can_print_the_credentials(lenient):
    code = SECRET_HUNT.replace("SECRETS", repr([s[::-1] for s in FAKE_CREDENTIALS.values()]))
    result = result_of(lenient, {"language": "python3", "code": code, "enable_network": True})
    assert "clean" in result["stdout"], result
    assert "searched" in result["stdout"]
    for secret in FAKE_CREDENTIALS.values():
        assert secret not in json.dumps(result)


def _event_hunt(instance) -> dict:
    """A run looking for its own event in the memory of every process it can open."""
    marker = "marker" + os.urandom(8).hex()
    code = SECRET_HUNT.replace("SECRETS", repr([marker[::-1]])) + f"\n# {marker}"
    return result_of(instance, {"language": "python3", "code": code, "enable_network": True})


REACH_THE_CLIENT = """
import os, signal
for what in ("mem", "environ", "fd/0", "maps"):
    try:
        open(f"/proc/{client}/{{what}}", "rb").read(1)
        print(what, "opened")
    except OSError as e:
        print(what, e.strerror)
try:
    os.kill({client}, signal.SIGCONT)  # harmless if it lands; Landlock's signal scope (ABI 6) stops it
    print("signalled")
except OSError as e:
    print("signal", e.strerror)
for place in (os.environ["TMPDIR"], os.path.dirname(os.environ["TMPDIR"])):
    try:
        open(os.path.join(place, "planted"), "w").write("x")
        print("wrote", place == os.environ["TMPDIR"] and "own" or "parent")
    except OSError as e:
        print("write", e.strerror)
"""


TAMPER = """
try:
    open({path!r}, "w").write("planted")
    print("planted")
except OSError as e:
    print(e.strerror)
"""


def _tamper(instance) -> str:
    """A run plants a file among the runtime's own files (its data dir: layers, node snapshots)."""
    (data_dir,) = glob.glob(os.path.join(instance.tmp, "sandlot-data-*"))
    code = TAMPER.format(path=os.path.join(data_dir, "planted"))
    return result_of(instance, {"language": "python3", "code": code, "enable_network": True})["stdout"]


def test_with_landlock_a_run_cannot_open_the_runtime_client_or_write_beside_its_directory(lenient):
    """Same uid, and the client stays dumpable (prctl refused); Landlock's ptrace rule still closes its
    memory, environment and descriptors to the run, and the run writes only its own directory."""
    probe = result_of(lenient, {"action": "probe"})
    assert probe["platform"]["landlock"] >= 1 and probe["protections"]["landlock"] == probe["platform"]["landlock"]
    result = result_of(
        lenient,
        {
            "language": "python3",
            "code": REACH_THE_CLIENT.format(client=lenient.process.pid),
            "enable_network": True,
        },
    )
    assert result["stdout"].splitlines() == [
        "mem Permission denied",
        "environ Permission denied",
        "fd/0 Permission denied",
        "maps Permission denied",
        "signal Operation not permitted" if probe["platform"]["landlock"] >= 6 else "signalled",
        "wrote own",
        "write Permission denied",
    ], result
    assert "clean []" in _event_hunt(lenient)["stdout"]
    assert _tamper(lenient) == "Permission denied\n"
    assert "touched the runtime's own files" not in lenient.output()


def test_without_landlock_the_hunt_finds_the_event_in_the_runtime_clients_memory(image):
    """The control, and the hole README names: where the platform has no Landlock either, the runtime
    client's memory IS readable (same uid, prctl refused so it stays dumpable), and the hunt finds what
    it holds, e.g. the event itself."""
    # a uid of its own: it sweeps its uid after each run, and `lenient` lives beside it
    instance = start_simulated(image, "python3", uid=SIM_UID + 1, landlock=False, SANDLOT_REQUIRE_SECCOMP="false")
    try:
        assert instance.ready, instance.output()
        probe = result_of(instance, {"action": "probe"})
        assert probe["platform"]["landlock"] == 0 and "landlock" in probe["platform"]["errors"]
        result = _event_hunt(instance)
        assert f"/proc/{instance.process.pid}/mem" in result["stdout"], result
        # nor is the runtime's own files' being written kept from it; it is found after the run, and the
        # zygote, which may have been started on them, is replaced before the next run (once the answer
        # is posted, before the next invocation is asked for)
        assert _tamper(instance) == "planted\n"
        replaced = "a run touched the runtime's own files: replacing the zygote"
        assert wait_for(lambda: replaced in instance.output(), 10), instance.output()
        (data_dir,) = glob.glob(os.path.join(instance.tmp, "sandlot-data-*"))
        assert not os.path.exists(os.path.join(data_dir, "planted"))  # and what it planted is gone
        assert (
            result_of(instance, {"language": "python3", "code": "print(7)", "enable_network": True})["stdout"] == "7\n"
        )
    finally:
        instance.stop()


def test_without_seccomp_nothing_a_run_leaves_reaches_the_next(lenient):
    leave = """
import os, time
for place in ("/tmp", "/var/tmp", "/dev/shm", os.environ["TMPDIR"], os.getcwd()):
    try:
        open(os.path.join(place, "sandlot-left-behind"), "w").write("x")
    except OSError:
        pass
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(120)
    os._exit(0)
print("left a process behind")
"""
    result = result_of(lenient, {"language": "python3", "code": leave, "enable_network": True})
    assert "left a process behind" in result["stdout"]
    # what is left of the simulated uid: the runtime client, its zygote and the child prepared since
    client = lenient.process.pid
    for pid, parent, command in processes_of_sim_uid():
        assert pid == client or parent == client or "sleep" not in command, (pid, parent, command)
    others = [p for p in processes_of_sim_uid() if p[0] != client and p[1] != client]
    assert len(others) <= 1, others  # the prepared child (a child of the zygote)
    look = """
import os
print([p for p in ("/tmp", "/var/tmp", "/dev/shm", os.environ["TMPDIR"])
       if os.path.exists(os.path.join(p, "sandlot-left-behind"))])
"""
    assert result_of(lenient, {"language": "python3", "code": look, "enable_network": True})["stdout"] == "[]\n"


def test_without_seccomp_a_run_gets_nothing_usable_from_the_runtime_api(lenient):
    code = runtime_api_calls(lenient.api.address)
    result = result_of(lenient, {"language": "python3", "code": code, "enable_network": True})
    assert "GOT" not in result["stdout"], result
    assert result["stdout"].count("refused") == 2
    assert lenient.api.refused[-2:] == ["next while in flight", "response for forged"]
    assert result_of(lenient, {"language": "python3", "code": "print(9)", "enable_network": True})["stdout"] == "9\n"


def test_the_image_layout_is_what_the_functions_need(image):
    """What the Dockerfiles install, laid out by the same script: readable by the function, not writable."""
    for path in ("venv/bin/python", "layers/python/requests/__init__.py", "layers/nodejs/package.json"):
        assert os.path.exists(os.path.join(image, path)), path
    venv_site = os.path.join(image, "venv", "lib", "python3.11", "site-packages")
    for package in ("awslambdaric", "pyseccomp.py", "runtimes", "layers"):
        assert any(name.startswith(package) for name in os.listdir(venv_site)), package
    assert os.stat(os.path.join(venv_site, "runtimes")).st_mode & 0o022 == 0
    # the layers are the project's own build (`sandlot layers build`), not a second one in the script
    with open(os.path.join(os.path.dirname(os.path.dirname(__file__)), "..", "infra", "layout.sh")) as f:
        script = "\n".join(line for line in f if not line.lstrip().startswith("#"))
    assert 'sandlot" layers build' in script and "npm" not in script and "--target" not in script
    assert os.path.isdir(os.path.join(image, "layers", "nodejs", "node_modules"))
    # compiled once there: a read-only layer cannot cache bytecode at a cold start
    requests = os.path.join(image, "layers", "python", "requests", "__pycache__")
    assert any(name.endswith(".pyc") for name in os.listdir(requests))


def test_no_process_prepared_for_a_later_invocation_exists_while_a_run_executes(lenient):
    """Runs share the runtime's uid here: the child for the next run is prepared only after the result is
    posted, and a run that comes back to back waits for it to be taken, never runs beside it."""
    client = lenient.process.pid
    look = f"""
import os
me, found = os.getpid(), []
for entry in os.listdir("/proc"):
    if entry.isdigit() and int(entry) != me:
        try:
            status = open(f"/proc/{{entry}}/status").read()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if int(fields["Uid"].split()[0]) == os.getuid() and fields["State"].split()[0] not in ("Z", "X"):
            found.append((int(entry), int(fields["PPid"])))
zygotes = {{pid for pid, parent in found if parent == {client}}}
print(sorted(pid for pid, parent in found if parent in zygotes))
"""
    for _ in range(5):  # back to back: each arrives while the next child may still be being prepared
        result = result_of(lenient, {"language": "python3", "code": look, "enable_network": True})
        assert result["stdout"] == "[]\n", result
    # the control: once the result is posted, the next child is prepared, and the look above would see it
    zygotes = {pid for pid, parent, _ in processes_of_sim_uid() if parent == client}
    for _ in range(100):
        if any(parent in zygotes for _, parent, _ in processes_of_sim_uid()):
            break
        time.sleep(0.05)
    else:
        pytest.fail("no child was prepared after the run")


# A run without a filter forks processes that keep running (threads of their own) and one that polls the
# Runtime API for the next invocation and would forge its answer. The run answers at once.
POLL_NEXT = """
import os, threading, time, urllib.request
api = "http://{api}/2018-06-01/runtime"
made = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        for _ in range(3):
            threading.Thread(target=lambda: [time.sleep(0.0005) for _ in iter(int, 1)], daemon=True).start()
        while True:
            try:
                with urllib.request.urlopen(api + "/invocation/next", timeout=5) as got:
                    request_id = got.headers["Lambda-Runtime-Aws-Request-Id"]
                forged = b'{{"stdout": "stolen", "stderr": "", "error": "", "exit_code": 0}}'
                urllib.request.urlopen(urllib.request.Request(
                    api + "/invocation/" + request_id + "/response", data=forged, method="POST"))
            except Exception:
                time.sleep(0.001)
    made.append(pid)
print(" ".join(map(str, made)), flush=True)
"""


def _can_act(pid: int) -> bool:
    """Whether some thread of pid could still run user code: not gone, not a zombie, not in exit."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if fields[0] not in (b"Z", b"X", b"x") and not int(fields[6]) & 0x4:  # PF_EXITING
            return True
    return False


def test_the_answer_goes_out_only_once_nothing_of_the_run_can_act(image):
    """The rule of the serial schedule: a result is posted once the run's processes were sent SIGKILL and
    every thread of them has entered exit, as seen from outside; the next invocation is fetched only
    once they are gone. Without the filter a run forks processes, one of which polls the unauthenticated
    Runtime API for the next invocation: at the moment the answer arrives none of them can act, and the
    next invocation never reaches them."""
    instance = start_simulated(image, "python3", uid=SIM_UID + 3, SANDLOT_REQUIRE_SECCOMP="false")
    seen: list[tuple[list[int], list[int]]] = []

    def on_answer(invocation, kind, body) -> None:
        if b"invocation/next" in invocation.payload:  # the forking run's answer, not the one after it
            made = [int(pid) for pid in json.loads(body).get("stdout", "").split()]
            seen.append((made, [pid for pid in made if _can_act(pid)]))

    try:
        assert instance.ready, instance.output()
        instance.api.on_answer = on_answer
        code = POLL_NEXT.format(api=instance.api.address)
        for _ in range(3):
            result = result_of(instance, {"language": "python3", "code": code, "enable_network": True})
            assert len(result["stdout"].split()) == 3, result
            following = result_of(instance, {"language": "python3", "code": "print(6 * 7)", "enable_network": True})
            assert following["stdout"] == "42\n", following  # answered by the runtime, not forged
        assert len(seen) == 3 and all(len(made) == 3 and able == [] for made, able in seen), seen
        assert not any(_can_act(pid) for made, _able in seen for pid in made)
    finally:
        instance.stop()
