"""A run with network reaches the outside and nothing else; a run without network has none.

The service runs in a network namespace this module makes ("host", with an address of
its own), next to an "outside" namespace holding canary listeners on the metadata,
private, documentation and one "public" address (tests/netns.py). No packet leaves them.
Each canary is first reached by the test itself, so a refusal seen from a run is the
jail's doing, not a missing route.

Modes: root's full jail and `SANDLOT_JAIL=reduced` as root (nft on the host, by the runs' uids),
and the whole service as an unprivileged uid (each zygote's own network namespace, egress through
pasta, nft inside it: runtimes/linux/pasta.py).
"""

import os
import shutil
import socket
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import test_hostile
import unprivileged
from conftest import needs_root
from netns import (
    CANARY_PORT,
    DOCUMENTATION,
    HOST_ADDRESS,
    METADATA,
    OTHER_HOST_ADDRESS,
    PRIVATE,
    PUBLIC,
    Canary,
    DnsCanary,
    World,
    inside,
)
from service import IS_ROOT, Service, descendants, wait_for

pytestmark = [needs_root, pytest.mark.namespaces]  # the chroot jail's network: tests/test_container.py

REFUSED = "refused"

PY_CONNECT = """
import socket
for host, port in {targets!r}:
    try:
        with socket.create_connection((host, port), timeout=3) as s:
            print(host, port, 'connected', s.recv(64).decode().strip())
    except OSError as e:
        print(host, port, 'refused' if e.errno in (1, 111, 113) else f'error {{e.errno}}')
"""

JS_CONNECT = """
const net = require('net');
const targets = {targets};
(async () => {{
  for (const [host, port] of targets) {{
    const line = await new Promise((resolve) => {{
      const s = net.connect({{ host, port, timeout: 3000 }});
      let got = '';
      s.on('data', (d) => {{ got += d; }});
      s.on('end', () => resolve(`${{host}} ${{port}} connected ${{got.trim()}}`));
      s.on('timeout', () => {{ s.destroy(); resolve(`${{host}} ${{port}} error timeout`); }});
      s.on('error', (e) => resolve(`${{host}} ${{port}} ${{
        ['ECONNREFUSED', 'EPERM', 'EHOSTUNREACH'].includes(e.code) ? 'refused' : 'error ' + e.code}}`));
    }});
    console.log(line);
  }}
}})();
"""


def connect_code(language: str, targets: list[tuple[str, int]]) -> str:
    if language == "python3":
        return PY_CONNECT.format(targets=targets)
    return JS_CONNECT.format(targets=[list(t) for t in targets])


@pytest.fixture(scope="module")
def world():
    if not IS_ROOT:
        pytest.skip("needs root: network namespaces")
    built = World(f"{os.getpid()}")
    try:
        built.build()
        with inside(built.host):
            built.host_service = Canary("0.0.0.0", 0)  # a host service bound to every address
            built.host_loopback = Canary("127.0.0.1", 0)  # and one on its loopback only
            built.abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            built.abstract.bind(f"\0sandlot-canary-{os.getpid()}")
            built.abstract.listen(8)
            built.service = Service(SANDLOT_HOST="0.0.0.0").start()
        yield built
    finally:
        service = getattr(built, "service", None)
        if service is not None:
            service.stop()
        if hasattr(built, "host_service"):
            built.host_service.close()
            built.host_loopback.close()
            built.abstract.close()
        built.destroy()


@pytest.fixture(scope="module")
def reduced_service(world):
    """The reduced jail (no uid or tree of its own) in the host namespace, where it is offered."""
    with inside(world.host):
        try:
            svc = Service(SANDLOT_JAIL="reduced", SANDLOT_HOST="0.0.0.0").start()
        except RuntimeError as exc:
            pytest.skip(f"the reduced jail is not offered here: {exc}")
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def unprivileged_service(world):
    """The whole service as nobody in the host namespace: the userns jail without root."""
    _needs_unprivileged_network()
    with inside(world.host):
        svc = unprivileged.service(SANDLOT_HOST="0.0.0.0").start()
    yield svc
    svc.stop()


def _needs_unprivileged_network() -> None:
    if unprivileged.unavailable():
        pytest.skip(unprivileged.unavailable())
    if not os.path.exists("/dev/net/tun"):
        pytest.skip("no /dev/net/tun on this machine: pasta cannot give a namespace a way out")


