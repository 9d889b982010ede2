"""The zygote: a single-threaded process that forks jailed children on request.

It is exec'ed by the service with a clean environment (no secret ever reaches
it), optionally builds the read-only tree and pivots into it, lets the language
runner warm up (imports of the dependency layer), and then only forks. It never
receives user code: code goes from the service straight to the child's pipe.

Each child is confined (confine.py), tells the service it is ready on a pipe
of its own, and then hands over to the runner. The child closes that pipe before
it reads anything, unless its runner says REPORTS_EXIT: then the pipe stays as
fd 3, where the run's wrapper reports the exit status it is about to exit with.
The zygote reaps every child through a pidfd and reports how it ended; when the
service goes away it kills what is left and exits.

What it builds follows its mode's record (modes.py): a tree of bind mounts it
pivots into (pivot), or a materialized tree it chroots into once (chroot).
Where runs have PID namespaces each child is forked straight into a PID
namespace of its own, and into the other namespaces the mode asks for
(confine.py): it is pid 1 there, the namespace's init, so that when it ends the
kernel kills everything else in the namespace before the zygote can reap it.
When the zygote reports a child's end, nothing of its namespace is left. (A pid
1 is spared the signals it sends itself while their action is the default: the
runners' signal shims make such a signal end the run as it would end any other
process.) Where the platform allows it, each child is also the first process of
a time namespace of its own (timens.py).
"""

from __future__ import annotations

import dataclasses
import gc
import os
import select
import signal
import socket
import sys
import traceback
import types
from collections.abc import Mapping

from runtimes.jail import protocol
from runtimes.jail.modes import CHROOT, PIVOT, UID_PER_RUN, USER_NAMESPACE
from runtimes.jail.policy import allowlist, proxy_egress
from runtimes.jail.zygote import runner as runner_contract
from runtimes.jail.zygote import warmheap
from runtimes.jail.zygote.confine import Handles, confine, tmpfs_takes_huge_pages
from runtimes.jail.zygote.forkhooks import ForkHooks
from runtimes.jail.zygote_config import ZygoteConfig
from runtimes.linux import landlock, namespaces, nftables, rootfs, syscalls, timens
from runtimes.linux.rootfs import DEVICES

CHILD_SETUP_FAILED = 125


