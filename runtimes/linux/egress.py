"""Egress rules for runs with network: the outside, and nothing of the host or its networks.

An nftables table per uid block matches the socket owner's uid, so it applies
to the runs of this instance and nothing else. Refused: loopback, link-local
(cloud metadata), private, shared, documentation, benchmarking, multicast and
reserved ranges, the IPv6 prefixes that embed IPv4 addresses (NAT64, 6to4,
Teredo), and every address of the host itself: the kernel's routing table
decides (`fib daddr type local`), so an address the host gains after start is
refused too, Sandlot's own port and services bound to 0.0.0.0 included. The
resolvers of resolv.conf (port 53) and the configured proxies stay reachable;
operators can allow more ranges. Without nft the rules are not in force, and the
health detail says so. Without root the same rules (`egress_rules`) hold every
socket of a network namespace of the runs' own instead (pasta.py).
"""

from __future__ import annotations

import ipaddress
import logging
import shutil
import socket
import subprocess
from urllib.parse import urlsplit

log = logging.getLogger("sandlot.jail")

# IANA's special-purpose registries: nothing here is an ordinary host on the internet.
DENIED_V4 = (
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.0.2.0/24",
    "192.88.99.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "198.51.100.0/24",
    "203.0.113.0/24",
    "224.0.0.0/4",
    "240.0.0.0/4",
)
DENIED_V6 = (
    "::/128",
    "::1/128",
    "::ffff:0:0/96",
    "64:ff9b::/96",
    "64:ff9b:1::/48",
    "100::/64",
    "2001::/23",
    "2001:db8::/32",
    "2002::/16",
    "fc00::/7",
    "fe80::/10",
    "fec0::/10",
    "ff00::/8",
)
# The host's own addresses, whatever they are now: its routing table knows them.
HOST_ADDRESS_TYPES = "local, broadcast, anycast, multicast"


def resolvers(path: str = "/etc/resolv.conf") -> list[str]:
    found = []
    try:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 2 and parts[0] == "nameserver":
                    found.append(parts[1])
    except OSError:
        pass
    return found


def proxy_endpoints(urls: list[str]) -> list[tuple[str, int]]:
    endpoints = []
    for url in urls:
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if not parts.hostname:
            continue
        port = parts.port or (1080 if parts.scheme.startswith("socks") else 80)
        try:
            for info in socket.getaddrinfo(parts.hostname, port, proto=socket.IPPROTO_TCP):
                endpoints.append((info[4][0], port))
        except OSError:
            log.warning("egress: cannot resolve proxy %s", parts.hostname)
    return endpoints


def normalise(allow: tuple[str, ...]) -> list[str]:
    return [str(ipaddress.ip_network(a, strict=False)) for a in allow]


def _family(address: str) -> str:
    return "ip" if ipaddress.ip_network(address, strict=False).version == 4 else "ip6"


def egress_rules(
    match: str, allow: list[str], proxies: list[tuple[str, int]], host_addresses: tuple[str, ...] = ()
) -> list[str]:
    """The output chain's rules, each prefixed with `match` (which sockets they apply to; "" for all).

    host_addresses: addresses of the host to refuse by name too, for a network namespace of the runs'
    own, where the host's addresses are not "local" (runtimes/linux/pasta.py).
    """
    prefix = f"{match} " if match else ""
    rules = [f"{prefix}ct state established,related accept"]
    for server in resolvers():
        fam = _family(server)
        rules.append(f"{prefix}{fam} daddr {server} udp dport 53 accept")
        rules.append(f"{prefix}{fam} daddr {server} tcp dport 53 accept")
    for address, port in proxies:
        rules.append(f"{prefix}{_family(address)} daddr {address} tcp dport {port} accept")
    for network in allow:
        rules.append(f"{prefix}{_family(network)} daddr {network} accept")
    rules.append(f"{prefix}fib daddr type {{ {HOST_ADDRESS_TYPES} }} reject")
    rules.append(f"{prefix}ip daddr {{ {', '.join(DENIED_V4)} }} reject")
    rules.append(f"{prefix}ip6 daddr {{ {', '.join(DENIED_V6)} }} reject")
    for version, family in ((4, "ip"), (6, "ip6")):
        own = sorted({a for a in host_addresses if ipaddress.ip_address(a).version == version})
        if own:
            rules.append(f"{prefix}{family} daddr {{ {', '.join(own)} }} reject")
    return rules


def output_table(name: str, rules: list[str]) -> str:
    """An nftables table with one output chain holding rules (accept by default)."""
    body = "\n".join(f"    {rule}" for rule in rules)
    return (
        f"table inet {name} {{\n  chain output {{\n"
        f"    type filter hook output priority 0; policy accept;\n{body}\n  }}\n}}\n"
    )


class EgressFilter:
    def __init__(self, first_uid: int, last_uid: int, allow: tuple[str, ...] = (), proxies: tuple[str, ...] = ()):
        self.table = f"sandlot_{first_uid}"
        self.uids = f"{first_uid}-{last_uid}"
        self.allow = normalise(allow)
        self.proxies = list(proxies)
        self.installed = False
        self.error = ""  # why install() failed

    def ruleset(self) -> str:
        return output_table(
            self.table, egress_rules(f"meta skuid {self.uids}", self.allow, proxy_endpoints(self.proxies))
        )

    def replacing_ruleset(self) -> str:
        """ruleset() replacing this table where it is already there (`table` adds it only where it is not)."""
        return f"table inet {self.table}\ndelete table inet {self.table}\n{self.ruleset()}"

    def install(self) -> bool:
        nft = shutil.which("nft")
        if nft is None:
            self.error = "nft is not installed (apt-get install nftables)"
            log.warning("egress filter not in force: %s", self.error)
            return False
        # one nft, one transaction: the table a crashed instance of this uid block may have left is replaced
        result = subprocess.run([nft, "-f", "-"], input=self.replacing_ruleset(), capture_output=True, text=True)
        if result.returncode != 0:
            self.error = f"nft refused the rules: {result.stderr.strip()}"
            log.warning("egress filter not in force: %s", self.error)
            self.remove(quiet=True)  # nothing of the transaction is in force: nor is a crashed instance's table
            return False
        self.installed = True
        return True

    def remove(self, quiet: bool = False) -> None:
        nft = shutil.which("nft")
        if nft and (self.installed or quiet):
            subprocess.run([nft, "delete", "table", "inet", self.table], capture_output=True)
        self.installed = False
