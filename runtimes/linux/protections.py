"""What this platform lets the jail do: each mechanism probed once, in a throwaway child.

One record, the same everywhere: the local service (as root or not), a
container, and a Lambda runtime function, which reports it on `{"action":
"probe"}`. The start-up log and the health detail show it, and the jail picks
its mode from it instead of from a single "am I root" switch.

Every probe runs in a forked child, because on some platforms a refused call
does not fail: it kills the caller with SIGSYS. A probe that dies says so.
A mechanism that this process's own state already rules out is said without a
child (`_ruled_out`): one that needs a capability the process's effective set
lacks, a place it has no write access to, and, without root, every namespace
probe once a user namespace of its own was refused (each of them would start by
creating one). Only failures are said that way, never a success: a fork of the
runtime costs a few ms of CPU, and a Lambda function's init forked 19 of them
where 7 can tell it something.

Only the standard library, pyseccomp (for the seccomp probe) and libnftables (through
ctypes, for the network namespace's) are used: the record must be obtainable before
anything else of the jail is set up.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import select
import signal
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from runtimes.linux import landlock, namespaces, nftables, syscalls
from runtimes.linux.idmap import IdMap

# Places a run or the service might write to; the record says which are writable here.
WRITABLE_CANDIDATES = ("/", "/etc", "/usr", "/var/tmp", "/tmp", "/dev/shm")
TUN_DEVICE = "/dev/net/tun"
PROBE_SECONDS = 20  # one probe's answer; a child stuck longer is killed and the mechanism counted as missing
PROBE_UID = 65534  # nobody: any uid other than ours tells whether we may change identity (where it is mapped)


@dataclass(frozen=True)
class Protections:
    """The platform's answer per mechanism. `errors` says why a mechanism is missing."""

    euid: int
    seccomp: bool  # a seccomp filter can be loaded (after no_new_privs)
    no_new_privs: bool
    dumpable: bool  # PR_SET_DUMPABLE 0 works: /proc/<pid>/{environ,mem,fd} closed to same-uid processes
    pdeathsig: bool  # a child can ask to die with its parent
    user_namespaces: bool
    # as root directly, otherwise inside a new user namespace; and in it every step a tree takes (a private
    # propagation, a tmpfs, a read-only bind, pivot_root, a detached unmount): a platform may refuse one alone
    mount_namespaces: bool
    pid_namespaces: bool  # likewise
    net_namespaces: bool  # likewise
    chroot: bool  # chroot/pivot_root into a tree of our own (needs CAP_SYS_CHROOT)
    setuid: bool  # runs may get a uid of their own (needs CAP_SETUID)
    rlimits: bool
    landlock: int  # Landlock ABI version, 0 when absent
    cgroups: bool  # a cgroup hierarchy (v1 pids controller, or v2) this process may create groups in
    writable: tuple[str, ...] = ()  # which of WRITABLE_CANDIDATES this process can write to
    # Egress filtering without the host's nftables: a network namespace of our own (in a new user
    # namespace without root) takes nft rules, and /dev/net/tun opens (pasta's link to it; pasta.py)
    netns_egress: bool = False
    # nft rules in this process's own network namespace (CAP_NET_ADMIN there: root on a host, or a container
    # granted NET_ADMIN): the egress rules by uid of the `full` and `chroot` modes can be installed
    host_nft: bool = False
    # device nodes can be made and opened (CAP_MKNOD, a filesystem without nodev, a device cgroup that lets
    # null through): a tree materialized as a directory gets real /dev nodes, else stand-ins (jail/trees/)
    mknod: bool = False
    # A time namespace per run (Linux >= 5.6, CAP_SYS_ADMIN and CAP_SYS_TIME over our user namespace, or
    # one of our own without root): its CLOCK_MONOTONIC and CLOCK_BOOTTIME start at zero (linux/timens.py)
    time_namespaces: bool = False
    # sethostname in a UTS namespace of one's own: podman's seccomp profile refuses it to a container without
    # CAP_SYS_ADMIN although it lets user namespaces through. Cosmetic: where refused, a run's uname() tells
    # the container's name (the children skip the step; jail/zygote/confine.py)
    hostname: bool = True
    # fs.protected_hardlinks is 1: nobody may hard-link a file they neither own nor may read and write. The chroot
    # mode's runs share the tree's files, and their /tmp is on the same filesystem: where it is 0 a run could link
    # them into its /tmp (their link count, seen by every run, would then carry what one run tells another)
    protected_hardlinks: bool = True
    errors: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["writable"] = list(self.writable)
        return data

    @classmethod
    def from_dict(cls, data: dict) -> Protections:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        known["writable"] = tuple(known.get("writable", ()))
        return cls(**known)

    @property
    def privileged(self) -> bool:
        """Root's full jail is possible: a uid per run, a mount namespace and a tree of our own."""
        return self.setuid and self.chroot and self.mount_namespaces

    @property
    def isolating_namespaces(self) -> bool:
        """Without root: a user namespace with mount, PID and network namespaces inside it."""
        return self.user_namespaces and self.mount_namespaces and self.pid_namespaces and self.net_namespaces