MODES = ["full", "reduced", "unprivileged"]


def _service_for(request, world, mode):
    if mode == "full":
        return world.service
    return request.getfixturevalue(f"{mode}_service")


@pytest.fixture(params=MODES)
def jailed(request, world):
    """What seccomp holds, in each mode: the root jail, the reduced one, and the service without root."""
    service = _service_for(request, world, request.param)
    with inside(world.host):
        yield service


def run(service, code, language="python3", **fields):
    envelope = service.run(code, language=language, **fields)
    assert envelope["code"] == 0, envelope
    return envelope["data"]


def outcome(stdout: str) -> dict[tuple[str, int], str]:
    found = {}
    for line in stdout.splitlines():
        host, port, what = line.split(" ", 2)
        found[(host, int(port))] = what
    return found


LANGUAGES = ["python3", "nodejs"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("language", LANGUAGES)
def test_a_run_with_network_reaches_the_outside_and_no_host_or_private_address(request, world, mode, language):
    service = _service_for(request, world, mode)
    with inside(world.host):
        _reaches_the_outside_only(world, service, language)


def _reaches_the_outside_only(world, service, language):
    protections = service.detail()["runtimes"][language]["protections"]
    assert protections["egress_filter"] is True and protections["network_refused"] == "", protections
    forbidden = [
        (METADATA, CANARY_PORT),
        *[(a, CANARY_PORT) for a in PRIVATE],
        *[(a, CANARY_PORT) for a in DOCUMENTATION],
        (HOST_ADDRESS, world.host_service.port),  # the host's own address, a service on 0.0.0.0
        (OTHER_HOST_ADDRESS, world.host_service.port),  # another of its addresses
        (HOST_ADDRESS, service.port),  # Sandlot itself, on its default bind
        ("127.0.0.1", service.port),
        ("127.0.0.1", world.host_loopback.port),  # a service on the host's loopback
    ]
    gateway = (PUBLIC, world.host_loopback.port)  # the gateway's address is not the host's loopback (pasta)
    targets = [(PUBLIC, CANARY_PORT), *forbidden]
    # the test itself reaches every one: only the jail stands between a run and them
    before_control = {a: c.hits for a, c in world.canaries.items()}
    for host, port in targets:
        socket.create_connection((host, port), timeout=3).close()
    control = {a: before_control[a] + sum(1 for h, _ in targets if h == a) for a in world.canaries}
    assert wait_for(lambda: {a: c.hits for a, c in world.canaries.items()} == control)
    hits_before = control
    started = time.monotonic()
    data = run(service, connect_code(language, [*targets, gateway]), language, enable_network=True, timeout=20)
    seen = outcome(data["stdout"])
    assert seen[(PUBLIC, CANARY_PORT)] == f"connected canary {PUBLIC}", data
    for target in forbidden:
        assert seen[target] == REFUSED, (target, data)
    assert not seen[gateway].startswith("connected"), data  # nothing listens there outside
    assert time.monotonic() - started < 15  # refused at once, not left to time out
    expected = {a: hits_before[a] + (1 if a == PUBLIC else 0) for a in world.canaries}
    assert wait_for(lambda: {a: c.hits for a, c in world.canaries.items()} == expected)


def test_no_socket_but_plain_tcp_udp_and_unix_pairs(jailed):
    """The seccomp filter's socket rule in each mode with namespaces: TCP and UDP only, never MPTCP and others."""
    assert run(jailed, test_hostile.SOCKETS, enable_network=True)["stdout"] == test_hostile.sockets_seen(jailed)


@pytest.mark.parametrize("language", LANGUAGES)
def test_a_run_without_network_reaches_nothing(world, jailed, language):
    data = run(jailed, connect_code(language, [(PUBLIC, CANARY_PORT)]), language, enable_network=False)
    assert outcome(data["stdout"]) == {(PUBLIC, CANARY_PORT): REFUSED}, data


PY_LISTEN = """
import socket
for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
    s = socket.socket(socket.AF_INET, kind)
    try:
        s.bind(('0.0.0.0', 0))
        print('bound', s.getsockname()[1])
    except OSError as e:
        print('bind', e.errno)
    if kind == socket.SOCK_STREAM:
        try:
            s.listen(1)
            print('listening', s.getsockname()[1])
        except OSError as e:
            print('listen', e.errno)
"""

JS_LISTEN = """
const net = require('net'), dgram = require('dgram');
const server = net.createServer();
server.on('error', (e) => console.log('tcp', e.code));
server.listen(0, '0.0.0.0', () => console.log('listening', server.address().port));
const udp = dgram.createSocket('udp4');
udp.on('error', (e) => { console.log('udp', e.code); udp.close(); });
udp.bind(0, () => console.log('bound', udp.address().port));
setTimeout(() => {}, 300);
"""


@pytest.mark.parametrize("language", LANGUAGES)
def test_a_run_cannot_listen_or_bind(jailed, language):
    code = PY_LISTEN if language == "python3" else JS_LISTEN
    data = run(jailed, code, language, enable_network=True)
    if language == "python3":
        assert data["stdout"] == "bind 1\nlisten 1\nbind 1\n", data
    else:
        assert sorted(data["stdout"].split("\n")) == ["", "tcp EPERM", "udp EPERM"], data


PY_UNIX = """
import socket
name = {name!r}
try:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(name)
    print('connected')
except OSError as e:
    print('connect', e.errno)
try:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind('\\0sandlot-run-' + str(id(s)))
    print('bound')
except OSError as e:
    print('bind', e.errno)
a, b = socket.socketpair()
a.sendall(b'pair ok')
print(b.recv(16).decode())
"""

JS_UNIX = """
const net = require('net');
const s = net.connect({{ path: {name!r} }});
s.on('connect', () => {{ console.log('connected'); s.destroy(); }});
s.on('error', (e) => console.log('connect', e.code));
const server = net.createServer();
server.on('error', (e) => console.log('listen', e.code));
server.listen('\\0sandlot-run-node', () => console.log('listening'));
"""


@pytest.mark.parametrize("network", [True, False])
@pytest.mark.parametrize("language", LANGUAGES)
def test_no_abstract_unix_socket_of_the_host_or_another_run(world, jailed, language, network):
    name = world.abstract.getsockname()
    name = name.decode(errors="replace") if isinstance(name, bytes) else name
    code = (PY_UNIX if language == "python3" else JS_UNIX).format(name=name)
    data = run(jailed, code, language, enable_network=network)
    if language == "python3":
        assert data["stdout"] == "connect 1\nbind 1\npair ok\n", data
    else:
        assert sorted(data["stdout"].split("\n")) == ["", "connect EPERM", "listen EPERM"], data


def test_two_concurrent_runs_cannot_talk_over_unix_sockets(jailed):
    listener = (
        "import socket, time\n"
        "try:\n"
        "    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "    s.bind('\\0sandlot-between-runs')\n    s.listen(1)\n    print('listening')\n"
        "    s.settimeout(3)\n    s.accept()\n    print('accepted')\n"
        "except OSError as e:\n    print('listener', e.errno)\n"
    )
    talker = (
        "import socket, time\ntime.sleep(0.5)\n"
        "try:\n"
        "    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "    s.connect('\\0sandlot-between-runs')\n    print('connected')\n"
        "except OSError as e:\n    print('talker', e.errno)\n"
    )
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(run, jailed, listener, enable_network=True)
        second = pool.submit(run, jailed, talker, enable_network=True)
        assert first.result()["stdout"] == "listener 1\n"
        assert second.result()["stdout"] == "talker 1\n"


PY_NETLINK = """
import socket, fcntl, struct, array
for proto, name in ((4, 'sock_diag'), (0, 'route')):
    try:
        socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, proto)
        print(name, 'opened')
    except OSError as e:
        print(name, e.errno)
try:
    print('interfaces', socket.if_nameindex())
except OSError as e:
    print('if_nameindex', e.errno)
a, b = socket.socketpair()
buf = array.array('B', bytes(4096))
try:  # SIOCGIFCONF works on any socket, a socketpair included
    fcntl.ioctl(a.fileno(), 0x8912, struct.pack('iL', 4096, buf.buffer_info()[0]))
    print('ifconf listed')
except OSError as e:
    print('ifconf', e.errno)
for kind in (socket.SOCK_RAW, socket.SOCK_PACKET if hasattr(socket, 'SOCK_PACKET') else 10):
    try:
        socket.socket(socket.AF_INET, kind, 1)
        print('raw opened')
    except OSError as e:
        print('raw', e.errno)
print('resolved', socket.getaddrinfo('localhost', 80, type=socket.SOCK_STREAM)[0][4][0])
"""


@pytest.mark.parametrize("network", [True, False])
def test_no_netlink_no_interface_list_no_raw_socket_python(jailed, network):
    data = run(jailed, PY_NETLINK, enable_network=network)
    assert data["stdout"] == ("sock_diag 1\nroute 1\nif_nameindex 1\nifconf 1\nraw 1\nraw 1\nresolved 127.0.0.1\n"), (
        data
    )


JS_NETLINK = """
const os = require('os'), dns = require('dns');
let interfaces;
try { interfaces = Object.keys(os.networkInterfaces()); } catch (e) { interfaces = e.code || e.message; }
console.log('interfaces', JSON.stringify(interfaces));
dns.lookup('localhost', { family: 4 }, (err, address) => console.log('resolved', err ? err.code : address));
"""


@pytest.mark.parametrize("network", [True, False])
def test_no_interface_list_nodejs(jailed, network):
    data = run(jailed, JS_NETLINK, "nodejs", enable_network=network)
    lines = data["stdout"].splitlines()
    assert "sl-h" not in data["stdout"] and HOST_ADDRESS not in data["stdout"], data
    assert lines[0] in ("interfaces []", 'interfaces "EPERM"', 'interfaces "ERR_SYSTEM_ERROR"'), data
    assert lines[1] == "resolved 127.0.0.1", data


HOSTNAME = {
    "python3": "import os, socket\nprint(os.uname().nodename, socket.gethostname())",
    "nodejs": "const os = require('os');\nconsole.log(os.hostname(), os.hostname())",
}


@pytest.mark.parametrize("language", LANGUAGES)
def test_a_run_does_not_learn_the_hosts_name(service, language):
    host = socket.gethostname()
    data = run(service, HOSTNAME[language], language)
    assert data["stdout"] == "sandbox sandbox\n", data
    assert host not in data["stdout"]


# ---- the run's resolv.conf ----------------------------------------------------------------------

# The host's resolv.conf, as a service in a mount namespace of its own reads it: a search domain and options
# no run may learn, and the one resolver, a name server in the "outside" namespace that knows one name.
DNS_NAME = "canary.sandlot.test"
DNS_ANSWER = "5.6.7.77"
HOST_RESOLV = f"search sandlot-canary.invalid\noptions ndots:3 timeout:1 attempts:1\nnameserver {PUBLIC}\n"
RESOLVE = {
    "python3": (
        "print(open('/etc/resolv.conf').read(), end='')\n"
        "import socket\n"
        "try:\n"
        f"    print('resolved', socket.gethostbyname({DNS_NAME!r}))\n"
        "except OSError as exc:\n"
        "    print('resolved', type(exc).__name__)\n"
    ),
    "nodejs": (
        "const fs = require('fs'), dns = require('dns');\n"
        "process.stdout.write(fs.readFileSync('/etc/resolv.conf', 'utf8'));\n"
        f"dns.lookup({DNS_NAME!r}, {{ family: 4 }}, (err, address) => {{\n"
        "  console.log('resolved', err ? 'error' : address);\n"
        f"  dns.resolve4({DNS_NAME!r}, (e, found) => console.log('resolve4', e ? 'error' : found.join(',')));\n"
        "});\n"
    ),
}


def _with_resolv_conf(path: str, user: int | None = None) -> list[str]:
    """A launcher: the service in a mount namespace of its own, where path is the host's /etc/resolv.conf."""
    drop = f"setpriv --reuid={user} --regid={user} --clear-groups " if user is not None else ""
    script = f'mount --bind "$0" /etc/resolv.conf && exec {drop}"$@"'
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, path]


