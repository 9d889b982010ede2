"""Run a layer build (pip, npm) as an unprivileged user in a tree of its own.

pip and npm run code from the internet (an sdist's setup.py, a package's
scripts): never with the service's privileges. As root, the build command runs
in a fresh mount namespace whose root holds, read-only, only what the tool
needs (its interpreter, its own package, the files it is configured to read)
plus a writable scratch directory, as a uid of its own with no groups, no
capabilities and no_new_privs. Without root the command runs as the service's
own user (nothing to drop to), which the service logs.

    python -m layers.isolation '<json plan>'   # as root; execs the build command
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile

from runtimes import linux, tree

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
    argv: list[str], workdir: str, readable: list[str], env: dict[str, str], uid: int
) -> subprocess.CompletedProcess:
    """Run argv in workdir; as root, confined as described above. Output is captured (and echoed)."""
    if os.geteuid() != 0:
        return _run_and_echo(argv, env, workdir)
    os.chown(workdir, uid, uid)
    for dirpath, dirnames, filenames in os.walk(workdir):
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), uid, uid, follow_symlinks=False)
    interpreter = sys.executable
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
        command = [interpreter, "-I", "-m", "layers.isolation", json.dumps(plan)]
        return _run_and_echo(command, os.environ | {"PYTHONPATH": _package_root()}, "/")
    finally:
        os.rmdir(plan["root"])


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


def _run_and_echo(argv: list[str], env: dict[str, str], cwd: str) -> subprocess.CompletedProcess:
    process = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines = []
    assert process.stdout is not None
    for raw in process.stdout:  # the tool's own progress, for the operator, as it comes
        sys.stderr.write(raw.decode(errors="replace"))
        lines.append(raw)
    process.wait()
    return subprocess.CompletedProcess(argv, process.returncode, b"".join(lines), b"")


def _confine_and_exec(plan: dict) -> None:
    workdir, uid = plan["workdir"], plan["uid"]
    tree.build_and_enter(plan["spec"], plan["root"], writable=(workdir,), tmp_options="size=2g,mode=1777")
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    linux.set_no_new_privs()
    os.chdir(workdir)
    os.execve(plan["argv"][0], plan["argv"], plan["env"])


if __name__ == "__main__":
    _confine_and_exec(json.loads(sys.argv[1]))
