"""Run a layer build (pip, npm) confined, and end every process it started when it ends.

pip and npm run code from the internet (an sdist's setup.py, a package's
scripts): never with the service's privileges, never past the build's end.

- As root with mount namespaces (`full`, `reduced`): the build runs in a fresh
  mount and PID namespace. Its root holds, read-only, only what the tool needs
  (its interpreter, its own package, the files it is configured to read) plus its
  own writable directory (the new layer) and a tmpfs /tmp; no /proc. It runs as a
  uid of its own (never the service's or a run's) with no groups, no
  capabilities and no_new_privs, under Landlock and a seccomp filter that refuses
  ptrace and process_vm_*. The build's first process is pid 1 of the namespace:
  when the build command ends, pid 1 exits and the kernel kills everything else
  the build started.
- Without root (`userns`): the same, in a user namespace of the build's own (the
  service has no other uid to give: the build's uid is the service's outside it).
  It cannot name, signal, trace or open any process outside its PID namespace,
  and writes nothing but its own layer directory and /tmp.
- As root where mount namespaces are refused (a container on default
  privileges, the `chroot` mode): no PID namespace either. The build runs as its
  uid (SANDLOT_BUILD_UID, outside every uid block: nothing else ever runs as it),
  with no groups, capabilities or new privileges, the seccomp filter, Landlock
  where the kernel has it, and a /tmp of its own. Its first process's parent (root)
  is a subreaper: every orphan of the build comes to it, and once the build command
  has ended it kills and reaps them all before it exits. It sees the container's
  files as any unprivileged user would; the log says so.
- Without root and without user namespaces (the `landlock` mode), the command runs
  as the service's own user in a Landlock domain of its own: it reads only what its
  tool needs (what a tree would hold), writes only its layer directory and a /tmp of
  its own, and connects by TCP only to the ports of its index, mirror and proxies
  (ABI 4); under the seccomp filter, and under a subreaper of its own (outside the
  domain) that ends every process it left once the command has ended.

Egress, as root: the build uid's sockets get the runs' nft rules (no loopback,
metadata address, private range or address of the host) while it runs, with the
package index or mirror, its file host and the configured proxies excepted
(builds_egress). Without root, as the runs: the build's user namespace has a
network namespace of its own holding the same rules (nft inside it, the host's
addresses refused by name), out through pasta (runtimes/linux/pasta.py),
the index, mirror and proxies excepted; pasta ends with the build. Where that
cannot be had the build shares the host's network, and the log says so.

This module is the service's side: it makes the build's uid, tree, network and plan, starts the build's own
process (layers/jailer.py, which confines itself as its plan says, then execs the build command), gives its
network namespace pasta, echoes its output, and cleans up after it.
"""

from __future__ import annotations

import dataclasses
import logging
import mimetypes
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

from layers.jailer import Plan
from runtimes.linux import namespaces, rootfs
from runtimes.linux.pasta import NamespaceNetwork, Pasta

log = logging.getLogger("sandlot.layers")

BUILD_FILES = ("/etc/pip.conf", "/etc/xdg/pip", "/etc/npmrc", "/usr/etc/npmrc", "/etc/ssl/certs", "/usr/lib/ssl")


def listing(command: list[str], env: dict[str, str] | None = None) -> list[str]:
    """The lines of a tool's configuration listing (`pip config list`, `npm config list`); none if it fails.
    Run once a build (a tool's start is some 0.2 s): configured_paths and configured_urls read its lines."""
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=60, env=env).stdout.splitlines()
    except (OSError, subprocess.TimeoutExpired):
        return []


def configured_paths(lines: list[str]) -> list[str]:
    """Absolute paths a tool's configuration (its listing's lines) names (find-links, local indexes,
    constraints, cafile)."""
    found = []
    for line in lines:
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
    reaches: tuple[str, ...] = (),
) -> subprocess.CompletedProcess:
    """Run argv in workdir, confined as described above. Output is captured (and echoed, and handed line by line
    to on_output: a build's live log). reaches: URLs the build must reach whatever their address (the package
    index or mirror, the proxies); as root, its egress is otherwise the runs' (see builds_egress)."""
    root = os.geteuid() == 0
    if root:
        _check_uid(uid)
        with builds_egress(uid, reaches):
            return _confined(argv, workdir, readable, env, uid, on_output)
    return _confined(argv, workdir, readable, env, uid, on_output, reaches)