@pytest.fixture(scope="module")
def resolver_world(world, tmp_path_factory):
    """The DNS canary, and a service of each mode reading HOST_RESOLV as the host's resolv.conf."""
    path = tmp_path_factory.mktemp("resolv") / "resolv.conf"
    path.write_text(HOST_RESOLV)
    path.chmod(0o644)
    with inside(world.outside):
        dns = DnsCanary(PUBLIC, DNS_NAME, DNS_ANSWER)
    services = {}
    # the resolver these services read knows no package index: their layers are built first, in a data dir of
    # their own (outside /tmp: a layer there is refused), by a service that reads the host's own resolv.conf
    data = tempfile.mkdtemp(prefix="sandlot-resolv-", dir="/var/tmp")
    os.chmod(data, 0o755)
    env = {"SANDLOT_HOST": "0.0.0.0", "SANDLOT_DATA_DIR": data}
    try:
        # (a launcher, as below: the service on the interpreter any uid can run, which the layers' keys name)
        Service(launcher=["env"], SANDLOT_DATA_DIR=data).start().stop()
        if not unprivileged.unavailable():
            unprivileged.service().start().stop()
        with inside(world.host):
            services["full"] = Service(launcher=_with_resolv_conf(str(path)), **env).start()
            services["reduced"] = Service(launcher=_with_resolv_conf(str(path)), SANDLOT_JAIL="reduced", **env).start()
            if not unprivileged.unavailable() and os.path.exists("/dev/net/tun"):
                svc = unprivileged.service(SANDLOT_HOST="0.0.0.0")  # its data dir: the one built above
                svc.user = None  # the launcher drops to it, after the mount
                svc.launcher = _with_resolv_conf(str(path), unprivileged.NOBODY)
                services["unprivileged"] = svc.start()
        yield services, dns, world.host
    finally:
        for svc in services.values():
            svc.stop()
        dns.close()
        shutil.rmtree(data, ignore_errors=True)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("language", LANGUAGES)