class Zygote:
    """The zygote process's loop: made from its config, confined into its tree, then forking children."""

    def __init__(self, config: ZygoteConfig):
        self.control = socket.socket(fileno=config.control_fd)
        self.confinement = config.confinement
        self.runner = runner_contract.load(config.runner)
        self.children: dict[int, int] = {}  # pidfd -> pid
        self.poller = select.poll()
        self.vm_size = _VmSize()
        self.maps = warmheap.Maps()  # the tree has no /proc
        self.lifeline = os.pidfd_open(os.getpid())  # children learn through it whether the zygote still lives
        mode = self.confinement.mode
        # for a new user namespace's ids and the runs' time namespaces (the tree has no /proc)
        needs_proc = mode.identity == USER_NAMESPACE or self.confinement.time_namespace
        self.proc = os.open("/proc", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) if needs_proc else -1
        # a child's namespaces, made by the fork itself (its PID namespace: it is that namespace's pid 1)
        self.forker = namespaces.Forker(mode.clone_flags | (syscalls.CLONE_NEWPID if mode.pid_namespace else 0))
        self.fence = None  # where every child is pid 1: its signal fence, made once (confine._load_filters)
        self.fork_hooks = ForkHooks()
        self.landlock: landlock.Prepared | None = None  # the fixed part of every child's domain (enter_tree)
        # an ignored SIGCHLD (from whoever started the service) would have the kernel reap the children first
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        self.state = self.runner.prepare(config.runner_config)
        self.report: dict = {"mode": mode.name, **self.state.report}

    def enter_tree(self, config: ZygoteConfig) -> None:
        """The zygote's own confinement, once: its namespaces and network, its tree, its uid, the fixed part of
        every child's Landlock domain (each child's own is confine.confine())."""
        mode = self.confinement.mode
        in_user_namespace = mode.identity == USER_NAMESPACE
        if in_user_namespace and os.geteuid() != 0:  # a user namespace of its own, to build the tree in
            uid, gid = os.getuid(), os.getgid()
            network = config.network
            netns = bool(network and network.netns)
            syscalls.unshare(syscalls.CLONE_NEWUSER | (syscalls.CLONE_NEWNET if netns else 0))
            namespaces.map_own_ids(self.proc, uid, gid)
            if network and network.ruleset:
                self._join_network(network.ruleset)
        if mode.tree == PIVOT:
            rootfs.build_and_enter(config.tree, config.tree_root)
            self.confinement = dataclasses.replace(self.confinement, tmp_huge_pages=tmpfs_takes_huge_pages())
        elif mode.tree == CHROOT:  # the tree materialized as a directory (jail/trees/), entered once
            os.chroot(config.tree_root)
            os.chdir("/")
        if in_user_namespace and os.geteuid() == 0:  # root built the tree; nothing after this runs as root
            uid = config.zygote_uid
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            syscalls.set_dumpable(False)
            # a user namespace of its own, as without root: the PID namespaces of its runs are made in it
            syscalls.unshare(syscalls.CLONE_NEWUSER)
            namespaces.map_own_ids(self.proc, uid, uid)
        if mode.identity == UID_PER_RUN:
            # Once, not in every child: its children inherit the empty set (a child that made a user
            # namespace of its own would start there with a full one). The zygote never execs.
            namespaces.drop_bounding_set()
            self.confinement = dataclasses.replace(self.confinement, bounding_set_dropped=True)
        self.ids = (os.getuid(), os.getgid())
        if self.confinement.landlock:  # inside the tree: its root and device nodes are the rules' places
            # the landlock mode: only what the runtime's tree would hold (landlock_mode.py)
            readable = (config.readable or ("/",)) if mode.narrow_domain else ("/",)
            # proxy egress: TCP connect to these only (proxy_egress.py)
            self.landlock = landlock.Prepared(self.confinement.landlock, DEVICES, readable, config.connect_ports)
        self.udp_refused = None  # proxy egress: no datagram socket either (stacked in every child)
        if config.connect_ports is not None and self.confinement.seccomp:
            self.udp_refused = allowlist.compile_program(proxy_egress.udp_refused())
        for path in config.import_paths:
            while path in sys.path:
                sys.path.remove(path)
        sys.path_importer_cache.clear()
        self.install_roots = config.import_paths  # renamed away in serve() (hide_install_paths)
        self.single_fork = config.single_fork

    def _join_network(self, ruleset: str) -> None:
        """The runs' network namespace (linux/pasta.py): its egress rules, then pasta from the service."""
        from runtimes.linux.protections import in_child  # here only: the probe's module is not the zygote's

        _value, error = in_child(lambda: nftables.run(ruleset))  # libnftables never mapped into the zygote
        if error:
            raise OSError(error)
        # pasta joins them through descriptors (the zygote is not dumpable: its /proc/<pid>/ns is closed to others)
        answer = namespaces.join_network(self.control, self.proc, protocol.MAX_MESSAGE)
        # NET_FAILED: the namespace keeps no way out; the service refuses runs with network, serves the others
        if answer[:1] not in (protocol.NET_READY, protocol.NET_FAILED):
            raise OSError("no network for the runs: the service is gone")

    def serve(self) -> None:
        self.times = self._time_namespaces()  # before any child: see timens.py
        self.report.update(self.runner.warm(self.state))
        if self.confinement.mode.pid_namespace:
            self.fence = allowlist.fence_program(1)
        self.shared_uid_rules = None  # the landlock mode: what Landlock leaves to seccomp (landlock_mode.py)
        if self.confinement.mode.narrow_domain and self.confinement.seccomp:
            rules = allowlist.shared_uid_rules(self.confinement.landlock)
            self.shared_uid_rules = allowlist.compile_program(rules)
        if self.confinement.mode.pid_namespace:
            self.runner.as_pid_one(self.state)  # once here, not in every child: each will be a pid 1
        # what each child is lent, the same for all: made once here, not in every child. The signals ignored
        # by whoever started the service (and not handled since by the runner) are not ignored by the runs.
        ignored = tuple(s for s in (signal.SIGTERM, signal.SIGHUP) if signal.getsignal(s) == signal.SIG_IGN)
        stacked = tuple(p for p in (self.shared_uid_rules, self.udp_refused) if p is not None)
        self.handles = Handles(self.lifeline, self.proc, self.ids, self.landlock, ignored, self.fence, stacked)
        hide_install_paths(self.install_roots)  # after the runner's last import
        self.install_roots = ()
        self.fork_hooks.quiet()  # last: what the runner imported has registered its hooks
        if not self.single_fork:  # one child (a fresh Lambda environment's run): its garbage is frozen with it
            gc.collect()
        gc.freeze()  # children then share the warm heap instead of copying it
        syscalls.malloc_trim()  # malloc's free pages back first: neither copied nor counted (warmheap.py)
        # huge pages make each fork cheaper, and cost their making once (the kernel copies the heap into them):
        # not for a zygote that forks once
        self.report["huge_pages"] = 0 if self.single_fork else warmheap.collapse(self.maps)
        self.maps.close()
        self.control.send(protocol.ready(self.report))
        self.poller.register(self.control, select.POLLIN)
        while True:
            for fd, _events in self.poller.poll():
                if fd == self.control.fileno():
                    if not self._on_control():
                        self._shutdown()
                        return
                else:
                    self._reap(fd)

    def _time_namespaces(self) -> timens.TimeNamespaces | None:
        """Each run's clocks from zero, where the confinement asks for it; the report says whether it is in force."""
        if not self.confinement.time_namespace:
            return None
        try:
            times = timens.TimeNamespaces(self.proc)
        except OSError as exc:
            self.report["time_namespace_error"] = str(exc)
            return None
        self.report["time_namespace"] = True
        return times

    def _on_control(self) -> bool:
        try:
            message, fds, _flags, _addr = socket.recv_fds(
                self.control, protocol.MAX_MESSAGE, 4, socket.MSG_CMSG_CLOEXEC
            )
        except OSError:  # the service went away
            return False
        if not message:
            return False
        if message[:1] == protocol.FORK and len(fds) == 4:
            uid, tmpdir, variant = protocol.parse_fork_request(message[1:])
            self._fork(uid, tmpdir, variant, fds)
        else:
            for fd in fds:
                os.close(fd)
        return True

    def _fork(self, uid: int, tmpdir: str, variant: Mapping, fds: list[int]) -> None:
        address_space = self.vm_size.read()
        try:
            if self.times is not None:
                self.times.next()  # the run is the first process to enter it
            pid = self.forker.fork()
        except OSError as exc:
            self.control.send(protocol.FORK_FAILED + str(exc).encode())
            for fd in fds:
                os.close(fd)
            return
        if pid == 0:
            self._become_child(uid, tmpdir, variant, fds, address_space)
        pidfd = os.pidfd_open(pid)
        for fd in fds:
            os.close(fd)
        socket.send_fds(self.control, [protocol.forked(pid)], [pidfd])
        self.children[pidfd] = pid
        self.poller.register(pidfd, select.POLLIN)

    def _become_child(self, uid: int, tmpdir: str, variant: Mapping, fds: list[int], address_space: int) -> None:
        self.fork_hooks.restore()
        try:
            self.forker.child()
            # stdin, stdout, stderr, ready, then what the runner keeps (runner.py); its filters last
            confine(self.confinement, uid, tmpdir, (*fds, *getattr(self.state, "kept_fds", ())), self.handles)
            os.write(3, b"1")
            if not self.runner.REPORTS_EXIT:
                os.close(3)
            self.runner.run(self.state, address_space, variant)
        except BaseException:
            try:
                os.write(2, b"sandbox: could not prepare the run\n" + traceback.format_exc().encode())
            finally:
                os._exit(CHILD_SETUP_FAILED)
        os._exit(CHILD_SETUP_FAILED)

    def _reap(self, pidfd: int) -> None:
        """A child has ended (a namespace's pid 1: and everything else of its namespace with it): report it."""
        self.poller.unregister(pidfd)
        result = os.waitid(os.P_PIDFD, pidfd, os.WEXITED)
        os.close(pidfd)
        pid = self.children.pop(pidfd)
        self.control.send(protocol.exited(pid, result.si_code in (os.CLD_KILLED, os.CLD_DUMPED), result.si_status))

    def _shutdown(self) -> None:
        for pidfd in self.children:
            _kill(pidfd)
        for pidfd in self.children:
            os.waitid(os.P_PIDFD, pidfd, os.WEXITED)
        self.children.clear()