def _unshare_as_caller(flags: int) -> None:
    """New namespaces of these kinds: directly as root, inside a new user namespace otherwise."""
    if os.geteuid() != 0:
        flags |= syscalls.CLONE_NEWUSER
    syscalls.unshare(flags)


def _tree_steps() -> None:
    """What entering a tree takes (tree.build_and_enter, and each child's tmpfs /tmp), in a new mount
    namespace: a platform's filter may refuse one call alone (pivot_root, mount, umount2)."""
    uid, gid = os.geteuid(), os.getegid()
    _unshare_as_caller(syscalls.CLONE_NEWNS)
    if uid != 0:  # a user namespace's own ids, as a run's child maps them (namespaces.map_own_ids)
        proc = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY)
        namespaces.map_own_ids(proc, uid, gid)
    syscalls.mount(None, "/", None, syscalls.MS_REC | syscalls.MS_PRIVATE)
    # everything made below lives in this namespace's tmpfs over /tmp: nothing is left on the disk
    syscalls.mount("sandlot-probe", "/tmp", "tmpfs", syscalls.MS_NOSUID | syscalls.MS_NODEV, "size=64k,mode=755")
    root = "/tmp/root"
    os.mkdir(root)
    syscalls.mount("sandlot-probe", root, "tmpfs", syscalls.MS_NOSUID | syscalls.MS_NODEV, "size=64k,mode=755")
    for name in ("old", "etc", "tmp"):
        os.mkdir(os.path.join(root, name))
    syscalls.mount("/etc", root + "/etc", None, syscalls.MS_BIND | syscalls.MS_REC)
    syscalls.mount(
        None, root + "/etc", None, syscalls.MS_REMOUNT | syscalls.MS_BIND | syscalls.MS_RDONLY | syscalls.MS_NOSUID
    )
    syscalls.mount(
        "sandlot-tmp", root + "/tmp", "tmpfs", syscalls.MS_NOSUID | syscalls.MS_NODEV | syscalls.MS_NOEXEC, "size=64k"
    )
    syscalls.pivot_root(root, root + "/old")
    os.chdir("/")
    syscalls.umount2("/old", syscalls.MNT_DETACH)  # the throwaway namespace's mounts go with this child


def _hostname() -> None:
    _unshare_as_caller(syscalls.CLONE_NEWUTS)
    socket.sethostname("sandlot-probe")


def _seccomp() -> None:
    from runtimes.linux.libseccomp import pyseccomp

    syscalls.set_no_new_privs()
    flt = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    flt.add_rule(pyseccomp.ERRNO(errno.EPERM), "ptrace")
    flt.load()


