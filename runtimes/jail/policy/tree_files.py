"""The files of a run's tree that are the jail's own, not the host's: its hostname, hosts file and resolv.conf,
where the layer shows, and where each uid's cell is (the chroot mode).

The host's `/etc/hosts` names the host (and whatever else its administrator put there), so a run's tree holds
one that knows only localhost and the run's own hostname; the host's `/etc/resolv.conf` tells its search
domains and options, so a run's holds only the `nameserver` lines of the resolvers its egress lets it reach, or
none (`run_system_files`). Read by the service (the tree's spec) and by the zygote (the hostname, a cell's path).
"""

from __future__ import annotations

import os

from runtimes.linux.rootfs import SYSTEM_FILES, TreeSpec

LAYER_IN_TREE = "/opt/sandlot/layer"  # where a runtime's dependency layer shows in its tree, whatever the data dir
RUN_HOSTNAME = "sandbox"  # what uname() tells a run (zygote/confine.py sets it in the run's UTS namespace)
# The run's /etc/hosts: loopback for localhost and for its own hostname, so that resolving
# gethostname() works as on any machine; nothing of the host's.


def run_hosts(hostname: str = RUN_HOSTNAME) -> str:
    """A run's /etc/hosts: localhost and the name uname() tells it, on both loopbacks, nothing else."""
    return f"127.0.0.1\tlocalhost {hostname}\n::1\tlocalhost ip6-localhost ip6-loopback {hostname}\n"


RUN_HOSTS = run_hosts()


# What a run's resolv.conf says where its runs have no resolver to reach
NO_RESOLVER = "# no resolver: runs here have no DNS (no network, or network only through the proxy)\n"


def run_resolv_conf(nameservers: tuple[str, ...] | list[str]) -> str:
    """A run's /etc/resolv.conf: one `nameserver` line per resolver it may reach, nothing else of the host's
    (no search domain, no options); a comment alone where it may reach none."""
    if not nameservers:
        return NO_RESOLVER
    return "".join(f"nameserver {server}\n" for server in nameservers)


# The time zones "with leap seconds" (tzdata's right/: 619 of zoneinfo's 1,300 names, nearly half of the Node.js
# tree's and a sixth of the Python tree's): no zone a program names by its usual key, and left out of
# zoneinfo.available_timezones() by Python itself. A run sees an empty directory there; each tree, and in the chroot
# jail each cell, is that many names lighter (copied at every container's start, and held in the kernel's memory).
HIDDEN_ZONES = ("/usr/share/zoneinfo/right",)


def run_system_files(spec: TreeSpec, hostname: str = RUN_HOSTNAME, nameservers: tuple[str, ...] = ()) -> None:
    """What every run's tree holds of the system: certificates, name service and time zone files from
    the host (but HIDDEN_ZONES), and a hosts file (run_hosts) and resolv.conf (run_resolv_conf) of its own instead
    of the host's."""
    spec.add(*(path for path in SYSTEM_FILES if path not in ("/etc/hosts", "/etc/resolv.conf")))
    spec.hidden.extend(path for path in HIDDEN_ZONES if os.path.isdir(path) and path not in spec.hidden)
    spec.generate("/etc/hosts", run_hosts(hostname))
    spec.generate("/etc/resolv.conf", run_resolv_conf(nameservers))


CELLS = "/cells"  # each uid's cell: the tree again, its directories made and its files hard links (make_cell)


def cell(uid: int) -> str:
    """The root a run of uid chroots into, as its zygote (chrooted into the tree) names it."""
    return f"{CELLS}/{uid}"
