"""Which jail a runtime uses: one record per mode of what each isolation mechanism is.

A mode is a row of settings, one per mechanism, in the manner of nsjail: the
zygote, the child and the runtime read the fields (how the tree is entered, how
a run's processes are ended, what /tmp is, whose uid a run has, how egress is
filtered), never the mode's name. Adding a mode adds a row here.

- `full`: root. A uid per run from the instance's block; a PID, mount, IPC and
  UTS namespace per run (the run is its pid 1: its end takes every process of
  the namespace with it); the bind-mounted read-only tree entered by pivot_root; a capped
  noexec tmpfs /tmp; nft egress rules matching the block's uids.
- `userns`: no root needed (and, as root, the zygote drops to a uid of the block
  before any child exists). Each run has a user namespace of its own with PID,
  mount and IPC namespaces inside it; runs share one uid, and what separates
  them is that no run can name, reach or open another process. Without root the
  runs' network is a namespace per zygote with pasta (linux/pasta.py); as root,
  nft by uid.
- `chroot`: root without namespaces (a container on default privileges: no
  SYS_ADMIN, Docker's seccomp profile refusing unshare, mount and clone with
  CLONE_NEW*). A uid per run from the instance's block; the zygote chroots once
  into the tree materialized as a real directory (runtimes/jail/trees/tree_store.py); a /tmp
  directory of the run's own in it, capped by RLIMIT_FSIZE and the service's
  watcher (tmp/caps.py); every process of a run ended through pidfds and a sweep
  of its uid before the uid goes back; nft egress by uid where NET_ADMIN is
  granted, else none (SANDLOT_UNFILTERED_EGRESS says what runs asking for
  network get: policy/network_access.py).
- `landlock`: no root, no capabilities, no user namespaces (a pod under Kubernetes'
  `restricted` standard or OpenShift's `restricted-v2`). Runs share the
  service's uid; each lives in a Landlock domain of its own (landlock_mode.py):
  reads only of the interpreter, the layer and the libraries they need, writes
  only to the run's own /tmp directory; signals and abstract unix sockets kept
  inside the domain by Landlock's scopes (ABI 6), or by the seccomp filter
  where the kernel has none; no ptrace of, nor /proc/<pid> access to, any
  process outside it. Otherwise as `chroot`: seccomp with fork refused, rlimits,
  the /tmp watcher's caps, no egress filter (SANDLOT_UNFILTERED_EGRESS).
- `single`: no identity or namespace of the run's own at all (AWS Lambda). Only
  for one run at a time (the serial schedule): nothing of a run is left when the
  next one starts.

SANDLOT_JAIL: `auto` (the first row this platform can give, in the order of
AUTO_ORDER), or a mode's name (`reduced` is userns's older name). A mode the
platform cannot give is refused with the reason, never weakened.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from runtimes.linux import syscalls

if TYPE_CHECKING:  # the record is read, never made here: the zygote, which imports this, never loads the probe
    from runtimes.linux.protections import Protections

# tree: what a run sees as /
PIVOT = "pivot"  # a mount namespace, the tree bind-mounted read-only, pivot_root into it
CHROOT = "chroot"  # chroot into the tree materialized as a real directory (no mounts)
NO_TREE = "none"  # the platform's own filesystem (Landlock narrows writes where it can)
# processes: how every process of a run is ended
PID_NAMESPACE = "pid_namespace"  # the run is pid 1 of its own: when it ends, the kernel kills the rest
UID_SWEEP = "uid_sweep"  # pidfds, and a sweep of the run's uid
# tmp: the run's writable place
TMPFS = "tmpfs"  # a size- and inode-capped noexec tmpfs on /tmp, in the run's mount namespace
DIRECTORY = "directory"  # a directory of the run's own, removed after it
# identity: whose uid a run has
UID_PER_RUN = "uid_per_run"  # a uid of the instance's block, never shared with a live process of another run
USER_NAMESPACE = "user_namespace"  # one uid for all runs, each in a user namespace of its own
SHARED = "shared"  # the runtime's own uid
# egress: how a run with network is kept from the host and private ranges
NFT_UID = "nft_uid"  # nft rules on the host matching the runs' uids (egress.py)
NETNS_PASTA = "netns_pasta"  # a network namespace per zygote, out through pasta (linux/pasta.py)
NO_EGRESS_FILTER = "none"
# reads: what a run's Landlock domain lets it read, where the platform gives Landlock
EVERYTHING = "everything"  # the whole tree (or the platform's filesystem)
TREE_ONLY = "tree_only"  # only what the runtime's tree would hold (landlock_mode.py), and seccomp for the rest


@dataclass(frozen=True)
class Mode:
    name: str
    tree: str
    processes: str
    tmp: str
    identity: str
    egress: str
    needs: tuple[str, ...] = ()  # fields of the protections record the mode cannot do without
    needs_root: bool = False
    serial_only: bool = False  # may only serve one run at a time, nothing of it left before the next
    reads: str = EVERYTHING

    @property
    def narrow_domain(self) -> bool:
        """Each run's Landlock domain allows only what its tree would hold, and a seccomp filter refuses what
        Landlock at the kernel's ABI does not (landlock_mode.py): runs share the service's uid."""
        return self.reads == TREE_ONLY

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Mode:
        return cls(**{**data, "needs": tuple(data.get("needs", ()))})

    @property
    def own_tmp(self) -> bool:
        """A literal /tmp is the run's own (a tmpfs of its mount namespace, or its directory in the tree). Without a
        tree (`landlock`, `single`) /tmp is the platform's: a run writes under its own directory (its working
        directory and TMPDIR) instead, the only place its Landlock domain, where there is one, lets it write."""
        return self.tree != NO_TREE

    @property
    def tmp_note(self) -> str:
        """What a run's error printing adds to a refused write under a literal /tmp where it is not the run's own
        ({tmpdir}: the run's directory, filled in by the runner); "" where it is. The same words in both
        languages (runtimes/python/runner.py, runtimes/nodejs/wrapper.js)."""
        if self.own_tmp:
            return ""
        return (
            f"sandlot: /tmp is not writable in the {self.name} jail; "
            "write under the working directory (TMPDIR={tmpdir}) instead"
        )

    @property
    def pid_namespace(self) -> bool:
        return self.processes == PID_NAMESPACE

    @property
    def own_uid(self) -> bool:
        return self.identity == UID_PER_RUN

    @property
    def shares_uid(self) -> bool:
        """Runs have the runtime's own uid: what a run leaves is told apart from the runtime's only by time."""
        return self.identity == SHARED

    @property
    def clone_flags(self) -> int:
        """The namespaces a child is forked into besides its PID namespace (zygote._fork)."""
        flags = 0
        if self.tree == PIVOT:
            flags |= syscalls.CLONE_NEWNS | syscalls.CLONE_NEWIPC | syscalls.CLONE_NEWUTS
        if self.identity == USER_NAMESPACE:
            flags |= syscalls.CLONE_NEWUSER
        return flags


FULL = Mode(
    "full",
    tree=PIVOT,
    processes=PID_NAMESPACE,
    tmp=TMPFS,
    identity=UID_PER_RUN,
    egress=NFT_UID,
    needs=("setuid", "chroot", "mount_namespaces", "pid_namespaces", "pdeathsig", "no_new_privs"),
    needs_root=True,
)
USERNS = Mode(
    "userns",
    tree=PIVOT,
    processes=PID_NAMESPACE,
    tmp=TMPFS,
    identity=USER_NAMESPACE,
    egress=NETNS_PASTA,  # as root: NFT_UID (resolved by select)
    needs=("user_namespaces", "mount_namespaces", "pid_namespaces", "pdeathsig", "no_new_privs"),
)
CHROOT_MODE = Mode(
    "chroot",
    tree=CHROOT,
    processes=UID_SWEEP,
    tmp=DIRECTORY,
    identity=UID_PER_RUN,
    egress=NFT_UID,  # where the egress rules cannot be installed (no NET_ADMIN): NO_EGRESS_FILTER (select)
    # seccomp too: without namespaces it alone keeps a run from making processes and, without egress rules,
    # from the network (opting out of it never leaves a run with the host's network and nothing else)
    needs=("setuid", "chroot", "seccomp", "pdeathsig", "no_new_privs"),
    needs_root=True,
)
SINGLE = Mode(
    "single",
    tree=NO_TREE,
    processes=UID_SWEEP,
    tmp=DIRECTORY,
    identity=SHARED,
    egress=NO_EGRESS_FILTER,
    serial_only=True,
)

LANDLOCK_MODE = Mode(
    "landlock",
    tree=NO_TREE,
    processes=UID_SWEEP,  # a run is one process (seccomp refuses fork): its pidfd ends it
    tmp=DIRECTORY,
    identity=SHARED,
    egress=NO_EGRESS_FILTER,
    # Landlock itself (its ABI decides what else the seccomp filter must refuse: landlock_mode.py), and
    # seccomp, without which a run sharing the service's uid could fork past every pidfd and signal it
    needs=("landlock", "seccomp", "pdeathsig", "no_new_privs"),
    reads=TREE_ONLY,
)

MODES = {mode.name: mode for mode in (FULL, USERNS, CHROOT_MODE, SINGLE, LANDLOCK_MODE)}
# what `auto` tries, strongest first (`single` before `landlock`: it only ever serves one run at a time, where
# nothing of a run is left when the next starts; `landlock` is the one that serves many runs sharing a uid)
AUTO_ORDER = (FULL, USERNS, CHROOT_MODE, SINGLE, LANDLOCK_MODE)
ALIASES = {"reduced": USERNS.name}
CHOICES = ("auto", *MODES, *ALIASES)


class JailRefused(RuntimeError):
    """This platform cannot give the jail asked for: runs are refused, and this says why."""


def missing(mode: Mode, record: Protections) -> list[str]:
    """What the platform lacks for mode, each with the probe's reason; [] when it can be had."""
    lacking = []
    if mode.needs_root and record.euid != 0:
        lacking.append("root")
    for name in mode.needs:
        if not getattr(record, name):
            lacking.append(f"{name} ({record.errors.get(name, 'not available')})")
    return lacking


def _refusal(mode: Mode, record: Protections, serial: bool) -> str:
    """Why mode cannot serve here, or ""."""
    if mode.serial_only and not serial:
        return (
            f"SANDLOT_JAIL={mode.name} gives runs no identity or namespace of their own: it may only serve "
            "one run at a time (a Lambda function), never many tenants at once"
        )
    if mode.identity == SHARED and record.euid == 0:
        return f"SANDLOT_JAIL={mode.name} as root would run user code as root: use full or userns"
    lacking = missing(mode, record)
    if lacking:
        needs = ", ".join((("root",) if mode.needs_root else ()) + mode.needs)
        return f"SANDLOT_JAIL={mode.name} needs {needs}; missing: {'; '.join(lacking)}"
    return ""


def _resolved(mode: Mode, record: Protections) -> Mode:
    """The row as it runs here: a namespaced jail started as root filters egress on the host, by uid; a chroot
    jail without the right to install nft rules (no NET_ADMIN) filters none."""
    if mode.egress == NETNS_PASTA and record.euid == 0:
        return dataclasses.replace(mode, egress=NFT_UID)
    if mode.tree == CHROOT and mode.egress == NFT_UID and not record.host_nft:
        return dataclasses.replace(mode, egress=NO_EGRESS_FILTER)
    return mode


def select(requested: str, record: Protections, serial: bool) -> Mode:
    """The mode to use, or JailRefused saying why none can serve.

    serial: runs are served one at a time, nothing of one left before the next (a Lambda function).
    """
    name = ALIASES.get(requested, requested)
    if name != "auto":
        if name not in MODES:
            raise JailRefused(f"unknown SANDLOT_JAIL value {requested!r}: one of {', '.join(CHOICES)}")
        why = _refusal(MODES[name], record, serial)
        if why:
            raise JailRefused(why)
        return _resolved(MODES[name], record)
    for mode in AUTO_ORDER:
        if not _refusal(mode, record, serial):
            return _resolved(mode, record)
    full, userns, chroot = (", ".join(missing(m, record)) for m in (FULL, USERNS, CHROOT_MODE))
    landlock = _refusal(LANDLOCK_MODE, record, serial).partition("missing: ")[2] or "as root"
    raise JailRefused(
        f"no jail that keeps tenants apart is possible here: neither root ({full or 'not root'}) nor user "
        f"namespaces ({userns}) nor root's chroot ({chroot}) nor Landlock ({landlock}); refusing to serve many "
        "tenants with nothing between them"
    )