def _landlock() -> int:
    abi = landlock.abi_version()
    # a domain must really be entered: it needs no_new_privs, set here or inherited where prctl is refused
    try:
        syscalls.set_no_new_privs()
    except OSError:
        pass
    landlock.restrict(abi, writable=(), devices=())
    return abi


def _chroot() -> None:
    os.chroot("/")


def probe_uid() -> int:
    """An id other than ours that this user namespace maps for uids and gids (a container's own map may lack
    65534): the ids the runs would get come from the same map (jail/service/uids.py). Found in the parent, before any
    probe child is forked (the user database's locks may be held by another thread at a fork)."""
    ids = IdMap.here()
    for uid in (PROBE_UID, PROBE_UID - 1):
        if uid != os.geteuid() and ids.covers(uid, uid + 1):
            return uid
    runs = [(first, end) for first, end in ids.free_runs() if not first <= os.geteuid() < end]
    return runs[0][0] if runs else PROBE_UID


_setuid_target: int | None = None  # set by probe() from probe_uid(), before the children are forked


def _setuid() -> None:
    uid = _setuid_target if _setuid_target is not None else probe_uid()
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


def _rlimits() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 64), min(hard, 64)))


_NO_CGROUP = "no cgroup hierarchy this process may create groups in"


def _cgroups() -> None:
    for base in _cgroup_bases():
        path = tempfile.mkdtemp(prefix="sandlot-probe-", dir=base)
        os.rmdir(path)
        return
    raise OSError(errno.EACCES, _NO_CGROUP)


def _netns_egress() -> None:
    _unshare_as_caller(syscalls.CLONE_NEWNET)
    nftables.run("table inet sandlot_probe {\n chain output {\n  type filter hook output priority 0;\n }\n}\n")
    try:
        os.close(os.open(TUN_DEVICE, os.O_RDWR | os.O_CLOEXEC))
    except OSError as exc:
        why = f"{TUN_DEVICE} (pasta needs it; Debian's udev makes it mode 0666): {exc.strerror}"
        raise OSError(exc.errno, why) from None


CAP_SETGID, CAP_SETUID, CAP_NET_ADMIN, CAP_SYS_CHROOT, CAP_MKNOD = 6, 7, 12, 18, 27


