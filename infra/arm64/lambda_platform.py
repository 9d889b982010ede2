"""In the arm64 machine (infra/arm64/lambda-init, as root): one runtime image started as Lambda starts a container
image function, with SAM local's Runtime Interface Emulator (the RIE) in front of it, as `sam local` runs it.

    lambda_platform.py start FUNCTION_DIR --platform lambda|sam --uid N --port P --runtime-api-port Q

FUNCTION_DIR, on the functions' disk (infra/arm64/lambda_invoke.sh makes it on the host from the built arm64
image, no arm64 program run there): root/ (the image's filesystem, with the RIE at /var/rapid/aws-lambda-rie as
SAM's own image layer puts it) and config.json (the image's Config: Env, Entrypoint, Cmd, WorkingDir).

The RIE serves the Invoke API on P (`POST /2015-03-31/functions/function/invocations`, the tenant id as
`X-Amz-Tenant-Id`) and at the first invoke starts the function with its Runtime API on 127.0.0.1:Q: the image's
ENTRYPOINT and CMD, in its WORKDIR, with the image's ENV, the variables SAM sets (dummy credentials among them: the
ENTRYPOINT drops them) and template.yaml's of the function. As on Lambda, the RIE is the platform (root, pid 1 of a
PID namespace of its own, as Lambda's init is in its microVM) and the function is not: between the two, `enter`
puts the function where Lambda puts it, as the tests simulate it (tests/lambda/simulated.py): into the image's
filesystem, read-only, with a tmpfs of 512 MB on /tmp the only writable place and a /dev of the usual nodes; the
uid N (not root, whatever the image's USER says); under tests/outer_filter.py's seccomp filter refusing with EPERM
what Lambda is reported to refuse (prctl, seccomp, namespaces, chroot, mounts, identity changes).
`--platform sam` puts it where SAM local's container does instead: root (the image's USER), Docker's default
capabilities and seccomp profile (tests/outer_filter.py's docker-default), the image's filesystem under a writable
layer of its own (an overlay on a tmpfs, as a container engine's).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RIE = "/var/rapid/aws-lambda-rie"  # where SAM's image layer puts it
# tests/lambda/simulated.py's REFUSED: what Lambda is reported to refuse a function (EPERM)
REFUSED = "prctl,seccomp,unshare,setns,chroot,pivot_root,mount,umount2,setuid,setgid,setresuid,setresgid,setgroups"
TMP_SIZE = "512m"  # Lambda's default ephemeral storage
DEV_NODES = ("null", "zero", "full", "random", "urandom")
# template.yaml's variables of the runtime functions, at its defaults (RequireSeccomp true, MaxRunSeconds 60,
# MaxRunMemoryMb 1024, EnableNetwork true), and its function settings for them (RunMemory, RunLimits)
TEMPLATE_ENV = {
    "SANDLOT_REQUIRE_SECCOMP": "true",
    "SANDLOT_MAX_TIMEOUT": "60",
    "SANDLOT_MAX_MEMORY_LIMIT_MB": "1024",
    "ENABLE_NETWORK": "true",
}
MEMORY_MB = "1536"
# Under software emulation (some fifty times slower) the first invoke's init takes minutes: the invoke's timeout
# (the RIE's, from AWS_LAMBDA_FUNCTION_TIMEOUT; Lambda's is 70 s here) and the zygote's start are stretched
EMULATION_ENV = {"SANDLOT_ZYGOTE_START_TIMEOUT": "900"}
TIMEOUT = "900"
# what SAM sets a function's container (samcli/local/lambdafn/env_vars.py), its credentials dummies as
# infra/sam_local_test.sh gives them
SAM_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "sam-local", "AWS_SECRET_ACCESS_KEY": "sam-local"}


def function_env(config: dict, name: str) -> dict[str, str]:
    """The function process's environment: the image's ENV, then SAM's variables, then the template's."""
    env = dict(item.split("=", 1) for item in config.get("Env") or [])
    command = config.get("Cmd") or []
    env.update(
        {
            "AWS_SAM_LOCAL": "true",
            "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": MEMORY_MB,
            "AWS_LAMBDA_FUNCTION_TIMEOUT": TIMEOUT,
            "AWS_LAMBDA_FUNCTION_HANDLER": command[0] if command else "",
            "AWS_LAMBDA_FUNCTION_NAME": name,
            "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
            "AWS_LAMBDA_LOG_GROUP_NAME": f"aws/lambda/{name}",
            "AWS_LAMBDA_LOG_STREAM_NAME": "$LATEST",
            "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ACCOUNT_ID": "123456789012",
            "AWS_LAMBDA_INITIALIZATION_TYPE": "on-demand",
            **SAM_CREDENTIALS,
            **TEMPLATE_ENV,
            **EMULATION_ENV,
        }
    )
    return env


def rie_command(port: int, runtime_api_port: int) -> list[str]:
    """SAM's container entrypoint: the RIE, its Invoke API on port, the Runtime API it gives the function."""
    return [
        RIE,
        "--log-level",
        "error",
        "--runtime-interface-emulator-address",
        f"0.0.0.0:{port}",
        "--runtime-api-address",
        f"127.0.0.1:{runtime_api_port}",
    ]


