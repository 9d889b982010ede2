"""Runs with network through the operator's proxy, where egress cannot be filtered by address (SANDLOT_PROXY_EGRESS).

Without NET_ADMIN (a container on default privileges: the chroot jail) or without root at all (a restricted
pod: the landlock jail), no rule can tell a run's packets from the service's, so runs asking for network
get none (SANDLOT_UNFILTERED_EGRESS). Dify's compose gives the sandbox no direct way out anyway: its
HTTP_PROXY and HTTPS_PROXY point at Dify's ssrf_proxy (squid, port 3128). Landlock (ABI 4+) can limit a
process's TCP connect to given ports, whatever the address, so with a proxy configured a run's domain allows:

- TCP connect to the proxies' ports only (the ports of HTTP_PROXY, HTTPS_PROXY and SOCKS5_PROXY), on any
  address the container reaches: whatever listens on such a port elsewhere is reachable too, which the
  health detail says;
- no UDP (a seccomp filter of this module stacked on the runner's: socket(SOCK_DGRAM) refused) and no
  other socket family (the runner's allow-list: IPv4 and IPv6 only; unix sockets: socketpair only), so no
  DNS: the proxy's address is handed to the run already resolved, in the proxy variables of its environment
  (the proxy resolves the names it is asked for);
- no TCP bind (every Landlock domain of the jail: landlock.py);
- no getsockname (the same stacked filter: EPERM): a socket connected to the proxy would tell the run the
  container's own address. Nothing else tells it: getpeername names the proxy, which the run was given; no
  socket option returns the local address; interface ioctls, netlink and /proc are refused already.

`auto` (default) turns this on where a proxy is configured, the jail's egress is not filtered (chroot
without NET_ADMIN, landlock) and SANDLOT_UNFILTERED_EGRESS is not `allow`; `on` also where
SANDLOT_UNFILTERED_EGRESS=allow (and refuses runs with network, saying why, where it cannot be had: no
proxy, or a Landlock ABI below 4); `off` never.
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

AUTO = "auto"
ON = "on"
OFF = "off"
CHOICES = (AUTO, ON, OFF)
NETWORK_ABI = 4  # LANDLOCK_ACCESS_NET_CONNECT_TCP
PROXY_VARIABLES = ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")


@dataclass(frozen=True)
class ProxyEgress:
    """What runs with network may reach: the proxies' ports, and their environment's proxy variables."""

    ports: tuple[int, ...] = ()
    env: dict[str, str] = field(default_factory=dict)  # the proxy variables, their hosts resolved
    endpoints: tuple[str, ...] = ()  # "address:port", for the health detail
    refused: str = ""  # why it cannot be had ("" when it can)

    @property
    def description(self) -> str:
        ports = ", ".join(str(p) for p in self.ports)
        return (
            f"runs asking for network reach only the proxy ({', '.join(self.endpoints)}): TCP connect to port "
            f"{ports} on any address the container reaches (whatever listens on that port elsewhere too); no "
            "UDP, no DNS (the proxy's address is given resolved), no other socket family, no bind, no getsockname "
            "(the container's own address)"
        )


def choose(setting: str, proxies: dict[str, str], landlock_abi: int, unfiltered_egress: str) -> ProxyEgress | None:
    """For a jail whose egress is not filtered: proxy egress, or None where the setting leaves it off."""
    if setting not in CHOICES:
        raise ValueError(f"SANDLOT_PROXY_EGRESS={setting!r}: one of {', '.join(CHOICES)}")
    if setting == OFF:
        return None
    configured = {k: v for k, v in proxies.items() if k in PROXY_VARIABLES and v}
    if setting == AUTO and (not configured or unfiltered_egress == "allow"):
        return None
    if not configured:
        return ProxyEgress(refused="SANDLOT_PROXY_EGRESS=on needs HTTP_PROXY, HTTPS_PROXY or SOCKS5_PROXY")
    if landlock_abi < NETWORK_ABI:
        return ProxyEgress(
            refused=f"network through the proxy needs Landlock ABI {NETWORK_ABI} or later (TCP port rules; "
            f"Linux 6.7); this kernel gives ABI {landlock_abi}"
        )
    env: dict[str, str] = {}
    ports: list[int] = []
    endpoints: list[str] = []
    for name, url in configured.items():
        try:
            resolved, address, port = _resolve(url)
        except OSError as exc:
            return ProxyEgress(refused=f"the proxy in {name} ({url}) cannot be resolved: {exc}")
        env[name] = resolved
        if port not in ports:
            ports.append(port)
        if f"{address}:{port}" not in endpoints:
            endpoints.append(f"{address}:{port}")
    return ProxyEgress(tuple(ports), env, tuple(endpoints))


def _resolve(url: str) -> tuple[str, str, int]:
    """(url with its host replaced by its first TCP address, that address, the port)."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if not parts.hostname:
        raise OSError(errno.EINVAL, "no host")
    port = parts.port or (1080 if parts.scheme.startswith("socks") else 80)
    infos = socket.getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    address = infos[0][4][0]
    host = f"[{address}]" if ":" in address else address
    credentials = parts.netloc.rpartition("@")[0]
    netloc = f"{credentials}@{host}:{port}" if credentials else f"{host}:{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment)), address, port


def udp_refused():
    """The filter each child stacks where proxy egress is in force: no datagram socket (UDP), of any family, and
    no getsockname (a socket connected to the proxy would name the container's own address)."""
    from runtimes.jail.policy.allowlist import SOCK_DGRAM, SOCK_TYPE_MASK
    from runtimes.linux.libseccomp import pyseccomp

    flt = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    flt.add_rule(
        pyseccomp.ERRNO(errno.EPERM), "socket", pyseccomp.Arg(1, pyseccomp.MASKED_EQ, SOCK_TYPE_MASK, SOCK_DGRAM)
    )
    flt.add_rule(pyseccomp.ERRNO(errno.EPERM), "getsockname")
    return flt
