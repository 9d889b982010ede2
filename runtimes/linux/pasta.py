"""Network for the runs of a zygote without root: a namespace of their own, egress through pasta, nft inside.

Without root the host's nftables are out of reach (egress.py's table needs CAP_NET_ADMIN on the
host), and a run in the host's network stack could reach its loopback, its own addresses and
its private networks. So a `userns` zygote without root unshares a network namespace with its
user namespace (zygote/loop.py, `enter_tree`); all its children, and so every run, live in it. There:

- the zygote installs the egress rules while it holds CAP_NET_ADMIN in its own user namespace
  (nftables.py): the same refusals as root's (egress.py), for every socket of the namespace, plus
  the host's own addresses by name, read when the zygote starts (in the namespace only the one
  address pasta copies is "local");
- the service then starts pasta (Debian package `passt`) attached to the zygote's user and network
  namespaces. pasta gives the namespace a tap interface with the host's address and routes and
  carries each TCP/UDP flow out through an ordinary socket of its own on the host. Nothing is
  forwarded into the namespace (`-t none -u none`), nothing from the namespace to the host's
  ports (`-T none -U none`, except the port of a proxy on the host's loopback, which the rules
  allow), and the gateway address is not mapped to the host's loopback (`--no-map-gw`).

pasta runs as the service's uid in the host's namespaces, as the service's child: it is killed
when its zygote ends, by its parent-death signal when the service dies, and its own end ends its
zygote (the pool starts another). Runs cannot reach it: each is in a PID namespace of its own
without /proc, and the signal fence and Landlock keep their signals to themselves.

Where this cannot be had (no network namespace, no nftables or /dev/net/tun for it, no pasta, or
pasta ending as it starts), runs with network are refused with the reason, never given the host's
network unfiltered; runs without network are still served.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import ipaddress
import logging
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass

from runtimes.linux import syscalls
from runtimes.linux.egress import egress_rules, normalise, output_table, proxy_endpoints
from runtimes.linux.protections import Protections

log = logging.getLogger("sandlot.jail")

TABLE = "sandlot_egress"
ATTACH_TIMEOUT = 10.0  # seconds for pasta to configure the namespace
REFUSED = "runs with network are refused: "  # how every refusal of runs with network begins


def host_addresses(proc_net: str = "/proc/net") -> tuple[str, ...]:
    """Every address this process's network namespace calls its own (its local and broadcast
    routes, IPv4; its interface addresses, IPv6), read as an unprivileged process can."""
    found: set[str] = set()
    try:
        with open(os.path.join(proc_net, "fib_trie")) as f:
            last = ""
            for line in f:
                text = line.strip()
                if text.startswith("|--"):
                    last = text[3:].strip()
                elif last and text.startswith("/32 ") and text.endswith(("LOCAL", "BROADCAST")):
                    found.add(last)
    except OSError:
        pass
    try:
        with open(os.path.join(proc_net, "if_inet6")) as f:
            for line in f:
                raw = line.split()[0] if line.strip() else ""
                if len(raw) == 32:
                    found.add(str(ipaddress.IPv6Address(bytes.fromhex(raw))))
    except OSError:
        pass
    return tuple(sorted(found, key=lambda a: (ipaddress.ip_address(a).version, ipaddress.ip_address(a))))


@dataclass(frozen=True)
class NamespaceNetwork:
    """What the zygotes of a `userns` runtime without root do for their runs' network."""

    netns: bool  # a network namespace of their own (runs without network then have no way out at all)
    pasta: str = ""  # pasta's path; "" when runs with network are refused
    allow: tuple[str, ...] = ()  # SANDLOT_EGRESS_ALLOW, normalised
    proxies: tuple[tuple[str, int], ...] = ()  # the proxies' addresses and ports, reachable although private
    refused: str = ""  # why runs with network are refused here ("" when they are served)

    @property
    def in_force(self) -> bool:
        return bool(self.pasta) and not self.refused

    def failed(self, why: str) -> NamespaceNetwork:
        """pasta could not start on a zygote's namespace (e.g. its own seccomp filter refused under an
        outer one): later zygotes do not try again, and runs with network are refused, saying why."""
        return dataclasses.replace(self, pasta="", refused=f"{REFUSED}{why}")

    def ruleset(self) -> str:
        """The namespace's egress rules, with the host's addresses as they are now."""
        return output_table(TABLE, egress_rules("", list(self.allow), list(self.proxies), host_addresses()))

    def zygote_config(self) -> dict:
        """For the zygote: whether to unshare a network namespace, and the rules to install before pasta."""
        return {"netns": self.netns, "ruleset": self.ruleset() if self.in_force else ""}

    @property
    def loopback_ports(self) -> tuple[int, ...]:
        """Ports of proxies on the host's loopback: pasta forwards these (and only these) to it."""
        return tuple(sorted({port for address, port in self.proxies if ipaddress.ip_address(address).is_loopback}))

    def pasta_command(self, userns: int, netns: int, pid_file: str) -> list[str]:
        """pasta on the namespaces open as fds userns and netns (inherited), ready once pid_file is written."""
        forwarded = ",".join(str(p) for p in self.loopback_ports) or "none"
        return [
            self.pasta,
            "--foreground",
            "--quiet",
            "--config-net",
            "--tcp-ports",
            "none",
            "--udp-ports",
            "none",
            "--tcp-ns",
            forwarded,
            "--udp-ns",
            "none",
            "--no-map-gw",
            "--userns",
            f"/proc/self/fd/{userns}",
            "--netns",
            f"/proc/self/fd/{netns}",
            "--no-netns-quit",  # not bound to a file; pasta is stopped with its zygote
            "--pid",
            pid_file,
        ]