def _effective_capabilities() -> int:
    """This process's effective capability set (/proc/self/status CapEff), or all bits when it cannot be read."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        pass
    return -1


def _host_nft() -> None:
    # Without CAP_NET_ADMIN (a Lambda function, any uid but root) no rule of this network namespace can change:
    # said without loading libnftables and its libraries into the child and asking the kernel for its cache
    if not _effective_capabilities() >> CAP_NET_ADMIN & 1:
        raise PermissionError(
            errno.EPERM, "Operation not permitted: no CAP_NET_ADMIN, this network namespace's nftables are out of reach"
        )
    # one transaction that adds a table and deletes it again: nothing of it is ever in force
    name = f"sandlot_probe_{os.getpid()}"
    nftables.run(f"add table inet {name}\ndelete table inet {name}\n")


PROTECTED_HARDLINKS = "/proc/sys/fs/protected_hardlinks"


def hardlinks_protected(path: str = PROTECTED_HARDLINKS) -> bool:
    """Whether the kernel refuses a hard link to a file the caller neither owns nor may read and write (a kernel
    without the setting, or one that cannot be read, counts as no)."""
    try:
        with open(path) as file:
            return file.read().strip() == "1"
    except OSError:
        return False


NULL_DEVICE = (1, 3)  # the major and minor numbers of /dev/null


def _mknod() -> None:
    directory = tempfile.mkdtemp(prefix="sandlot-probe-")
    path = os.path.join(directory, "null")
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(*NULL_DEVICE))
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)  # nodev, or a device cgroup, refuses here
        try:
            os.write(fd, b"x")
        finally:
            os.close(fd)
    finally:
        if os.path.lexists(path):
            os.unlink(path)
        os.rmdir(directory)


def _time_namespaces() -> None:
    """A new time namespace with offsets, and a child in it that reads its clocks from zero."""
    syscalls.set_dumpable(True)  # a throwaway child: its /proc/self files must be its own to open for writing
    _unshare_as_caller(syscalls.CLONE_NEWTIME)
    with open("/proc/self/timens_offsets", "wb", buffering=0) as f:
        f.write(b"monotonic -%d 0\nboottime -%d 0\n" % (time.monotonic(), time.clock_gettime(time.CLOCK_BOOTTIME)))
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        os._exit(0 if time.clock_gettime(time.CLOCK_BOOTTIME) < 60 else 1)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise OSError("a process in a new time namespace still sees the machine's uptime")


def _writable(path: str) -> bool:
    try:
        fd, name = tempfile.mkstemp(prefix=".sandlot-probe-", dir=path)
    except OSError:
        return False
    os.close(fd)
    os.unlink(name)
    return True


# name -> what the child does; it succeeds when the call returns
_PROBES: dict[str, Callable[[], object]] = {
    "seccomp": _seccomp,
    "no_new_privs": syscalls.set_no_new_privs,
    "dumpable": lambda: syscalls.set_dumpable(False),
    "pdeathsig": lambda: syscalls.set_parent_death_signal(signal.SIGKILL),
    "user_namespaces": lambda: syscalls.unshare(syscalls.CLONE_NEWUSER),
    "mount_namespaces": _tree_steps,
    "pid_namespaces": lambda: _unshare_as_caller(syscalls.CLONE_NEWPID),
    "net_namespaces": lambda: _unshare_as_caller(syscalls.CLONE_NEWNET),
    "chroot": _chroot,
    "setuid": _setuid,
    "rlimits": _rlimits,
    "landlock": _landlock,
    "cgroups": _cgroups,
    "writable": lambda: [p for p in WRITABLE_CANDIDATES if _writable_here(p) and _writable(p)],
    "netns_egress": _netns_egress,
    "host_nft": _host_nft,
    "mknod": _mknod,
    "time_namespaces": _time_namespaces,
    "hostname": _hostname,
}


# what each of these needs in this process's effective capability set (the kernel checks it before anything else)
_NEEDS_CAPABILITY = {
    "setuid": {"CAP_SETGID": CAP_SETGID, "CAP_SETUID": CAP_SETUID},
    "chroot": {"CAP_SYS_CHROOT": CAP_SYS_CHROOT},
    "mknod": {"CAP_MKNOD": CAP_MKNOD},
    "host_nft": {"CAP_NET_ADMIN": CAP_NET_ADMIN},
}
# without root, each of these begins by creating a user namespace of its own (_unshare_as_caller)
_IN_A_USER_NAMESPACE = (
    "mount_namespaces",
    "pid_namespaces",
    "net_namespaces",
    "netns_egress",
    "time_namespaces",
    "hostname",
)


def _writable_here(path: str) -> bool:
    """Whether this process may make a file in path at all (permissions, a read-only mount); only where it may is a
    file really made (_writable). access(2) itself, which every platform lets through (the dynamic loader calls it
    as any program starts), not faccessat2, which old container profiles refused with EPERM (glibc calls it for
    effective ids): a refusal there would pass for a place not writable. Our processes' real and effective ids are
    the same (no setuid program starts them)."""
    return os.access(path, os.W_OK | os.X_OK)


def _cgroup_bases() -> list[str]:
    """The cgroup hierarchies _cgroups may try, of those this process may write to."""
    found = []
    for base in ("/sys/fs/cgroup/pids", "/sys/fs/cgroup"):
        hierarchy = base.endswith("/pids") or os.path.exists(os.path.join(base, "cgroup.controllers"))
        if hierarchy and _writable_here(base):
            found.append(base)
    return found


def _ruled_out(name: str, errors: dict[str, str], capabilities: int) -> str:
    """Why this mechanism cannot work here, said from this process's own state without a child, or "" (probe it).
    Only certain failures: what these checks pass is still probed in a child."""
    missing = [cap for cap, bit in _NEEDS_CAPABILITY.get(name, {}).items() if not capabilities >> bit & 1]
    if missing:
        return f"PermissionError: [Errno 1] Operation not permitted: no {' or '.join(missing)} (CapEff)"
    if name == "cgroups" and not _cgroup_bases():
        return f"PermissionError: [Errno 13] {_NO_CGROUP}"
    if name in _IN_A_USER_NAMESPACE and os.geteuid() != 0 and errors.get("user_namespaces"):
        return f"needs a user namespace of its own, which was refused: {errors['user_namespaces']}"
    return ""


def in_child(probe: Callable[[], object]) -> tuple[object, str]:
    """Run probe in a forked child; (its JSON-able value or None, why it failed: its exception, or the
    signal that killed it, as a refused call may)."""
    return _answer(*_fork_probe(probe), time.monotonic() + PROBE_SECONDS)


def _fork_probe(probe: Callable[[], object]) -> tuple[int, int]:
    """A child running probe, and the read end of the pipe its answer comes back on."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            os.close(read_end)
            try:
                value = probe()
                message = json.dumps({"ok": True, "value": value if value is not None else True})
            except BaseException as exc:  # noqa: BLE001 - reported to the parent
                message = json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
            os.write(write_end, message.encode())
        finally:
            os._exit(0)
    os.close(write_end)
    return pid, read_end