@contextmanager
def builds_egress(uid: int, reaches: tuple[str, ...]) -> Iterator[None]:
    """As root, the build uid's sockets get the runs' egress rules (runtimes/linux/egress.py: no loopback, no
    metadata address, no private range, no address of the host) while the build runs, the package index,
    mirror and proxies excepted. Where nft cannot install them the log says so and the build goes on."""
    from runtimes.linux.egress import EgressFilter

    rules = EgressFilter(uid, uid, proxies=tuple(url for url in reaches if url))
    if not rules.install():
        log.warning("layer build's egress is not filtered: %s", rules.error)
    try:
        yield
    finally:
        rules.remove()


def reached(urls: list[str]) -> tuple[str, ...]:
    """The http(s) URLs among urls (an index, a registry, a mirror, a proxy), each as host:port, for the egress
    rules' exceptions (port: the URL's own, else its scheme's)."""
    found = []
    for url in urls:
        for word in url.split():
            parts = urlsplit(word if "://" in word else f"http://{word}")
            if parts.scheme not in ("http", "https", "socks5", "socks5h", "socks4") or not parts.hostname:
                continue
            try:
                port = parts.port or (443 if parts.scheme == "https" else 1080 if parts.scheme[:5] == "socks" else 80)
            except ValueError:
                continue
            found.append(f"http://{parts.hostname}:{port}")
    return tuple(dict.fromkeys(found))


def configured_urls(lines: list[str], keys: tuple[str, ...]) -> list[str]:
    """The values of keys (`index-url`, `registry`, ...) in a tool's configuration listing (its lines)."""
    found = []
    for line in lines:
        name, _, value = line.partition("=")
        if value and name.strip().rsplit(".", 1)[-1] in keys:
            found += shlex.split(value.strip(), posix=True)
    return found


def proxies(env: dict[str, str]) -> list[str]:
    return [v for k, v in env.items() if k.lower().endswith("_proxy") and k.lower() != "no_proxy"]


def _confined(
    argv: list[str],
    workdir: str,
    readable: list[str],
    env: dict[str, str],
    uid: int,
    on_output: Callable[[bytes], None] | None,
    reaches: tuple[str, ...] = (),
) -> subprocess.CompletedProcess:
    root = os.geteuid() == 0
    if root:
        os.chown(workdir, uid, uid)
        for dirpath, dirnames, filenames in os.walk(workdir):
            for name in dirnames + filenames:
                os.chown(os.path.join(dirpath, name), uid, uid, follow_symlinks=False)
    refused = _no_tree_here()
    if refused:
        if root:
            log.warning(
                "layer build runs as uid %d without a tree of its own (it sees this container's files as any "
                "unprivileged user would; what it leaves running is ended by a subreaper of its own): %s",
                uid,
                refused,
            )
            return _run_without_tree(argv, workdir, env, uid, on_output)
        log.info(
            "layer build runs as the service's own uid without a tree or PID namespace of its own, in a Landlock "
            "domain of its own (reads only what its tool needs; what it leaves running is ended by a subreaper "
            "of its own): %s",
            refused,
        )
        return _run_in_domain(argv, workdir, readable, env, on_output, reaches)
    interpreter = sys.executable
    spec = rootfs.TreeSpec(tmp_replaced=False)  # the build's /tmp is mounted first, under the binds
    spec.add(*readable, *BUILD_FILES, *rootfs.SYSTEM_FILES)
    spec.add(*rootfs.shared_libraries([os.path.realpath(interpreter), *readable_elves(readable)]))
    network = None if root else _namespace_network(reaches)
    plan = Plan(
        argv=tuple(argv),
        env=env,
        workdir=workdir,
        uid=uid if root else os.getuid(),
        gid=uid if root else os.getgid(),
        root=tempfile.mkdtemp(prefix="sandlot-build-root-"),
        spec=spec.to_dict(),
        user_namespace=not root,
        netns_ruleset=network.ruleset() if network else "",
    )
    if not root:
        os.chmod(plan.root, 0o755)
    try:
        if network is None:
            return _run_and_echo(_confining(interpreter, plan), dict(os.environ), "/", on_output)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pastas: list[Pasta | None] = []
        try:
            with ours, theirs:
                return _run_and_echo(
                    _confining(interpreter, dataclasses.replace(plan, netns_socket=theirs.fileno())),
                    dict(os.environ),
                    "/",
                    on_output,
                    pass_fds=(theirs.fileno(),),
                    started=lambda: (theirs.close(), pastas.append(_give_way_out(network, ours))),
                )
        finally:
            for pasta in pastas:  # pasta ends with the build
                if pasta is not None:
                    pasta.stop()
    finally:
        os.rmdir(plan.root)


