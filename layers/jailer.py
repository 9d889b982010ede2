"""The layer build's own process: it confines itself as its plan says, then execs the build (pip, npm).

The service (layers/isolation.py) starts it, with one argument: the plan, as JSON (`Plan`), parsed and checked
once. `run` then takes every step in one fixed order, each where the plan has it:

1. the parent-death signal: the service gone, the build goes too;
2. with a tree: its namespaces (without root a user namespace of its own with its ids mapped, the network
   namespace joined to pasta by the service; a PID namespace either way) ...
3. ... and pid 1 of the PID namespace (its parent waits for it and exits with its code): when the build command
   ends, pid 1 exits and the kernel kills everything else the build started;
4. the seccomp filter, made while libseccomp is still in reach (it is not in the tree);
5. without a tree (`reap`): the parent stays, a subreaper that ends every orphan once the build ended;
6. with a tree: the tree (runtimes/linux/rootfs.py), the build's directory writable, a tmpfs /tmp;
7. the identity: the build's uid and gid with no groups (as root), no capabilities, no new privileges;
8. Landlock (writes only to the build's own places) and the seccomp filter;
9. the build: exec'd, in a child of pid 1 with a tree, in this process without.

    python -I -c '<bootstrap>' <package root> '<json plan>'   # as the service starts it (isolation._confining)
    python -m layers.jailer '<json plan>'
"""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import sys
import time
from dataclasses import asdict, dataclass
from typing import NoReturn

from runtimes.linux import landlock, namespaces, rootfs, syscalls
from runtimes.linux.procfs import stat_fields

PR_SET_CHILD_SUBREAPER = 36
REAP_ROUNDS = 5000
UNTRACEABLE = ("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp")
SOCKET_PROTOCOLS = (0, 6, 17)  # a type's default, TCP, UDP
BUILD_TMP = "size=2g,mode=1777"  # the build's own /tmp in its tree


class PlanError(ValueError):
    """A plan the jailer cannot follow (never one the service wrote)."""