def _answer_raw(pid: int, read_end: int, deadline: float) -> tuple[bytes, str]:
    """What a forked child wrote to its pipe, read to its end (the child reaped), and why there is nothing to
    read where it did not answer: killed at the deadline, or by a signal."""
    data = b""
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([read_end], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)  # a wedged probe must not keep the service from starting
                os.waitpid(pid, 0)
                return b"", f"the probe did not answer in {PROBE_SECONDS} s"
            chunk = os.read(read_end, 65536)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(read_end)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return b"", f"the probe was killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return data, ""


def _answer(pid: int, read_end: int, deadline: float) -> tuple[object, str]:
    """The answer of a child _fork_probe started: its value, or why there is none."""
    data, error = _answer_raw(pid, read_end, deadline)
    if error:
        return None, error
    try:
        answer = json.loads(data)
    except ValueError:
        return None, "the probe exited without an answer"
    if not answer["ok"]:
        return None, answer["error"]
    return answer["value"], ""


def probe(at_once: bool = False) -> Protections:
    """Probe every mechanism, each in a child of its own (about 1 ms each). at_once: every child forked before
    the first answer is read, so that they run side by side (the service's probe ahead, below; each answer
    still a child of its own, read within PROBE_SECONDS)."""
    try:
        from runtimes.linux.libseccomp import pyseccomp  # noqa: F401 - imported here, never first in a forked child
    except ImportError:
        pass
    global _setuid_target
    _setuid_target = probe_uid()
    values: dict[str, object] = {}
    errors: dict[str, str] = {}
    capabilities = _effective_capabilities()

    def decided(name: str) -> tuple[object, str] | None:
        """What the process's own state answers without a child (with what was found so far), or None."""
        error = _ruled_out(name, errors, capabilities)
        if error:
            return None, error
        if name == "writable" and not any(_writable_here(path) for path in WRITABLE_CANDIDATES):
            return [], ""  # nowhere to try
        return None

    answers: dict[str, tuple[object, str]] = {}
    if at_once:  # what needs a child is forked before the first answer is read (no answer to rule on yet)
        answers = {name: answer for name in _PROBES if (answer := decided(name)) is not None}
        children = {name: _fork_probe(check) for name, check in _PROBES.items() if name not in answers}
        deadline = time.monotonic() + PROBE_SECONDS
        answers.update({name: _answer(pid, read_end, deadline) for name, (pid, read_end) in children.items()})
    for name, check in _PROBES.items():
        if name not in answers:  # one at a time: a refused user namespace rules out what needs one
            answers[name] = decided(name) or in_child(check)
        value, error = answers[name]
        if error:
            errors[name] = error
        values[name] = value
    return Protections(
        euid=os.geteuid(),
        seccomp=bool(values["seccomp"]),
        no_new_privs=bool(values["no_new_privs"]),
        dumpable=bool(values["dumpable"]),
        pdeathsig=bool(values["pdeathsig"]),
        user_namespaces=bool(values["user_namespaces"]),
        mount_namespaces=bool(values["mount_namespaces"]),
        pid_namespaces=bool(values["pid_namespaces"]),
        net_namespaces=bool(values["net_namespaces"]),
        chroot=bool(values["chroot"]),
        setuid=bool(values["setuid"]),
        rlimits=bool(values["rlimits"]),
        landlock=int(values["landlock"] or 0),
        cgroups=bool(values["cgroups"]),
        writable=tuple(values["writable"] or ()),
        netns_egress=bool(values["netns_egress"]),
        host_nft=bool(values["host_nft"]),
        mknod=bool(values["mknod"]),
        time_namespaces=bool(values["time_namespaces"]),
        hostname=bool(values["hostname"]),
        protected_hardlinks=hardlinks_protected(),
        errors=errors,
    )