def _namespace_network(reaches: tuple[str, ...]):
    """Without root: the build's network namespace with the runs' rules (runtimes/linux/pasta.py), out
    through pasta, the index and proxies excepted; None where that cannot be had (the build then shares the
    host's network, and the log says so)."""
    from runtimes.linux.egress import proxy_endpoints
    from runtimes.linux.protections import platform_protections

    record = platform_protections()
    pasta = shutil.which("pasta")
    if not (record.net_namespaces and record.netns_egress and pasta):
        why = "no pasta (apt-get install passt)" if not pasta else "no network namespace with nftables here"
        log.warning("layer build's egress is not filtered: %s", why)
        return None
    return NamespaceNetwork(netns=True, pasta=pasta, proxies=tuple(proxy_endpoints(list(reaches))))


NETNS_TIMEOUT = 10.0


def _give_way_out(network: NamespaceNetwork, control: socket.socket) -> Pasta | None:
    """The build's namespaces (sent by its first process: namespaces.join_network) get pasta; the build goes on
    once pasta is ready (or without a way out). pasta ends with the build (stopped by _confined) or with the
    service (its parent-death signal)."""
    control.settimeout(NETNS_TIMEOUT)
    try:
        _message, fds, _flags, _address = socket.recv_fds(control, 16, 2)
    except OSError:
        return None  # the bootstrap failed before its namespaces existed: its output says why
    try:
        if len(fds) != 2:
            return None
        try:
            pasta = Pasta.attach_blocking(network, fds[0], fds[1])
        except OSError as exc:
            log.warning("layer build's network: pasta did not start; the build has no way out")
            control.send(namespaces.NET_FAILED + str(exc).encode())
            return None
        control.send(namespaces.NET_READY)
        return pasta
    finally:
        for fd in fds:
            os.close(fd)


def _check_uid(uid: int) -> None:
    """The build's uid is its own: never root's, the service's or one a run may have."""
    if uid <= 0 or uid == os.getuid():
        raise ValueError(f"refusing to run a layer build as uid {uid}")


def _no_tree_here() -> str:
    """Why a build cannot have a tree (and PID namespace) of its own here ("" where it can)."""
    from runtimes.linux.protections import platform_protections

    record = platform_protections()
    if record.mount_namespaces and record.pid_namespaces and (os.geteuid() == 0 or record.user_namespaces):
        return ""
    if not record.mount_namespaces:
        return f"mount namespaces are refused ({record.errors.get('mount_namespaces', 'not available')})"
    if not record.pid_namespaces:
        return f"PID namespaces are refused ({record.errors.get('pid_namespaces', 'not available')})"
    return f"user namespaces are refused ({record.errors.get('user_namespaces', 'not available')})"


def _run_in_domain(
    argv: list[str],
    workdir: str,
    readable: list[str],
    env: dict[str, str],
    on_output: Callable[[bytes], None] | None,
    reaches: tuple[str, ...],
) -> subprocess.CompletedProcess:
    """Without root and namespaces (the landlock mode): the build as the service's uid, in a Landlock domain
    that reads only what its tool needs (what a tree would hold: the tool, its interpreter and libraries, the
    files it is configured to read; of the service's venv only pip and the venv's own files), writes only its
    layer directory and a /tmp of its own, and connects by TCP only to its index's, mirror's and proxies'
    ports; under a subreaper of its own (outside that domain) that ends every process it left once it has
    ended (jailer._reap_all)."""
    private_tmp = tempfile.mkdtemp(prefix="sandlot-build-tmp-")
    interpreter = os.path.realpath(sys.executable)
    paths, listable = _venv_narrowed(readable)
    argv, env = _outside_venv(argv, env, listable)
    paths += [interpreter, *BUILD_FILES, *rootfs.SYSTEM_FILES, *LANDLOCK_SYSTEM_FILES]
    paths += rootfs.shared_libraries([interpreter, *readable_elves(readable)])
    plan = Plan(
        argv=tuple(argv),
        env={**env, "TMPDIR": private_tmp},
        workdir=workdir,
        uid=os.getuid(),
        gid=os.getgid(),
        writable=(private_tmp,),
        reap=True,
        readable=tuple(dict.fromkeys(p for p in paths if os.path.lexists(p))),
        listable=tuple(listable),
        connect_ports=tuple(sorted({urlsplit(url).port or 80 for url in reaches})),
    )
    try:
        return _run_and_echo(_confining(sys.executable, plan), dict(os.environ), "/", on_output)
    finally:
        shutil.rmtree(private_tmp, ignore_errors=True)