@dataclass(frozen=True)
class Plan:
    """What the build is and how it is confined; its JSON is the jailer's argument."""

    argv: tuple[str, ...]  # the build command, argv[0] a path (exec'd as is)
    env: dict[str, str]  # its whole environment
    workdir: str  # the new layer's directory: its working directory, and writable
    uid: int  # the build's ids (in its user namespace: the service's own)
    gid: int
    root: str = ""  # where the tree is mounted; "" without a tree (no namespace to be had here)
    spec: dict | None = None  # the tree (rootfs.TreeSpec.to_dict()), with root
    user_namespace: bool = False  # with root: a user namespace of its own (the service has no root)
    netns_ruleset: str = ""  # with netns_socket: the egress rules of its network namespace (nft)
    netns_socket: int = -1  # an inherited socket to the service, which gives the network namespace pasta
    writable: tuple[str, ...] = ()  # without a tree: more places it writes (its /tmp)
    reap: bool = False  # without a tree: a subreaper of its own ends what it leaves running
    # without a tree (the landlock mode: no root, no namespaces), what Landlock lets the build read: only these
    # (files or directories; empty: all of "/"), list only these, and connect by TCP only to these ports (None:
    # any port)
    readable: tuple[str, ...] = ()
    listable: tuple[str, ...] = ()
    connect_ports: tuple[int, ...] | None = None

    @classmethod
    def parse(cls, text: str) -> Plan:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise PlanError(f"not JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise PlanError("not an object")
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise PlanError(f"unknown keys: {', '.join(sorted(unknown))}")
        lists = {key: data[key] for key in ("argv", "writable", "readable", "listable") if key in data}
        if data.get("connect_ports") is not None:
            lists["connect_ports"] = data["connect_ports"]
        if not all(isinstance(value, list) for value in lists.values()):
            raise PlanError("argv, writable, readable, listable, connect_ports: lists")
        try:
            plan = cls(**{**data, **{key: tuple(value) for key, value in lists.items()}})
        except (KeyError, TypeError) as exc:
            raise PlanError(f"incomplete: {exc}") from exc
        plan._check()
        return plan

    def _check(self) -> None:
        strings = lambda values: all(isinstance(v, str) for v in values)  # noqa: E731
        number = lambda value: isinstance(value, int) and not isinstance(value, bool)  # noqa: E731
        if not self.argv or not strings(self.argv):
            raise PlanError("argv: a non-empty list of strings")
        if not isinstance(self.env, dict) or not strings(self.env) or not strings(self.env.values()):
            raise PlanError("env: strings to strings")
        if not isinstance(self.workdir, str) or not os.path.isabs(self.workdir):
            raise PlanError("workdir: an absolute path")
        if not (number(self.uid) and number(self.gid) and self.uid >= 0 and self.gid >= 0):
            raise PlanError("uid, gid: ids")
        if not isinstance(self.root, str) or not strings(self.writable) or not isinstance(self.netns_ruleset, str):
            raise PlanError("root, writable, netns_ruleset: strings")
        if not strings(self.readable) or not strings(self.listable):
            raise PlanError("readable, listable: strings")
        ports = self.connect_ports
        if ports is not None and not all(number(p) and 0 < p < 65536 for p in ports):
            raise PlanError("connect_ports: TCP ports, or null")
        if not number(self.netns_socket) or self.netns_socket < -1:
            raise PlanError("netns_socket: an fd, or -1")
        if self.root:
            if not isinstance(self.spec, dict) or self.reap or self.writable or self.readable or self.listable:
                raise PlanError("a tree: its spec, and neither reap, writable, readable nor listable")
            if ports is not None:
                raise PlanError("a tree: its egress is its network's (no connect_ports)")
        elif self.spec is not None or self.user_namespace or self.netns_socket >= 0:
            raise PlanError("no tree: no spec, user namespace or network namespace")
        if self.netns_socket >= 0 and not self.user_namespace:
            raise PlanError("a network namespace of its own is made with a user namespace only")

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @property
    def places(self) -> tuple[str, ...]:
        """Where the build writes."""
        return (self.workdir, "/tmp") if self.root else (self.workdir, *self.writable)


def run(plan: Plan) -> NoReturn:
    """Confine this process as plan says and exec the build, in the order above; never returns."""
    syscalls.set_parent_death_signal(signal.SIGKILL)  # 1
    if plan.root:
        _enter_namespaces(plan)  # 2
        _become_first()  # 3
    filter_ = _untraceable()  # 4
    if plan.reap:
        _stay_as_subreaper()  # 5
    if plan.root:
        rootfs.build_and_enter(plan.spec, plan.root, writable=(plan.workdir,), tmp_options=BUILD_TMP)  # 6
    _drop(plan.uid, plan.gid, in_user_namespace=plan.user_namespace)  # 7
    _restrict(plan, filter_)  # 8
    if not plan.root:
        _exec(plan)  # 9
    build = os.fork()
    if build == 0:
        try:
            _exec(plan)
        finally:
            os._exit(127)
    os._exit(_exit_code(_wait_for(build)))


def _exec(plan: Plan) -> NoReturn:
    os.chdir(plan.workdir)
    os.execve(plan.argv[0], plan.argv, plan.env)


def _enter_namespaces(plan: Plan) -> None:
    """Without root: a user namespace (its ids mapped), a PID namespace and, with netns_socket, a network namespace
    with its egress rules and pasta. As root: a PID namespace."""
    if not plan.user_namespace:
        syscalls.unshare(syscalls.CLONE_NEWPID)
        return
    proc = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    netns = plan.netns_socket >= 0
    syscalls.unshare(syscalls.CLONE_NEWUSER | syscalls.CLONE_NEWPID | (syscalls.CLONE_NEWNET if netns else 0))
    namespaces.map_own_ids(proc, plan.uid, plan.gid)
    if netns:
        _join_network(plan, proc)
    os.close(proc)


def _join_network(plan: Plan, proc: int) -> None:
    """In the build's new network namespace: the runs' egress rules, then pasta from the service
    (namespaces.join_network)."""
    from runtimes.linux import nftables

    nftables.run(plan.netns_ruleset)
    control = socket.socket(fileno=plan.netns_socket)
    answer = namespaces.join_network(control, proc)
    control.close()
    if answer[:1] != namespaces.NET_READY:
        sys.stderr.write("sandlot: the build's network namespace has no way out (pasta did not start)\n")


def _become_first() -> None:
    """Go on as pid 1 of the new PID namespace; this process waits for it and exits with its code."""
    first = os.fork()
    if first:
        os._exit(_exit_code(_wait_for(first)))
    syscalls.set_parent_death_signal(signal.SIGKILL)  # a fork's child has none


def _stay_as_subreaper() -> None:
    """Every orphan of the build comes to this process, which outlives it, and is ended with it. The build goes on
    in the child. This process stays outside the build's Landlock domain: without root (the build then has its
    uid) the build can neither trace it nor, with Landlock's scopes (ABI 6), signal it."""
    syscalls.prctl(PR_SET_CHILD_SUBREAPER, 1)
    build = os.fork()
    if build:
        status = _wait_for(build)
        _reap_all()
        os._exit(_exit_code(status))


def _wait_for(pid: int) -> int:
    """Reap every child (orphans come to pid 1) until pid has ended; its wait status."""
    while True:
        try:
            ended, status = os.wait()
        except ChildProcessError:
            return 1 << 8
        if ended == pid:
            return status


def _children() -> list[int]:
    me, found = os.getpid(), []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            if int(stat_fields(stat)[1]) == me:
                found.append(int(entry))
    return found


def _reap_all() -> None:
    """SIGKILL every child of this subreaper (the build's orphans come to it) and reap them, until none is left.
    A process of the build cannot signal this one (root's), nor leave the subreaper's care: only its death would
    send orphans to init, and then its parent-death signal has ended the build's first process too."""
    for _ in range(REAP_ROUNDS):
        for pid in _children():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            return  # no child left, live or dead
        time.sleep(0.001)
    sys.stderr.write("sandlot: processes of the build kept appearing; some may be left\n")


def _exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code


def _drop(uid: int, gid: int, in_user_namespace: bool) -> None:
    """No groups, no capabilities, no new privileges; pdeathsig armed again after the credential change."""
    if in_user_namespace:
        namespaces.drop_bounding_set()
        namespaces.clear_capabilities()
    else:
        if os.geteuid() == 0:
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
    syscalls.set_parent_death_signal(signal.SIGKILL)
    syscalls.set_no_new_privs()


def _restrict(plan: Plan, filter_) -> None:
    """Landlock (writes only to the build's own places; without a tree, where the plan says so, reads only what
    the tool needs and connects only to its index's and proxies' ports) where the kernel has it; seccomp: no
    ptrace, no process_vm_* (no reaching into another process of the same uid)."""
    try:
        abi = landlock.abi_version()
    except OSError:
        abi = 0
    if abi:
        devices = tuple(d for d in rootfs.DEVICES if os.path.exists(d))
        ports = plan.connect_ports
        if ports is not None and abi < landlock.NETWORK_ABI:
            sys.stderr.write(f"sandlot: Landlock ABI {abi} has no TCP port rules: the build's egress is not limited\n")
            ports = None
        writable = tuple(p for p in plan.places if os.path.isdir(p))
        landlock.restrict(abi, writable, devices, plan.readable or ("/",), ports, plan.listable)
    else:
        sys.stderr.write("sandlot: no Landlock here: the build's writes are bounded by its uid and tree alone\n")
    if filter_ is None:
        sys.stderr.write("sandlot: libseccomp is missing: the build runs without its seccomp filter\n")
        return
    try:
        filter_.load()
    except OSError as exc:  # a platform refusing seccomp filters (an outer profile): as builds always ran there
        sys.stderr.write(f"sandlot: the build's seccomp filter could not be loaded here ({exc})\n")


def _untraceable():
    """The build's seccomp filter (made before the build's tree is entered: libseccomp is not in it), or None."""
    try:
        import pyseccomp
    except (ImportError, RuntimeError):
        return None
    from runtimes.linux.seccomp import all_but

    flt = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    for name in UNTRACEABLE:
        flt.add_rule(pyseccomp.ERRNO(errno.EPERM), name)
    # no socket past the egress rules: MPTCP (262), SCTP, UDP-Lite... are not TCP or UDP to Landlock or nft
    for mask, value in all_but(set(SOCKET_PROTOCOLS), 1 << 32):
        flt.add_rule(pyseccomp.ERRNO(errno.EPERM), "socket", pyseccomp.Arg(2, pyseccomp.MASKED_EQ, mask, value))
    return flt


def main(plan: str) -> NoReturn:
    try:
        parsed = Plan.parse(plan)
    except PlanError as exc:
        sys.exit(f"sandlot: the build's plan is refused: {exc}")
    run(parsed)


if __name__ == "__main__":
    main(sys.argv[1])