@pytest.mark.parametrize("network", [True, False], ids=["network", "no-network"])
def test_a_runs_resolv_conf_names_only_the_resolver_its_egress_admits(resolver_world, mode, language, network):
    """Not the host's file: no search domain, no options; the resolver runs with network reach and use (the
    canary answers), the same text for runs without network (they share the tree, and cannot use it)."""
    services, dns, host = resolver_world
    if mode not in services:
        pytest.skip("the service without root needs user namespaces and /dev/net/tun here")
    with inside(host):
        data = run(services[mode], RESOLVE[language], language, enable_network=network)
    lines = data["stdout"].splitlines()
    assert lines[0] == f"nameserver {PUBLIC}", data
    if network:
        expected = [f"resolved {DNS_ANSWER}"] + ([f"resolve4 {DNS_ANSWER}"] if language == "nodejs" else [])
        assert lines[1:] == expected, data
        assert DNS_NAME in dns.questions  # the name asked as is: no search domain was tried
        assert not any("sandlot-canary.invalid" in question for question in dns.questions), dns.questions
    else:
        assert "resolved 5.6.7.77" not in data["stdout"], data


def _pastas(svc) -> list[int]:
    found = []
    for pid in descendants(svc.process.pid):
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().startswith(("pasta", "passt")):  # pasta re-executes itself as passt.avx2 where it can
                    found.append(pid)
        except OSError:
            continue
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_without_root_each_zygote_has_a_pasta_no_run_can_reach(world, unprivileged_service):
    """One pasta per zygote (not per run), a child of the service that runs cannot name or signal."""
    svc = unprivileged_service
    pastas = _pastas(svc)
    with inside(world.host):
        assert len(pastas) == len(svc.detail()["runtimes"]), pastas  # python3's zygote and nodejs's
    code = (
        "import os, signal\n"
        f"for pid in {pastas!r}:\n"
        "    try:\n        os.kill(pid, signal.SIGKILL)\n        print('killed')\n"
        "    except OSError as e:\n        print(e.errno)\n"
    )
    with inside(world.host):
        data = run(svc, code, enable_network=True)
    assert data["stdout"] == "1\n1\n" or data["stdout"] == "3\n3\n", data  # EPERM (fence) or ESRCH
    assert all(_alive(pid) for pid in pastas)


