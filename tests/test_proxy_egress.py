"""Runs with network through the operator's proxy where egress cannot be filtered
(runtimes/jail/policy/proxy_egress.py).

A proxy stand-in on loopback (port 18711 of this room's range) and another TCP service beside it (18712). The
service runs as nobody under the restricted pod's stand-in (the landlock jail: no rule can filter its runs'
egress by address) with HTTP_PROXY naming the stand-in by host name. Runs asking for network reach the web
through the proxy, with its address given resolved; they reach neither the other port, nor any UDP or unix
socket. With SANDLOT_PROXY_EGRESS=off and SANDLOT_UNFILTERED_EGRESS=allow the same attempts succeed: each
refusal is the rule's.
"""

from __future__ import annotations

import os
import shutil
import socketserver
import tempfile
import threading

import pytest
import unprivileged
from service import DOCKER_DEFAULT, Service, standin
from test_landlock_mode import KERNEL_ABI, RESTRICTED_POD

from runtimes.jail.policy import proxy_egress, tree_files

PROXY_PORT = 18711
OTHER_PORT = 18712


class _Proxy(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True


class _ProxyHandler(socketserver.StreamRequestHandler):
    """Answers any proxied request with what it was asked: a stand-in for Dify's ssrf_proxy."""

    def handle(self):
        line = self.rfile.readline().decode(errors="replace").strip()
        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
            pass
        body = f"via proxy: {line}".encode()
        self.wfile.write(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))


class _Other(socketserver.StreamRequestHandler):
    def handle(self):
        self.wfile.write(b"other service\n")