# what the loader, the resolver, OpenSSL and pip (the distribution's name for its user agent) open, which they
# tolerate missing (as in a tree) but not refused (as Landlock refuses them)
LANDLOCK_SYSTEM_FILES = (
    "/etc/ld.so.cache",
    "/etc/ssl/openssl.cnf",
    "/etc/host.conf",
    "/etc/gai.conf",
    "/etc/os-release",
    "/usr/lib/os-release",
    "/etc/debian_version",
    "/etc/lsb-release",
    "/etc/alpine-release",
    "/etc/redhat-release",
    "/etc/system-release",
    *mimetypes.knownfiles,  # pip's mimetypes reads each that is a file
)


def _venv_narrowed(readable: list[str]) -> tuple[list[str], list[str]]:
    """readable, with the service's venv (sys.prefix, where it is one) narrowed to pip's own package; its
    site-packages may be listed (the import system lists it to find pip), not read. Not the venv's
    configuration (which names the service's install): pip runs on the base interpreter (_outside_venv).
    (readable paths, listable directories)"""
    prefix = sys.prefix
    if prefix == sys.base_prefix:
        return list(readable), []
    paths, listable = [], []
    for path in readable:
        if os.path.realpath(path) != os.path.realpath(prefix):
            paths.append(path)
            continue
        for site in sorted({p for p in sys.path if p.startswith(prefix + os.sep) and p.endswith("site-packages")}):
            listable.append(site)
            paths.append(os.path.join(site, "pip"))
    return paths, listable


def _outside_venv(argv: list[str], env: dict[str, str], sites: list[str]) -> tuple[list[str], dict[str, str]]:
    """pip started by the venv's interpreter (sys.prefix/bin/python) runs on the base interpreter instead, the
    venv's site-packages on its PYTHONPATH: it then reads no pyvenv.cfg."""
    if not sites or os.path.dirname(argv[0]) != os.path.join(sys.prefix, "bin"):
        return argv, env
    base = os.path.realpath(getattr(sys, "_base_executable", "") or argv[0])
    if os.path.dirname(base) == os.path.join(os.path.realpath(sys.prefix), "bin"):
        return argv, env  # a venv of copies: its interpreter is its own
    return [base, *argv[1:]], {**env, "PYTHONPATH": os.pathsep.join(sites)}


def _run_without_tree(
    argv: list[str], workdir: str, env: dict[str, str], uid: int, on_output: Callable[[bytes], None] | None
) -> subprocess.CompletedProcess:
    """The build as uid with no groups, capabilities or new privileges, its /tmp a directory of its own, under a
    subreaper of its own that ends every process it left once it has ended (jailer._reap_all)."""
    private_tmp = tempfile.mkdtemp(prefix="sandlot-build-tmp-")
    os.chown(private_tmp, uid, uid)
    plan = Plan(
        argv=tuple(argv),
        env={**env, "TMPDIR": private_tmp},
        workdir=workdir,
        uid=uid,
        gid=uid,
        writable=(private_tmp,),
        reap=True,
    )
    try:
        return _run_and_echo(_confining(sys.executable, plan), dict(os.environ), "/", on_output)
    finally:
        shutil.rmtree(private_tmp, ignore_errors=True)


def readable_elves(paths: list[str]) -> list[str]:
    """Native code the build tools load (lib-dynload, node): their libraries must be in the tree too."""
    found = []
    for path in paths:
        if os.path.isdir(path) and path.rstrip("/").endswith("lib-dynload"):
            found += rootfs.elf_files_under(path)
        elif os.path.isfile(path) and os.access(path, os.X_OK):
            found.append(path)
    return found


def _package_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -I ignores PYTHONPATH: this package is found where this process found it, installed or not
_BOOTSTRAP = "import sys; sys.path.insert(0, sys.argv[1]); from layers import jailer; jailer.main(sys.argv[2])"


def _confining(interpreter: str, plan: Plan) -> list[str]:
    """The command that confines itself as plan says, then execs the build (layers/jailer.py)."""
    return [interpreter, "-I", "-c", _BOOTSTRAP, _package_root(), plan.to_json()]


def _run_and_echo(
    argv: list[str],
    env: dict[str, str],
    cwd: str,
    on_output: Callable[[bytes], None] | None = None,
    pass_fds: tuple[int, ...] = (),
    started: Callable[[], object] | None = None,
) -> subprocess.CompletedProcess:
    process = subprocess.Popen(
        argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, pass_fds=pass_fds
    )
    try:
        if started is not None:
            started()
        lines = []
        assert process.stdout is not None
        for raw in process.stdout:  # the tool's own progress, for the operator, as it comes
            sys.stderr.write(raw.decode(errors="replace"))
            lines.append(raw)
            if on_output is not None:
                on_output(raw)
        process.wait()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return subprocess.CompletedProcess(argv, process.returncode, b"".join(lines), b"")