def _kill(pidfd: int) -> None:
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except ProcessLookupError:
        pass  # already gone


class _VmSize:
    """The zygote's own address-space size; a child's memory limit is counted on top of it."""

    def __init__(self) -> None:
        self.fd = syscalls.open_own("statm")
        self.page = os.sysconf("SC_PAGE_SIZE")

    def read(self) -> int:
        if self.fd < 0:
            return 0
        return int(os.pread(self.fd, 64, 0).split()[0]) * self.page


def main(raw: dict) -> None:
    """BOOTSTRAP's call (zygote_config.py), with the config file's dict."""
    try:
        config = ZygoteConfig.decode(raw)
        if config.confinement.dumpable:  # refused (Lambda): not tried (Confinement.dumpable)
            syscalls.set_dumpable(False)
        os.umask(0o022)
        zygote = Zygote(config)
        zygote.enter_tree(config)
    except BaseException as exc:
        report = {"error": f"{type(exc).__name__}: {exc}"}
        traceback.print_exc()
        socket.socket(fileno=raw["control_fd"]).send(protocol.ready(report))
        sys.exit(1)
    # A run's code can walk its frames up to this one (and reach the bootstrap's globals): the config, which
    # names the service's install path, its data dir and the tree's mount point, goes first (the zygote
    # keeps none of it).
    raw.clear()
    del config
    zygote.serve()