def test_without_root_pasta_ends_with_its_zygote_and_with_the_service(world):
    _needs_unprivileged_network()
    with inside(world.host):
        svc = unprivileged.service(SANDLOT_HOST="0.0.0.0").start()
        try:
            before = _pastas(svc)
            assert len(before) == 2, before
            zygote = next(p for p in descendants(svc.process.pid) if _is_python_zygote(p, svc.process.pid))
            os.kill(zygote, 9)
            # its pasta goes with it, and the next zygote has one of its own
            assert wait_for(lambda: sum(_alive(p) for p in before) == 1), before
            assert wait_for(lambda: len(_pastas(svc)) == 2 and set(_pastas(svc)) != set(before), 30)
            assert wait_for(lambda: svc.detail()["runtimes"]["python3"]["zygote"] == "running", 30)
            data = run(svc, connect_code("python3", [(PUBLIC, CANARY_PORT)]), enable_network=True)
            assert outcome(data["stdout"]) == {(PUBLIC, CANARY_PORT): f"connected canary {PUBLIC}"}, data
            last = _pastas(svc)
            svc.process.kill()  # SIGKILL: nothing of the service runs its shutdown
            svc.process.wait()
            assert wait_for(lambda: not any(_alive(p) for p in last)), last
        finally:
            svc.stop()


