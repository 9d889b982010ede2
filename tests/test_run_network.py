"""Runs asking for network where egress cannot be filtered: none unless the operator says otherwise, and
socket calls that say why (SANDLOT_UNFILTERED_EGRESS, runtimes/jail/network_access.py).

The messages are checked here without the filter (it is what refuses the calls; the runner's hook and the
wrapper's patches only word the refusal), so nothing here reaches for the network: each call fails before
it would resolve a name or open a socket.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys

import pytest

from runtimes.jail.policy import network_access
from runtimes.nodejs.runtime import WRAPPER

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WHY = "egress rules by uid need CAP_NET_ADMIN"


def test_where_egress_can_be_filtered_the_setting_changes_nothing():
    for setting in network_access.CHOICES:
        assert network_access.decide(True, "", setting).kind == network_access.FILTERED


def test_otherwise_runs_get_no_network_unless_the_operator_chooses():
    none = network_access.decide(False, WHY, "no-network")
    assert none.kind == "none" and WHY in none.message and "SANDLOT_UNFILTERED_EGRESS" in none.message
    assert none.health() == {"network": "none", "network_reason": WHY}
    allowed = network_access.decide(False, WHY, "allow")
    assert allowed.kind == "unfiltered" and allowed.message == ""
    assert "loopback" in allowed.log_line and "allow" in allowed.log_line  # the start-up log warns
    refused = network_access.decide(False, WHY, "refuse")
    assert refused.kind == "refused" and refused.message.startswith("runs with network are refused: ")
    with pytest.raises(ValueError, match="SANDLOT_UNFILTERED_EGRESS='open'"):
        network_access.decide(False, WHY, "open")


def test_the_chroot_modes_reason_comes_from_the_record():
    assert network_access.chroot_reason(True, "") == ""
    assert "NET_ADMIN" in network_access.chroot_reason(False, "OSError: nft refused: Operation not permitted")
    assert "libnftables" in network_access.chroot_reason(False, "OSError: libnftables.so.1 is not installed")


PYTHON_RUN = """
import sys
sys.path.insert(0, {root!r})
from runtimes.python import runner
runner.refuse_network({message!r})
sys.exit(runner.execute({code!r}, ""))
"""

USER_CODE = """
import asyncio, socket, urllib.request
a, b = socket.socketpair()  # asyncio's own wake-up pipe: still there
a.send(b"x"); print("socketpair", b.recv(1))
print("asyncio", asyncio.run(asyncio.sleep(0, "ok")))
for call in (lambda: socket.create_connection(("192.0.2.1", 80), timeout=1),
             lambda: socket.socket(socket.AF_INET6, socket.SOCK_DGRAM),
             lambda: socket.getaddrinfo("example.com", 443)):
    try:
        call()
    except PermissionError as exc:
        print("refused", exc.errno, exc.strerror)
try:
    urllib.request.urlopen("http://192.0.2.1/", timeout=1)
except OSError as exc:
    print("urlopen", exc)
socket.create_connection(("192.0.2.1", 80))
"""


def test_a_python_run_is_told_why_its_socket_calls_fail():
    message = network_access.decide(False, WHY, "no-network").message
    code = PYTHON_RUN.format(root=ROOT, message=message, code=USER_CODE)
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=60)
    lines = out.stdout.splitlines()
    assert lines[:2] == ["socketpair b'x'", "asyncio ok"], out
    assert lines[2:5] == [f"refused 1 {message}"] * 3
    assert lines[5].startswith("urlopen <urlopen error [Errno 1] network is not available to runs here")
    assert out.returncode == 1
    assert f"PermissionError: [Errno 1] {message}" in out.stderr
    assert ROOT not in out.stderr  # the hook's frame names no path of the service


NODE_CODE = """
const seen = [];
const done = () => { if (seen.length === 6) console.log(JSON.stringify(seen.sort())); };
const note = (what) => (error) => { seen.push(`${what} ${error.code} ${error.message}`); done(); };
require('http').get('http://192.0.2.1/').on('error', note('http'));
require('net').connect(80, '192.0.2.1').on('error', note('net'));
require('dgram').createSocket('udp4').send('x', 53, '192.0.2.1', note('dgram'));
require('dns').lookup('example.com', note('dns'));
require('dns').promises.lookup('example.com').catch(note('dns.promises'));
fetch('http://192.0.2.1/').catch((error) => note('fetch')(error.cause));
"""


def test_a_node_run_is_told_why_its_network_calls_fail():
    node = shutil.which("node")
    if node is None:
        pytest.skip("no node here")
    message = network_access.decide(False, WHY, "no-network").message
    request = json.dumps({"code": NODE_CODE, "network_refused": message}).encode()
    out = subprocess.run(
        [node, WRAPPER],
        input=struct.pack("<I", len(request)) + request,
        capture_output=True,
        timeout=60,
        env={"LANG": "C.UTF-8"},
    )
    assert out.returncode == 0, out.stderr.decode()
    seen = json.loads(out.stdout)
    assert [line.split(" ", 1)[0] for line in seen] == ["dgram", "dns", "dns.promises", "fetch", "http", "net"]
    for line in seen:
        assert line.split(" ", 2)[1] == "EPERM" and line.endswith(message), line