def bootstrap(config: dict) -> list[str]:
    """What the RIE starts at init: the image's ENTRYPOINT and CMD."""
    return [*(config.get("Entrypoint") or []), *(config.get("Cmd") or [])]


PLATFORMS = ("lambda", "sam")


def restrictions(platform: str, uid: int, command: list[str]) -> list[str]:
    """tests/outer_filter.py's arguments, then the command. `lambda`: the function's uid, Lambda's refusals. `sam`:
    as SAM local's container runs it, root (the image's USER) with Docker's default capabilities and seccomp
    profile (the uid is 0 there)."""
    if platform == "sam":
        return ["--caps", "docker-default", "--profile", "docker-default", "--", *command]
    return ["--uid", str(uid), "--eperm", REFUSED, "--", *command]


MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = (
    1,
    2,
    4,
    8,
    32,
    4096,
    0x4000,
    0x40000,
)
CLONE_NEWNS = 0x20000
libc = ctypes.CDLL(None, use_errno=True)


def check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(source: str | None, target: str, kind: str | None, flags: int, data: str | None = None) -> None:
    encode = lambda value: value.encode() if value is not None else None  # noqa: E731
    check(libc.mount(encode(source), encode(target), encode(kind), flags, encode(data)), f"mount {target}")


def lay_out(image_root: str, root: str, writable: bool) -> None:
    """The function's filesystem at root, in this process's own mount namespace: the image read-only (Lambda's)
    or under a writable layer of its own (a container's: an overlay, its upper layer a tmpfs), /tmp a tmpfs, /dev
    the usual nodes, /sys read-only (/proc: the PID namespace's, mounted by start)."""
    check(libc.unshare(CLONE_NEWNS), "unshare")
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    os.makedirs(root, exist_ok=True)
    if writable:
        layer = f"{root}.layer"
        os.makedirs(layer, exist_ok=True)
        mount("tmpfs", layer, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755")
        os.makedirs(f"{layer}/upper")
        os.makedirs(f"{layer}/work")
        mount("overlay", root, "overlay", 0, f"lowerdir={image_root},upperdir={layer}/upper,workdir={layer}/work")
    else:
        mount(image_root, root, None, MS_BIND | MS_REC)
        mount(None, root, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    mount("tmpfs", f"{root}/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={TMP_SIZE},mode=1777")
    mount("tmpfs", f"{root}/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=755")
    for node in DEV_NODES:
        open(f"{root}/dev/{node}", "w").close()
        mount(f"/dev/{node}", f"{root}/dev/{node}", None, MS_BIND)
    for link, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1")):
        os.symlink(target, f"{root}/dev/{link}")
    os.symlink("/proc/self/fd/2", f"{root}/dev/stderr")
    mount(None, f"{root}/dev", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NOEXEC)
    if os.path.isdir(f"{root}/sys"):
        mount("sysfs", f"{root}/sys", "sysfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)


def start(args: argparse.Namespace) -> None:
    """The platform (root): the function's filesystem, a PID namespace whose pid 1 is the RIE, which starts
    `enter` at init."""
    import outer_filter  # pyseccomp's library loaded here, where it is: the image's filesystem is not this machine's

    with open(os.path.join(args.function_dir, "config.json")) as f:
        config = json.load(f)
    name = os.path.basename(os.path.normpath(args.function_dir))
    root = f"/run/lambda-{name}-{args.platform}"
    lay_out(os.path.join(args.function_dir, "root"), root, writable=args.platform == "sam")
    outer_filter.own_pid_namespace()  # returns in its pid 1, /proc its own
    mount("proc", f"{root}/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    enter = [sys.executable, os.path.abspath(__file__), "enter", args.platform, root, str(args.uid)]
    enter.append(config.get("WorkingDir") or "/")
    command = [*rie_command(args.port, args.runtime_api_port), *enter, *bootstrap(config)]
    print(f"lambda {name}: {' '.join(command)}", flush=True)
    os.execve(root + RIE, command, function_env(config, name))


def enter(platform: str, root: str, uid: int, workdir: str, command: list[str]) -> None:
    """The function's process, started by the RIE with the function's environment: into the image's filesystem,
    the platform's restrictions, then the image's ENTRYPOINT and CMD (`enter PLATFORM ROOT UID WORKDIR COMMAND...`)."""
    import outer_filter

    os.chroot(root)
    os.chdir(workdir)
    outer_filter.main(restrictions(platform, uid, command))


def main() -> None:
    sys.path.insert(0, os.path.join(REPO, "tests"))
    if sys.argv[1:2] == ["enter"] and len(sys.argv) > 6:  # the RIE's bootstrap: no option parsing of its command
        enter(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6:])
        return
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="action", required=True)
    begin = sub.add_parser("start")
    begin.add_argument("function_dir")
    begin.add_argument("--platform", choices=PLATFORMS, default="lambda")
    begin.add_argument("--uid", type=int, required=True)
    begin.add_argument("--port", type=int, required=True)
    begin.add_argument("--runtime-api-port", type=int, required=True)
    start(parser.parse_args())


if __name__ == "__main__":
    main()