def _is_python_zygote(pid: int, service_pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            if int(f.read().rsplit(")", 1)[1].split()[1]) != service_pid:
                return False
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read()
    except OSError:
        return False
    return b"runtimes.jail.zygote.loop" in argv and b"runtimes.python.runner" in argv


NO_NETWORK_SAYS = {
    "python3": "network is not available to runs here: without root they need pasta",
    "nodejs": "connect EPERM: network is not available to runs here: without root they need pasta",
}


@pytest.mark.parametrize("language", LANGUAGES)
def test_without_root_and_without_pasta_network_runs_get_none_and_are_told_why(world, language):
    """Never the host's network unfiltered unless the operator says so (SANDLOT_UNFILTERED_EGRESS): by default
    a run asking for network is served without it, its connections failing with the reason, as in a
    container without NET_ADMIN (test_container.py)."""
    if unprivileged.unavailable():
        pytest.skip(unprivileged.unavailable())
    said = {
        "python3": "import socket\ntry:\n    socket.create_connection(('192.0.2.1', 80), timeout=3)\n"
        "except OSError as e:\n    print(e.strerror)",
        "nodejs": "require('net').connect(80, '192.0.2.1').on('error', (e) => console.log(e.message))",
    }[language]
    with inside(world.host):
        svc = unprivileged.service(SANDLOT_PASTA="/nonexistent/pasta").start()
        try:
            data = run(svc, connect_code(language, [(PUBLIC, CANARY_PORT)]), language, enable_network=True)
            assert outcome(data["stdout"]) == {(PUBLIC, CANARY_PORT): REFUSED}, data
            told = run(svc, said, language, enable_network=True)["stdout"]
            assert told.startswith(NO_NETWORK_SAYS[language]) and "SANDLOT_UNFILTERED_EGRESS" in told, told
            protections = svc.detail()["runtimes"][language]["protections"]
            assert protections["network"] == "none" and "/nonexistent/pasta" in protections["network_reason"]
            assert protections["egress_filter"] is False and protections["network_namespace"] is True
            assert _pastas(svc) == []
        finally:
            svc.stop()


@pytest.mark.parametrize("language", LANGUAGES)
def test_without_root_and_without_pasta_network_runs_may_be_refused_and_others_served(world, language):
    """SANDLOT_UNFILTERED_EGRESS=refuse: the run is refused, and says why."""
    if unprivileged.unavailable():
        pytest.skip(unprivileged.unavailable())
    with inside(world.host):
        svc = unprivileged.service(SANDLOT_PASTA="/nonexistent/pasta", SANDLOT_UNFILTERED_EGRESS="refuse").start()
        try:
            refused = svc.run(connect_code(language, [(PUBLIC, CANARY_PORT)]), language=language, enable_network=True)
            assert refused["code"] == -500, refused
            assert "need pasta (apt-get install passt)" in refused["message"], refused
            data = run(svc, connect_code(language, [(PUBLIC, CANARY_PORT)]), language, enable_network=False)
            assert outcome(data["stdout"]) == {(PUBLIC, CANARY_PORT): REFUSED}, data
            assert run(svc, HOSTNAME[language], language)["stdout"] == "sandbox sandbox\n"
            protections = svc.detail()["runtimes"][language]["protections"]
            assert protections["egress_filter"] is False and protections["network_namespace"] is True
            assert "/nonexistent/pasta" in protections["network_refused"]
            assert _pastas(svc) == []
        finally:
            svc.stop()


FAILING_PASTA = {
    # ends before it has configured the namespace
    "before": """#!/bin/sh
echo started >> "$(dirname "$0")/calls"
echo "Failed to open tun device (simulated)" >&2
exit 1
""",
    # configures it (writes its pid file), then ends: the real pasta where its own seccomp filter is refused
    "after": """#!/bin/sh
echo started >> "$(dirname "$0")/calls"
while [ $# -gt 0 ]; do [ "$1" = --pid ] && echo $$ > "$2"; shift; done
echo "Failed to set up seccomp filter (simulated)" >&2
exit 1
""",
}


@pytest.fixture(params=sorted(FAILING_PASTA))
def failing_pasta(request):
    """A pasta that ends as it starts, before or after it has configured the namespace."""
    where = tempfile.mkdtemp(prefix="sandlot-failing-pasta-", dir="/var/tmp")
    path = os.path.join(where, "pasta")
    with open(path, "w") as f:
        f.write(FAILING_PASTA[request.param])
    os.chmod(path, 0o755)
    os.chmod(where, 0o777)  # the service's uid notes each start there
    yield path, "(simulated)"
    shutil.rmtree(where, ignore_errors=True)


def test_without_root_a_pasta_that_cannot_start_refuses_network_runs_and_others_are_served(world, failing_pasta):
    """pasta ending as it starts is not a broken zygote: runs without network are served, runs with
    network are refused (SANDLOT_UNFILTERED_EGRESS=refuse; by default served without network) with pasta's own
    words, and later zygotes do not try pasta again."""
    _needs_unprivileged_network()
    with inside(world.host):
        pasta, said = failing_pasta
        svc = unprivileged.service(
            SANDLOT_PASTA=pasta, SANDLOT_ZYGOTE_MAX_FORKS="10", SANDLOT_UNFILTERED_EGRESS="refuse"
        ).start()
        try:
            for language in LANGUAGES:
                refused = svc.run(
                    connect_code(language, [(PUBLIC, CANARY_PORT)]), language=language, enable_network=True
                )
                assert refused["code"] == -500, refused
                assert said in refused["message"] and "pasta" in refused["message"], refused
                protections = svc.detail()["runtimes"][language]["protections"]
                assert protections["egress_filter"] is False and protections["network_namespace"] is True
                assert said in protections["network_refused"]
            for _ in range(12):  # past the fork limit: the next zygotes start, without pasta
                assert run(svc, "print(6 * 7)")["stdout"] == "42\n"
            assert run(svc, HOSTNAME["nodejs"], "nodejs")["stdout"] == "sandbox sandbox\n"
            data = run(svc, connect_code("python3", [(PUBLIC, CANARY_PORT)]), "python3", enable_network=False)
            assert outcome(data["stdout"]) == {(PUBLIC, CANARY_PORT): REFUSED}, data
            with open(os.path.join(os.path.dirname(pasta), "calls")) as f:
                assert f.read().count("started") == len(LANGUAGES)  # once per runtime, at its first zygote
            assert svc.process.poll() is None
        finally:
            svc.stop()


def test_without_root_a_proxy_on_the_hosts_loopback_is_reachable_and_nothing_else_there(world):
    """pasta forwards the proxy's port, and only it, from the runs' namespace to the host's loopback."""
    _needs_unprivileged_network()
    with inside(world.host):
        proxy = Canary("127.0.0.1", 0)
        svc = unprivileged.service(HTTP_PROXY=f"http://127.0.0.1:{proxy.port}").start()
        try:
            targets = [("127.0.0.1", proxy.port), ("127.0.0.1", world.host_loopback.port), (PUBLIC, CANARY_PORT)]
            data = run(svc, connect_code("python3", targets), enable_network=True)
            assert outcome(data["stdout"]) == {
                ("127.0.0.1", proxy.port): "connected canary 127.0.0.1",
                ("127.0.0.1", world.host_loopback.port): REFUSED,
                (PUBLIC, CANARY_PORT): f"connected canary {PUBLIC}",
            }, data
        finally:
            svc.stop()
            proxy.close()