def hide_install_paths(roots: tuple[str, ...]) -> None:
    """Rename what the zygote loaded from under roots (the service's install path: this package, pyseccomp)
    to `<sandlot>/<path inside the root>`: modules' __file__, __path__, spec and loader, and every function's
    code (co_filename, which frames and tracebacks show; the running frames' code objects are these very
    ones, changed in place). The run inherits the zygote's modules and frames; none of them then tells where
    the service is installed. Once, before the first fork."""
    import _imp
    import linecache

    longest_first = sorted((root.rstrip("/") for root in roots), key=len, reverse=True)

    def renamed(path: object) -> str | None:
        if not isinstance(path, str):
            return None
        for root in longest_first:
            if path.startswith(root + "/"):
                return f"<sandlot>/{os.path.relpath(path, root)}"
        return None

    for module in list(sys.modules.values()):
        new = renamed(getattr(module, "__file__", None))
        if new is None:
            continue
        module.__file__ = new
        module.__cached__ = None
        search = getattr(module, "__path__", None)
        if isinstance(search, list):
            search[:] = [renamed(p) or p for p in search]
        spec = getattr(module, "__spec__", None)
        if spec is not None:
            spec.origin = new
            spec._cached = None  # (computed again from the new origin)
        loader = getattr(module, "__loader__", None)
        if loader is not None and renamed(getattr(loader, "path", None)):
            loader.path = new
    for thing in gc.get_objects():
        if isinstance(thing, types.FunctionType):
            new = renamed(thing.__code__.co_filename)
            if new is not None:
                _imp._fix_co_filename(thing.__code__, new)  # nested code objects too
    linecache.clearcache()  # (keyed by file name: a traceback the zygote formatted would keep the path)
