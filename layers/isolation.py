"""Run a layer build (pip, npm) as an unprivileged user in a tree of its own.

pip and npm run code from the internet (an sdist's setup.py, a package's
scripts): never with the service's privileges. As root, the build command runs
in a fresh mount namespace whose root holds, read-only, only what the tool
needs (its interpreter, its own package, the files it is configured to read)
plus a writable scratch directory, as a uid of its own with no groups, no
capabilities and no_new_privs. Where mount namespaces are refused (a container on
default privileges: Docker's seccomp profile refuses unshare without SYS_ADMIN)
the command still runs as that uid, with no groups, no capabilities and
no_new_privs, and a /tmp of its own, but sees the container's files as any
unprivileged user would; the log says so. Without root the command runs as the
service's own user (nothing to drop to).

    python -m layers.isolation '<json plan>'   # as root; execs the build command (or isolation.main)
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable

from runtimes import linux, tree

log = logging.getLogger("sandlot.layers")

BUILD_FILES = ("/etc/pip.conf", "/etc/xdg/pip", "/etc/npmrc", "/usr/etc/npmrc", "/etc/ssl/certs", "/usr/lib/ssl")


def configured_paths(command: list[str]) -> list[str]:
    """Absolute paths a tool's configuration names (find-links, local indexes, constraints, cafile)."""
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    found = []
    for line in out.splitlines():
        if line.lstrip().startswith((";", "#")):
            continue  # npm's comments (`; cwd = /`, `; HOME = /root`) describe the caller, not the configuration
        _, _, value = line.partition("=")
        for word in shlex.split(value.strip(), posix=True) if value else []:
            path = word.removeprefix("file://")
            # "/" read-only over the build's whole tree would leave nothing of the tree (and no mount point in it)
            if path.startswith("/") and os.path.realpath(path) != "/" and os.path.exists(path):
                found.append(path)
    return found


def run(
    argv: list[str],
    workdir: str,
    readable: list[str],
    env: dict[str, str],
    uid: int,
    on_output: Callable[[bytes], None] | None = None,
) -> subprocess.CompletedProcess:
    """Run argv in workdir; as root, confined as described above. Output is captured (and echoed, and handed
    line by line to on_output: a build's live log)."""
    if os.geteuid() != 0:
        return _run_and_echo(argv, env, workdir, on_output)
    os.chown(workdir, uid, uid)
    for dirpath, dirnames, filenames in os.walk(workdir):
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), uid, uid, follow_symlinks=False)
    interpreter = sys.executable
    refused = _no_tree_here()
    if refused:
        log.warning(
            "layer build runs as uid %d without a tree of its own (it sees this container's files as any "
            "unprivileged user would): %s",
            uid,
            refused,
        )
        return _run_without_tree(argv, workdir, env, uid, on_output)
    spec = tree.TreeSpec(tmp_replaced=False)  # the build's /tmp is mounted first, under the binds
    spec.add(*readable, *BUILD_FILES, *tree.SYSTEM_FILES)
    spec.add(*tree.shared_libraries([os.path.realpath(interpreter), *readable_elves(readable)]))
    plan = {
        "spec": spec.to_dict(),
        "workdir": workdir,
        "uid": uid,
        "argv": argv,
        "env": env,
        "root": tempfile.mkdtemp(prefix="sandlot-build-root-"),
    }
    try:
        return _run_and_echo(_confining(interpreter, plan), dict(os.environ), "/", on_output)
    finally:
        os.rmdir(plan["root"])


def _no_tree_here() -> str:
    """Why a build cannot have a tree of its own here ("" where it can): no mount namespace."""
    from runtimes.jail.protections import platform_protections

    record = platform_protections()
    if record.mount_namespaces:
        return ""
    return f"mount namespaces are refused ({record.errors.get('mount_namespaces', 'not available')})"


def _run_without_tree(
    argv: list[str], workdir: str, env: dict[str, str], uid: int, on_output: Callable[[bytes], None] | None
) -> subprocess.CompletedProcess:
    """The build as uid with no groups, capabilities or new privileges, its /tmp a directory of its own."""
    private_tmp = tempfile.mkdtemp(prefix="sandlot-build-tmp-")
    os.chown(private_tmp, uid, uid)
    plan = {
        "workdir": workdir,
        "uid": uid,
        "argv": argv,
        "env": {**env, "TMPDIR": private_tmp},
        "root": "",
    }
    try:
        return _run_and_echo(_confining(sys.executable, plan), dict(os.environ), "/", on_output)
    finally:
        shutil.rmtree(private_tmp, ignore_errors=True)


def readable_elves(paths: list[str]) -> list[str]:
    """Native code the build tools load (lib-dynload, node): their libraries must be in the tree too."""
    found = []
    for path in paths:
        if os.path.isdir(path) and path.rstrip("/").endswith("lib-dynload"):
            found += tree.elf_files_under(path)
        elif os.path.isfile(path) and os.access(path, os.X_OK):
            found.append(path)
    return found


def _package_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -I ignores PYTHONPATH: this package is found where this process found it, installed or not
_BOOTSTRAP = "import sys; sys.path.insert(0, sys.argv[1]); from layers import isolation; isolation.main(sys.argv[2])"


def _confining(interpreter: str, plan: dict) -> list[str]:
    """The command that confines itself as plan says, then execs the build."""
    return [interpreter, "-I", "-c", _BOOTSTRAP, _package_root(), json.dumps(plan)]


def _run_and_echo(
    argv: list[str], env: dict[str, str], cwd: str, on_output: Callable[[bytes], None] | None = None
) -> subprocess.CompletedProcess:
    process = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines = []
    assert process.stdout is not None
    for raw in process.stdout:  # the tool's own progress, for the operator, as it comes
        sys.stderr.write(raw.decode(errors="replace"))
        lines.append(raw)
        if on_output is not None:
            on_output(raw)
    process.wait()
    return subprocess.CompletedProcess(argv, process.returncode, b"".join(lines), b"")


def _confine_and_exec(plan: dict) -> None:
    workdir, uid = plan["workdir"], plan["uid"]
    if plan["root"]:
        tree.build_and_enter(plan["spec"], plan["root"], writable=(workdir,), tmp_options="size=2g,mode=1777")
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    linux.set_no_new_privs()
    os.chdir(workdir)
    os.execve(plan["argv"][0], plan["argv"], plan["env"])


def main(plan: str) -> None:
    _confine_and_exec(json.loads(plan))


if __name__ == "__main__":
    main(sys.argv[1])