@pytest.fixture(scope="module")
def listeners():
    servers = [_Proxy(("127.0.0.1", PROXY_PORT), _ProxyHandler), _Proxy(("127.0.0.1", OTHER_PORT), _Other)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    yield
    for server in servers:
        server.shutdown()
        server.server_close()


def _pod(**env):
    if unprivileged.unavailable():
        pytest.skip(unprivileged.unavailable())
    if KERNEL_ABI < proxy_egress.NETWORK_ABI:
        pytest.skip(f"needs Landlock ABI {proxy_egress.NETWORK_ABI}+ (this kernel: {KERNEL_ABI})")
    svc = unprivileged.service(HTTP_PROXY=f"http://localhost:{PROXY_PORT}", **env)
    svc.user = None
    svc.launcher = RESTRICTED_POD
    return svc.start()


@pytest.fixture(scope="module")
def pod(listeners):
    svc = _pod()
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def unfiltered(listeners):
    svc = _pod(SANDLOT_PROXY_EGRESS="off", SANDLOT_UNFILTERED_EGRESS="allow")
    yield svc
    svc.stop()


ATTEMPTS = {
    "another TCP port": f"import socket\nsocket.create_connection(('127.0.0.1', {OTHER_PORT}), timeout=5).close()",
    "UDP (DNS)": "import socket\nsocket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('127.0.0.1', 53))",
    "UDP over IPv6": "import socket\nsocket.socket(socket.AF_INET6, socket.SOCK_DGRAM)",
    "a unix socket": "import socket\nsocket.socket(socket.AF_UNIX, socket.SOCK_STREAM)",
    "a TCP listener": "import socket\ns = socket.socket()\ns.bind(('127.0.0.1', 18713))\ns.listen()",
    # MPTCP: a stream socket Landlock's TCP port rules do not see
    "MPTCP to another port": f"import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262)\n"
    f"s.settimeout(5)\ns.connect(('127.0.0.1', {OTHER_PORT}))",
}


def _attempt(svc, code: str) -> str:
    envelope = svc.run(code + "\nprint('reached')", enable_network=True)
    assert envelope["code"] == 0, envelope
    return envelope["data"]["stdout"] + envelope["data"]["error"]


def test_the_health_detail_says_what_proxy_egress_still_allows(pod):
    runtime = pod.detail()["runtimes"]["python3"]
    assert runtime["protections"]["mode"] == "landlock"
    assert runtime["protections"]["network"] == "proxy"
    reason = runtime["protections"]["network_reason"]
    assert f"port {PROXY_PORT} on any address the container reaches" in reason
    assert "no UDP" in reason and "resolved" in reason


def test_a_run_reaches_the_web_through_the_proxy_given_resolved(pod):
    code = (
        "import os, urllib.request\n"
        "print(os.environ['HTTP_PROXY'])\n"
        "print(urllib.request.urlopen('http://example.invalid/page', timeout=5).read().decode())\n"
    )
    out = _attempt(pod, code)
    assert out.startswith(f"http://127.0.0.1:{PROXY_PORT}\n"), out  # no DNS in the run: the address itself
    assert "via proxy: GET http://example.invalid/page HTTP/1.1" in out


def test_requests_goes_through_the_proxy_too(pod):
    out = _attempt(pod, "import requests\nprint(requests.get('http://example.invalid/r', timeout=5).text)")
    assert "via proxy: GET http://example.invalid/r" in out


@pytest.mark.parametrize("name", list(ATTEMPTS))
def test_nothing_else_is_reached(pod, name):
    out = _attempt(pod, ATTEMPTS[name])
    assert "reached" not in out and "PermissionError" in out, out


# A socket connected to the proxy, asked its own address (the container's): refused, with EPERM
OWN_ADDRESS = {
    "python3": (
        "import socket\n"
        f"s = socket.create_connection(('127.0.0.1', {PROXY_PORT}), timeout=5)\n"
        "print('peer', s.getpeername()[1])\n"
        "try:\n"
        "    print('own', s.getsockname())\n"
        "except OSError as exc:\n"
        "    print('own', type(exc).__name__, exc.errno)\n"
    ),
    "nodejs": (
        "const net = require('net');\n"
        f"const s = net.connect({PROXY_PORT}, '127.0.0.1', () => {{\n"
        "  console.log('peer', s.remotePort);\n"
        "  console.log('own', JSON.stringify(s.address()), String(s.localAddress));\n"
        "  s.destroy();\n"
        "});\n"
    ),
}
OWN_ADDRESS_REFUSED = {
    "python3": f"peer {PROXY_PORT}\nown PermissionError 1\n",
    "nodejs": f"peer {PROXY_PORT}\nown {{}} undefined\n",
}
# Node's own clients through the proxy (the run's fetch is undici; http.request names the proxy itself)
NODE_THROUGH_PROXY = (
    "const http = require('http');\n"
    "const proxy = new URL(process.env.HTTP_PROXY);\n"
    "http.get({ host: proxy.hostname, port: proxy.port, path: 'http://example.invalid/n' }, (res) => {\n"
    "  let body = ''; res.on('data', (d) => body += d); res.on('end', () => console.log(body));\n"
    "}).on('error', (e) => console.log('error', e.code));\n"
)


@pytest.mark.parametrize("language", ["python3", "nodejs"])
def test_a_run_cannot_read_its_own_address_from_a_socket_to_the_proxy(pod, language):
    envelope = pod.run(OWN_ADDRESS[language], language=language, enable_network=True)
    assert envelope["code"] == 0, envelope
    assert envelope["data"]["stdout"] == OWN_ADDRESS_REFUSED[language], envelope


def test_node_reaches_the_web_through_the_proxy(pod):
    envelope = pod.run(NODE_THROUGH_PROXY, language="nodejs", enable_network=True)
    assert envelope["code"] == 0, envelope
    assert "via proxy: GET http://example.invalid/n" in envelope["data"]["stdout"], envelope


RESOLV_CONF = (
    "try:\n    print(repr(open('/etc/resolv.conf').read()))\nexcept OSError as exc:\n    print(type(exc).__name__)\n"
)


def test_a_run_reads_no_resolver_of_the_host(pod):
    """No DNS through the proxy: the landlock jail (no tree of its own) leaves the host's resolv.conf unread."""
    assert _attempt(pod, RESOLV_CONF) == "PermissionError\nreached\n"


def test_without_the_rule_a_run_reads_its_own_address(unfiltered):
    """The control: the same code reads it where proxy egress is off."""
    envelope = unfiltered.run(OWN_ADDRESS["python3"], enable_network=True)
    assert "own ('127.0.0.1'," in envelope["data"]["stdout"], envelope


@pytest.mark.parametrize("name", ["another TCP port", "UDP (DNS)", "UDP over IPv6"])
def test_without_the_rule_the_same_attempts_succeed(unfiltered, name):
    """The control: unfiltered egress reaches them, so each refusal above is proxy egress's doing."""
    assert unfiltered.detail()["runtimes"]["python3"]["protections"]["network"] == "unfiltered"
    out = _attempt(unfiltered, ATTEMPTS[name])
    assert "reached" in out, out


def test_proxy_egress_is_planned_from_the_settings():
    env = {"HTTP_PROXY": "http://user:pw@localhost:3128", "http_proxy": "http://localhost:3128"}
    planned = proxy_egress.choose("auto", env, 7, "no-network")
    assert planned.ports == (3128,) and not planned.refused
    assert planned.env["HTTP_PROXY"] in ("http://user:pw@127.0.0.1:3128", "http://user:pw@[::1]:3128")
    assert proxy_egress.choose("auto", {}, 7, "no-network") is None  # no proxy: SANDLOT_UNFILTERED_EGRESS decides
    assert proxy_egress.choose("auto", env, 7, "allow") is None  # the operator chose unfiltered egress
    assert proxy_egress.choose("off", env, 7, "no-network") is None
    assert "ABI 4 or later" in proxy_egress.choose("auto", env, 3, "no-network").refused
    assert "this kernel gives ABI 3" in proxy_egress.choose("on", env, 3, "allow").refused
    assert "needs HTTP_PROXY" in proxy_egress.choose("on", {}, 7, "no-network").refused
    assert (
        "cannot be resolved"
        in proxy_egress.choose("on", {"HTTP_PROXY": "http://no.such.host.invalid:1"}, 7, "").refused
    )


@pytest.fixture(scope="module")
def container(listeners):
    """A default container's stand-in (root, Docker's capabilities without NET_ADMIN: the chroot jail)."""
    if os.geteuid() != 0:
        pytest.skip("the stand-in for a container narrows root's privileges")
    if KERNEL_ABI < proxy_egress.NETWORK_ABI:
        pytest.skip(f"needs Landlock ABI {proxy_egress.NETWORK_ABI}+ (this kernel: {KERNEL_ABI})")
    data = tempfile.mkdtemp(prefix="sandlot-proxy-egress-", dir="/var/tmp")  # a volume's stand-in
    os.chmod(data, 0o755)
    svc = Service(launcher=standin(DOCKER_DEFAULT), SANDLOT_DATA_DIR=data, HTTP_PROXY=f"http://localhost:{PROXY_PORT}")
    try:
        yield svc.start()
    finally:
        svc.stop()
        shutil.rmtree(data, ignore_errors=True)


def test_the_chroot_jail_without_net_admin_uses_the_proxy_too(container):
    protections = container.detail()["runtimes"]["python3"]["protections"]
    assert protections["mode"] == "chroot" and protections["network"] == "proxy"
    out = _attempt(container, "import urllib.request\nprint(urllib.request.urlopen('http://example.invalid/c').read())")
    assert "via proxy: GET http://example.invalid/c" in out
    for name in ("another TCP port", "UDP (DNS)", "a unix socket", "MPTCP to another port"):
        out = _attempt(container, ATTEMPTS[name])
        assert "reached" not in out and "PermissionError" in out, (name, out)
    for language in ("python3", "nodejs"):
        envelope = container.run(OWN_ADDRESS[language], language=language, enable_network=True)
        assert envelope["data"]["stdout"] == OWN_ADDRESS_REFUSED[language], envelope
    assert _attempt(container, RESOLV_CONF) == f"{tree_files.NO_RESOLVER!r}\nreached\n"  # the tree's own, no resolver
    envelope = container.run(NODE_THROUGH_PROXY, language="nodejs", enable_network=True)
    assert "via proxy: GET http://example.invalid/n" in envelope["data"]["stdout"], envelope
