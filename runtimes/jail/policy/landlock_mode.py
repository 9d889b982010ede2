"""The `landlock` mode's domain: what a run sharing the service's uid may read; what its ABI leaves to seccomp.

Without root, capabilities or user namespaces (a pod under Kubernetes' `restricted` standard) every run has
the service's own uid, so the kernel's ownership checks separate nothing: a run could open the service's data
dir, its keys, the layers' build directories and the other runs' files, all of them its uid's. Each run
therefore enters a Landlock domain of its own (landlock.py) that allows

- reading and executing only what its runtime's tree would hold (the interpreter, its standard library, the
  layer, the shared libraries they load, the certificate, resolver and time zone files: `readable`), not the
  service's own code (the zygote imported what its children run before any of them was confined, and a
  run's modules name no path of the install: zygote.hide_install_paths), but for Node's wrapper;
- writing only to the run's own /tmp directory (and the null and random devices);

and nothing else of the filesystem: not /proc (no listing of processes, no /proc/<pid> of the service or of
another run), not /dev/shm, not the data dir. Landlock's ptrace rule keeps every process outside the domain
from being traced, or having its memory, descriptors or environment opened, by the run.

What Landlock does not check, the seccomp filter of the runner refuses (`allowlist.shared_uid_rules`):

- at every ABI: a file's mode, times, owner and extended attributes, by path and through a descriptor alike
  (Landlock has no right for them, and every file a run can open is the uid's: one run's `fchmod(fd, 0)` on
  the layer's `requests/__init__.py` broke `import requests` for every later tenant, and mode bits and times
  would carry data from one tenant to the next); a directory made without its owner's read and search bits
  (mkdir's mode, or a umask masking them: the service, with the same uid and no capability, must list it to
  cap and remove it); and growing a pipe (F_SETPIPE_SZ: pipe buffers are counted per uid, and one run could
  take the whole 64 MiB of it, leaving every new pipe of the uid 8 KiB);
- below ABI 3: truncate by path (no TRUNCATE right: a run could empty any file of its uid it can name);
- below ABI 6 (no scopes): signals to any other pid (the signal fence every child loads already refuses
  them) and any AF_UNIX socket but socketpair (the allow-list already refuses them), both restated there.

Where even that cannot be had (no Landlock, no seccomp) the mode is refused with what was found (modes.py).
"""

from __future__ import annotations

from runtimes.linux.rootfs import TreeSpec

# system files an interpreter opens where the pivoted tree would have none, and fails on "permission denied"
# where it tolerates "no such file" (node: OpenSSL's configuration)
SYSTEM_CONFIG = ("/etc/ssl/openssl.cnf",)
MINIMUM_ABI = 1  # filesystem rules; what a later ABI adds, seccomp stands in for (above)
SCOPES_ABI = 6
TRUNCATE_ABI = 3
NETWORK_ABI = 4


def readable(spec: TreeSpec) -> list[str]:
    """What a run may read and execute: what its runtime's tree holds (the generated hosts file: the host's;
    the generated resolv.conf: the host's where it names a resolver, i.e. where runs have the host's network
    unfiltered, else none: nothing to resolve with, and the host's search domains stay unread)."""
    paths = [*spec.binds, *spec.placed.values(), *SYSTEM_CONFIG]
    if "/etc/hosts" in spec.generated:
        paths.append("/etc/hosts")
    if "nameserver" in spec.generated.get("/etc/resolv.conf", ""):
        paths.append("/etc/resolv.conf")
    return list(dict.fromkeys(paths))


def what_seccomp_adds(abi: int) -> list[str]:
    """For the health detail: what the seccomp filter holds in this mode that Landlock at this ABI does not."""
    held = [
        "a file's mode, times, owner and extended attributes, by path and by descriptor",
        "directories its owner cannot list (mkdir's mode, the umask)",
        "pipes grown past their default size (buffers counted per uid)",
    ]
    if abi < TRUNCATE_ABI:
        held.append("truncate by path")
    if abi < SCOPES_ABI:
        held.append("signals to other pids and AF_UNIX sockets but socketpair (no Landlock scopes)")
    return held


def needs_seccomp(abi: int) -> str:
    return (
        "SANDLOT_JAIL=landlock needs the seccomp filter (SANDLOT_REQUIRE_SECCOMP=true): runs share the service's "
        f"uid, and only the filter keeps them from forking past their pidfd and from what Landlock ABI {abi} "
        "does not check"
    )


def health(abi: int) -> dict:
    """The health detail's fields for this mode."""
    return {
        "landlock_domain": "per run: reads only the runtime's tree, writes only its own /tmp",
        "landlock_scopes": abi >= SCOPES_ABI,
        "seccomp_holds": what_seccomp_adds(abi),
    }


NO_EGRESS_FILTER = (
    "runs share the service's uid and network namespace: no egress rule can tell their packets from the "
    "service's (no root, no NET_ADMIN, no network namespace)"
)