_cached: Protections | None = None
_probing = threading.Lock()
_ahead: tuple[int, int] | None = None  # the probe started ahead (probe_ahead): its process, its pipe's read end


def platform_protections() -> Protections:
    """This process's record, probed on first use (or the one probe_ahead's child made). Runtimes start at
    once, each asking from a thread of its own: one probes, the others wait for its record. (Two probing at
    once would fork from one thread while the other's child, or the other thread itself, holds the loader's or
    a library's lock: a child forked then can wait on it forever.)"""
    global _cached
    with _probing:
        if _cached is None:
            _cached = _ahead_record() or probe()
    return _cached


def probe_ahead() -> bool:
    """Start this process's probe now, in a forked child, while this process goes on (`sandlot serve` loads its
    settings and code meanwhile): platform_protections() then reads that child's record. The child has this
    process's credentials, namespaces, filters and limits, so its record is the one this process would probe;
    it forks its own probe children all at once (probe(at_once=True)). Only while this process has one
    thread (a fork then copies no lock another thread holds); False where it did not start."""
    global _ahead
    if _ahead is not None or _cached is not None or threading.active_count() > 1:
        return False
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            os.close(read_end)
            try:
                syscalls.set_parent_death_signal(signal.SIGKILL)  # no prober outlives a service killed meanwhile
            except OSError:
                pass
            data = json.dumps(probe(at_once=True).to_dict()).encode()
            while data:
                data = data[os.write(write_end, data) :]
        finally:
            os._exit(0)
    os.close(write_end)
    _ahead = (pid, read_end)
    return True


def cancel_ahead() -> None:
    """End the probe probe_ahead started, if its record was never read (a start that stopped early): no process
    of it is left (its own probe children end with it, their parent-death signal or their probe)."""
    global _ahead
    if _ahead is None:
        return
    (pid, read_end), _ahead = _ahead, None
    os.close(read_end)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.waitpid(pid, 0)


def _ahead_record() -> Protections | None:
    """The record of the probe started ahead, once it has written it; None where there is none (none was
    started, or it gave no record: the caller then probes in this process)."""
    global _ahead
    if _ahead is None:
        return None
    (pid, read_end), _ahead = _ahead, None
    # every probe child answers within PROBE_SECONDS; the prober's own start and its record, a few more
    data, _error = _answer_raw(pid, read_end, time.monotonic() + PROBE_SECONDS + 10)
    try:
        return Protections.from_dict(json.loads(data))
    except (ValueError, TypeError):
        return None
