"""Network namespaces made by a test, so that network tests never touch a real network.

`World` builds two namespaces joined by a veth pair: "host", where the service under test
runs (it has a public-looking address of its own, as a cloud machine would, and another one
on its loopback interface), and
"outside", which holds canary listeners on the addresses a run must not reach (cloud
metadata, private ranges, a documentation range) and one it may reach (a "public"
address). Every address exists only inside these namespaces. Needs root.

The calling thread enters a namespace with `inside()`; threads and processes it starts
meanwhile are born in it.
"""

from __future__ import annotations

import ctypes
import os
import socket
import subprocess
import threading
from contextlib import contextmanager

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)

HOST_ADDRESS = "5.6.7.8"  # the host's own address, on its veth
OTHER_HOST_ADDRESS = "5.6.9.9"  # another of its own, not on the interface with the default route
PUBLIC = "5.6.7.1"  # "the internet": the outside end of the veth
METADATA = "169.254.169.254"
PRIVATE = ("10.0.0.1", "192.168.1.1", "172.16.0.1", "100.64.0.1")
DOCUMENTATION = ("192.0.2.1", "198.51.100.1", "203.0.113.1", "198.18.0.1")
CANARY_PORT = 8080


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


@contextmanager
def inside(name: str):
    """The calling thread in network namespace `name` for the duration."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    target = os.open(f"/run/netns/{name}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        _setns(target)
        try:
            yield
        finally:
            _setns(own)
    finally:
        os.close(target)
        os.close(own)


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


class Canary:
    """A TCP listener that accepts, says who it is, and counts its callers."""

    def __init__(self, address: str, port: int, family: int = socket.AF_INET):
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((address, port))
        self.sock.listen(64)
        self.address = address
        self.port = self.sock.getsockname()[1]
        self.hits = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.hits += 1
            try:
                conn.sendall(f"canary {self.address}\n".encode())
            finally:
                conn.close()

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


class DnsCanary:
    """A UDP name server that knows one name (its A record) and answers every other question with no record."""

    def __init__(self, address: str, name: str, answer: str):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((address, 53))
        self.address = address
        self.name = name.lower().rstrip(".")
        self.answer = socket.inet_aton(answer)
        self.questions: list[str] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                query, peer = self.sock.recvfrom(512)
            except OSError:
                return
            try:
                self.sock.sendto(self._reply(query), peer)
            except (OSError, ValueError, IndexError):
                continue

    def _reply(self, query: bytes) -> bytes:
        labels, at = [], 12
        while query[at]:
            labels.append(query[at + 1 : at + 1 + query[at]].decode().lower())
            at += 1 + query[at]
        question = query[12 : at + 5]
        qtype = int.from_bytes(query[at + 1 : at + 3], "big")
        name = ".".join(labels)
        self.questions.append(name)
        known = name == self.name
        answers = b""
        if known and qtype == 1:
            answers = b"\xc0\x0c" + (1).to_bytes(2, "big") + (1).to_bytes(2, "big") + (60).to_bytes(4, "big")
            answers += (4).to_bytes(2, "big") + self.answer
        flags = 0x8180 if known else 0x8183  # a response, recursion available; NXDOMAIN for other names
        header = query[:2] + flags.to_bytes(2, "big") + (1).to_bytes(2, "big")
        header += (1 if answers else 0).to_bytes(2, "big") + bytes(4)
        return header + question + answers

    def close(self) -> None:
        self.sock.close()


class World:
    def __init__(self, tag: str):
        self.host = f"sandlot-host-{tag}"
        self.outside = f"sandlot-out-{tag}"
        self.canaries: dict[str, Canary] = {}

    def build(self) -> World:
        ip("netns", "add", self.host)
        ip("netns", "add", self.outside)
        ip("link", "add", "sl-h", "netns", self.host, "type", "veth", "peer", "name", "sl-o", "netns", self.outside)
        for ns in (self.host, self.outside):
            ip("-n", ns, "link", "set", "lo", "up")
        ip("-n", self.host, "addr", "add", f"{HOST_ADDRESS}/24", "dev", "sl-h")
        ip("-n", self.host, "link", "set", "sl-h", "up")
        ip("-n", self.host, "route", "add", "default", "via", PUBLIC)
        ip("-n", self.host, "addr", "add", f"{OTHER_HOST_ADDRESS}/32", "dev", "lo")
        ip("-n", self.outside, "addr", "add", f"{PUBLIC}/24", "dev", "sl-o")
        for address in (METADATA, *PRIVATE, *DOCUMENTATION):
            ip("-n", self.outside, "addr", "add", f"{address}/32", "dev", "lo")
        ip("-n", self.outside, "link", "set", "sl-o", "up")
        with inside(self.outside):
            for address in (PUBLIC, METADATA, *PRIVATE, *DOCUMENTATION):
                self.canaries[address] = Canary(address, CANARY_PORT)
        return self

    def destroy(self) -> None:
        for canary in self.canaries.values():
            canary.close()
        for ns in (self.host, self.outside):
            subprocess.run(["ip", "netns", "delete", ns], capture_output=True)
