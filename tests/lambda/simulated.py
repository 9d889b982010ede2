"""A simulated Lambda: the runtime function laid out as its image is, run as it would be on the platform.

The image layout comes from infra/layout.sh (what the Dockerfiles run), made
from Debian's /usr/bin/python3.11 (any uid can execute it) under /var/tmp, kept
between test runs under a key of what it is built from; the project's own code
is reinstalled into it once per test session. Each instance then runs as an
unprivileged uid of its own, its code read-only (root's), only its temp
directory writable, under an outer seccomp filter that refuses prctl, seccomp,
namespaces, chroot, mounts and identity changes with EPERM (or, in one variant,
kills the caller with SIGSYS): tests/outer_filter.py.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

from emulation import FunctionInstance
from functions import FAKE_CREDENTIALS, HANDLERS, REPO

from runtimes.function.early import ENTRYPOINT_PREFIX

SYSTEM_PYTHON = "/usr/bin/python3.11"
SIM_UID = 61051  # a uid of its own, so that sweeping it touches no one else's processes
OUTER_FILTER = os.path.join(REPO, "tests", "outer_filter.py")
REFUSED = "prctl,seccomp,unshare,setns,chroot,pivot_root,mount,umount2,setuid,setgid,setresuid,setresgid,setgroups"
LANDLOCK = "landlock_create_ruleset,landlock_add_rule,landlock_restrict_self"
LAYOUT_INPUTS = ("pyproject.toml", "layers/python/requirements.txt", "layers/nodejs/package.json", "infra/layout.sh")


def image_key() -> str:
    digest = hashlib.sha256()
    for name in LAYOUT_INPUTS:
        with open(os.path.join(REPO, name), "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()[:16]


def lay_out_image() -> str:
    """The image's layout under /var/tmp (built once per key), with the project's current code.

    SANDLOT_LAMBDA_IMAGE=DIR: a copy of it of this checkout's own (made once from the shared one), so that
    another checkout laying out its code into the shared one meanwhile changes nothing of what runs here
    (bench/lambda_bench.py beside other worktrees)."""
    root = f"/var/tmp/sandlot-lambda-image-{image_key()}"
    own = os.environ.get("SANDLOT_LAMBDA_IMAGE", "")
    if own:
        return _own_copy(root, own)
    return _shared(root)


def _own_copy(shared: str, own: str) -> str:
    key = os.path.join(own, f".copied-{os.path.basename(shared)}")
    if not os.path.exists(key):
        with open("/var/tmp/sandlot-lambda-image.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # copied whole: no other checkout's code half laid into it
            if not os.path.exists(os.path.join(shared, ".complete")):
                _shared(shared, locked=True)
            shutil.rmtree(own, ignore_errors=True)
            shutil.copytree(shared, own, symlinks=True)
        open(key, "w").close()
    subprocess.run([os.path.join(REPO, "infra", "layout.sh"), own, "--project-only"], check=True, capture_output=True)
    return own


def _shared(root: str, locked: bool = False) -> str:
    with open("/var/tmp/sandlot-lambda-image.lock", "a") as lock:
        if not locked:
            fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(os.path.join(root, ".complete")):
            shutil.rmtree(root, ignore_errors=True)
            subprocess.run(
                [os.path.join(REPO, "infra", "layout.sh"), root],
                env={**os.environ, "PYTHON": SYSTEM_PYTHON},
                check=True,
                capture_output=True,
            )
            open(os.path.join(root, ".complete"), "w").close()
        else:
            subprocess.run(
                [os.path.join(REPO, "infra", "layout.sh"), root, "--project-only"], check=True, capture_output=True
            )
    return root


def start_simulated(
    image: str,
    language: str,
    sigsys: bool = False,
    uid: int = SIM_UID,
    landlock: bool = True,
    entrypoint: bool = True,
    wrap: tuple[str, ...] = (),
    **env: str,
) -> FunctionInstance:
    """A runtime function instance on the simulated platform; its temp dir is the only place it may write.

    Whether Lambda's kernel lets a function use Landlock is not known (the probe says where it runs):
    `landlock=False` refuses its calls too, for a platform without it. `entrypoint=False`: the interpreter
    started straight, with the credentials (as images did before their ENTRYPOINT dropped them: bench --base).
    `wrap`: a command that execs the rest (the bench's, to count the environment's CPU).

    Each instance sweeps its uid after every run, as on Lambda, where an instance has a sandbox of its
    own: instances that must live side by side need uids of their own."""
    tmp = tempfile.mkdtemp(prefix="sandlot-sim-")
    os.chown(tmp, uid, uid)
    refusals = ["--sigsys" if sigsys else "--eperm", REFUSED if landlock else f"{REFUSED},{LANDLOCK}"]
    start = ENTRYPOINT_PREFIX if entrypoint else ()
    function_env = {
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": tmp,
        "TMPDIR": tmp,
        "SANDLOT_PYTHON_LAYER": os.path.join(image, "layers", "python"),
        "SANDLOT_NODEJS_LAYER": os.path.join(image, "layers", "nodejs"),
        **FAKE_CREDENTIALS,
        **env,
    }
    instance = FunctionInstance(
        HANDLERS[language],
        function_env,
        name=f"sim-{language}",
        python=os.path.join(image, "venv", "bin", "python"),
        # started as the image's ENTRYPOINT starts it: env(1) drops the credentials, then the interpreter
        prefix=(*wrap, sys.executable, OUTER_FILTER, "--uid", str(uid), *refusals, "--", *start),
        cwd="/",
    )
    instance.tmp = tmp
    return instance.start()


FLOOR_HANDLER = "floor_function.handler"
FLOOR_SOURCE = 'def handler(event, context):\n    return "hello"\n'


def start_floor(image: str, uid: int = SIM_UID, wrap: tuple[str, ...] = (), **env: str) -> FunctionInstance:
    """The floor: a bare awslambdaric function (`def handler(e, c): return "hello"`) on the same simulated platform
    (the image's interpreter and awslambdaric, the same uid, outer filter, environment and credentials), so
    that what a runtime function's init costs beyond Lambda's own can be read as a difference to it.

    Started exactly as the runtime functions are (start_simulated): through the images' ENTRYPOINT, env(1)
    dropping the credentials before the interpreter starts. Started straight, the venv's early hook would
    re-execute its interpreter (the credentials in its environment), a second interpreter start that a bare
    function on Lambda never pays: the floor would be flattered by it."""
    tmp = tempfile.mkdtemp(prefix="sandlot-sim-")
    with open(os.path.join(tmp, "floor_function.py"), "w") as f:  # removed with tmp when the instance stops
        f.write(FLOOR_SOURCE)
    os.chmod(os.path.join(tmp, "floor_function.py"), 0o644)
    os.chown(tmp, uid, uid)
    instance = FunctionInstance(
        FLOOR_HANDLER,
        {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": tmp, "TMPDIR": tmp, **FAKE_CREDENTIALS, **env},
        name="sim-floor",
        python=os.path.join(image, "venv", "bin", "python"),
        prefix=(*wrap, sys.executable, OUTER_FILTER, "--uid", str(uid), "--eperm", REFUSED, "--", *ENTRYPOINT_PREFIX),
        cwd=tmp,  # `python -m` puts it first on sys.path, as Lambda's task root
    )
    instance.tmp = tmp
    return instance.start()


TENANT_UIDS = range(SIM_UID + 100, SIM_UID + 1100)  # one per environment started for a tenant
_next_tenant_uid = iter(TENANT_UIDS)


def tenant_environments(image: str, language: str, entrypoint: bool = True, wrap: tuple[str, ...] = (), **env: str):
    """`start(tenant_id)` for InvokeAPI.add_per_tenant: each tenant's environment a simulated instance with a uid
    of its own (as each is a microVM of its own on Lambda, and each sweeps its uid after every run).
    language "floor": the bare function (start_floor)."""

    def start(tenant: str) -> FunctionInstance:
        if language == "floor":
            return start_floor(image, uid=next(_next_tenant_uid), wrap=wrap, **env)
        return start_simulated(image, language, uid=next(_next_tenant_uid), entrypoint=entrypoint, wrap=wrap, **env)

    return start


def processes_of_sim_uid() -> list[tuple[int, int, str]]:
    """(pid, parent, command) of every live process of the simulated uid."""
    return live_processes_of(SIM_UID)


def live_processes_of(uid: int) -> list[tuple[int, int, str]]:
    """(pid, parent, command) of every process of uid that is not a zombie."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                status = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")[:80]
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if int(fields["Uid"].split()[0]) == uid and fields["State"].split()[0] not in ("Z", "X"):
            found.append((int(entry), int(fields["PPid"]), command))
    return found