# What the record must offer for runs with network without root, and what they are told where it does not.
_NEEDS = (
    ("net_namespaces", "without root they need a network namespace of their own, and none can be made here"),
    ("netns_egress", "without root their egress filter needs nftables in a network namespace and /dev/net/tun"),
    (
        "seccomp",
        "without root their way out is pasta, and pasta ends where its own seccomp filter cannot be installed, as here",
    ),
)


def namespace_network(
    record: Protections, pasta: str, allow: tuple[str, ...], proxies: tuple[str, ...]
) -> NamespaceNetwork:
    """The runs' network for a `userns` runtime without root, from the protections record and settings."""
    for mechanism, need in _NEEDS:
        if not getattr(record, mechanism):
            why = record.errors.get(mechanism, "not available")
            return NamespaceNetwork(netns=record.net_namespaces, refused=f"{REFUSED}{need} ({why})")
    found = shutil.which(pasta) if pasta else None
    if not found:
        where = f"{pasta!r} not found (SANDLOT_PASTA)" if pasta else "SANDLOT_PASTA is empty"
        return NamespaceNetwork(
            netns=True, refused=f"{REFUSED}without root they need pasta (apt-get install passt): {where}"
        )
    return NamespaceNetwork(
        netns=True, pasta=found, allow=tuple(normalise(allow)), proxies=tuple(proxy_endpoints(list(proxies)))
    )


def _die_with_parent(parent: int) -> None:  # pragma: no cover - runs between fork and exec
    syscalls.set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)


class Pasta:
    """One pasta process giving one zygote's network namespace its way out."""

    def __init__(self, process: subprocess.Popen, errors: int):
        self.process = process
        self.pidfd = os.pidfd_open(process.pid)
        self._errors = errors  # pasta's stderr: an unlinked file, read if pasta ends

    @classmethod
    async def attach(cls, network: NamespaceNetwork, userns: int, netns: int) -> Pasta:
        """Start pasta on a zygote's namespaces (fds it sent); return once pasta has configured them.

        Nothing of it is on disk, so nothing can be left behind however the service ends: its pid
        "file" is a pipe (pasta writes its pid there once the namespace is configured) and its stderr
        an unlinked file."""
        pasta, ready = cls._start(network, userns, netns)
        try:
            await pasta._configured(ready)
        except BaseException:
            pasta.stop()
            raise
        finally:
            os.close(ready)
        return pasta

    @classmethod
    def attach_blocking(cls, network: NamespaceNetwork, userns: int, netns: int) -> Pasta:
        """attach, for a caller with no event loop (a layer build's thread): blocks until pasta has configured
        the namespaces (fds), or raises OSError as attach does."""
        pasta, ready = cls._start(network, userns, netns)
        try:
            deadline = time.monotonic() + ATTACH_TIMEOUT
            while not _read(ready):
                pasta._check(time.monotonic() > deadline)
                select.select([ready], [], [], 0.005)
        except BaseException:
            pasta.stop()
            raise
        finally:
            os.close(ready)
        return pasta

    @classmethod
    def _start(cls, network: NamespaceNetwork, userns: int, netns: int) -> tuple[Pasta, int]:
        """pasta started on the namespaces, and the read end of its pid pipe (non-blocking; the caller closes it)."""
        ready, written = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            errors = tempfile.TemporaryFile()  # noqa: SIM115 - kept as a bare fd, closed in stop()
            try:
                process = subprocess.Popen(
                    network.pasta_command(userns, netns, f"/proc/self/fd/{written}"),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=errors,
                    env={},
                    cwd="/",
                    close_fds=True,
                    pass_fds=(userns, netns, written),
                    preexec_fn=functools.partial(_die_with_parent, os.getpid()),
                )
            except OSError as exc:
                errors.close()
                raise OSError(f"pasta could not be started: {exc}") from exc
            pasta = cls(process, os.dup(errors.fileno()))
            errors.close()
        except BaseException:
            os.close(ready)
            raise
        finally:
            os.close(written)
        return pasta, ready

    async def _configured(self, ready: int) -> None:
        """Wait for pasta's pid on the pipe: it writes it once the namespace is configured."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ATTACH_TIMEOUT
        while not _read(ready):
            self._check(loop.time() > deadline)
            await asyncio.sleep(0.005)

    def _check(self, late: bool) -> None:
        """Not configured yet: raise if pasta has ended or is late."""
        if self.process.poll() is not None or late:
            why = self.failure() if self.process.returncode is not None else "timeout"
            raise OSError(f"pasta could not set up the runs' network: {why}")

    def failure(self) -> str:
        """What pasta said before it ended (its stderr), or how it ended."""
        said = os.pread(self._errors, 4096, 0).decode(errors="replace").strip() if self._errors >= 0 else ""
        return said or f"exit status {self.process.poll()}"

    def stop(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            self.process.wait()
        for fd in (self.pidfd, self._errors):
            if fd >= 0:
                os.close(fd)
        self.pidfd = self._errors = -1


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, 64)
    except OSError:  # nothing yet (EAGAIN)
        return b""
