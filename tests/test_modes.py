"""Jail mode selection: from the probed record and SANDLOT_JAIL; a mode that cannot keep tenants apart
refuses to serve and says why, never runs weakened."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest
import unprivileged
from service import wait_for

from runtimes.jail import modes
from runtimes.linux.protections import Protections

HERE = os.path.dirname(os.path.abspath(__file__))

ROOT = Protections(
    euid=0,
    seccomp=True,
    no_new_privs=True,
    dumpable=True,
    pdeathsig=True,
    user_namespaces=True,
    mount_namespaces=True,
    pid_namespaces=True,
    net_namespaces=True,
    chroot=True,
    setuid=True,
    rlimits=True,
    landlock=7,
    cgroups=True,
    host_nft=True,
    mknod=True,
)
# root in a container on default privileges: no namespaces, no NET_ADMIN
ROOT_IN_A_CONTAINER = dataclasses.replace(
    ROOT,
    user_namespaces=False,
    mount_namespaces=False,
    pid_namespaces=False,
    net_namespaces=False,
    host_nft=False,
    errors={"mount_namespaces": "PermissionError: [Errno 1] unshare: Operation not permitted"},
)
NOBODY = dataclasses.replace(ROOT, euid=65534, chroot=False, setuid=False, cgroups=False)
NO_NAMESPACES = dataclasses.replace(
    NOBODY,
    user_namespaces=False,
    mount_namespaces=False,
    pid_namespaces=False,
    net_namespaces=False,
    errors={"user_namespaces": "PermissionError: [Errno 1] Operation not permitted"},
)


@pytest.mark.parametrize(
    ("requested", "record", "one_at_a_time", "mode"),
    [
        ("auto", ROOT, False, modes.FULL),
        ("auto", NOBODY, False, modes.USERNS),
        ("auto", NO_NAMESPACES, True, modes.SINGLE),
        ("full", ROOT, False, modes.FULL),
        ("userns", ROOT, False, modes.USERNS),
        ("reduced", ROOT, False, modes.USERNS),
        ("reduced", NOBODY, False, modes.USERNS),
        ("single", NO_NAMESPACES, True, modes.SINGLE),
        ("auto", ROOT_IN_A_CONTAINER, False, modes.CHROOT_MODE),
        ("chroot", ROOT, False, modes.CHROOT_MODE),
        ("auto", NO_NAMESPACES, False, modes.LANDLOCK_MODE),  # a restricted pod (tests/test_landlock_mode.py)
    ],
)
def test_modes_chosen(requested, record, one_at_a_time, mode):
    assert modes.select(requested, record, one_at_a_time).name == mode.name


@pytest.mark.parametrize(
    ("requested", "record", "one_at_a_time", "why"),
    [
        ("auto", dataclasses.replace(NO_NAMESPACES, landlock=0), False, "no jail that keeps tenants apart"),
        ("full", NOBODY, False, "missing: root"),
        ("userns", NO_NAMESPACES, False, "user_namespaces (PermissionError"),
        ("reduced", NO_NAMESPACES, False, "user_namespaces (PermissionError"),
        ("single", NO_NAMESPACES, False, "one run at a time"),
        ("single", ROOT, True, "would run user code as root"),
        ("auto", dataclasses.replace(NO_NAMESPACES, euid=0, setuid=False), True, "no jail"),
        ("chroot", NOBODY, False, "missing: root"),
        ("chroot", dataclasses.replace(ROOT_IN_A_CONTAINER, chroot=False), False, "missing: chroot"),
        ("auto", dataclasses.replace(ROOT_IN_A_CONTAINER, setuid=False), False, "nor root's chroot (setuid"),
    ],
)
def test_modes_refused_with_the_reason(requested, record, one_at_a_time, why):
    with pytest.raises(modes.JailRefused) as refused:
        modes.select(requested, record, one_at_a_time)
    assert why in str(refused.value)


def test_a_chroot_jail_filters_egress_by_uid_only_where_it_may_install_the_rules():
    """Docker's default set has no NET_ADMIN: the row's nft rules by uid cannot be had, so it filters nothing
    (and SANDLOT_UNFILTERED_EGRESS decides what runs asking for network get); with NET_ADMIN, nft by uid."""
    assert modes.select("auto", ROOT_IN_A_CONTAINER, False).egress == modes.NO_EGRESS_FILTER
    granted = dataclasses.replace(ROOT_IN_A_CONTAINER, host_nft=True)
    chosen = modes.select("auto", granted, False)
    assert chosen.name == "chroot" and chosen.egress == modes.NFT_UID
    assert chosen.tree == modes.CHROOT and chosen.processes == modes.UID_SWEEP and chosen.tmp == modes.DIRECTORY
    assert chosen.own_uid and chosen.clone_flags == 0  # no namespace: clone with CLONE_NEW* is refused there


def test_a_container_without_user_namespaces_refuses_to_serve():
    """Unprivileged, no namespaces and no Landlock (a container's filter refuses them): runs are refused, health
    says why. (With Landlock, the landlock jail serves there: tests/test_landlock_mode.py.)"""
    if unprivileged.unavailable():
        pytest.skip(unprivileged.unavailable())
    svc = unprivileged.service()
    svc.log = open(svc.log_path, "wb")  # noqa: SIM115 - closed in stop()
    svc.process = subprocess.Popen(
        [
            sys.executable,
            os.path.join(HERE, "outer_filter.py"),
            "--uid",
            str(unprivileged.NOBODY),
            "--eperm",
            "unshare,landlock_create_ruleset",
            "--",
            svc.python,
            "-m",
            "handler.cli",
            "serve",
        ],
        env={**svc.env, "PYTHONPATH": svc.source},
        cwd="/",
        stdout=svc.log,
        stderr=subprocess.STDOUT,
    )
    try:
        assert wait_for(lambda: _refusal(svc), 60), svc.output()
        envelope = svc.run("print(1)")
        assert envelope["code"] == -500 and "no jail that keeps tenants apart" in envelope["message"]
    finally:
        svc.stop()


def _refusal(svc) -> bool:
    try:
        detail = svc.detail()
    except Exception:  # noqa: BLE001 - not up yet
        return False
    return "no jail that keeps tenants apart" in detail["runtimes"]["python3"]["error"]


WITH_TUN = dataclasses.replace(NOBODY, netns_egress=True)


@pytest.mark.parametrize(
    ("record", "pasta", "refused"),
    [
        (WITH_TUN, "sh", ""),  # any program found on PATH stands for pasta here
        (NO_NAMESPACES, "sh", "none can be made here"),
        (NOBODY, "sh", "nftables in a network namespace and /dev/net/tun"),
        (
            dataclasses.replace(WITH_TUN, seccomp=False, errors={"seccomp": "OSError: [Errno 125]"}),
            "sh",
            "pasta ends where its own seccomp filter cannot be installed, as here (OSError: [Errno 125])",
        ),
        (WITH_TUN, "/nonexistent/pasta", "need pasta (apt-get install passt): '/nonexistent/pasta' not found"),
        (WITH_TUN, "", "SANDLOT_PASTA is empty"),
    ],
)
def test_network_without_root_is_served_only_where_pasta_can_work(record, pasta, refused):
    """Runs with network without root: served through pasta, or refused with the reason, never unfiltered."""
    from runtimes.linux.pasta import namespace_network

    network = namespace_network(record, pasta, (), ())
    assert network.in_force is (not refused)
    assert (refused in network.refused) if refused else network.refused == ""
    assert network.netns is record.net_namespaces  # runs without network never share the host's stack
    if refused:
        assert network.zygote_config()["ruleset"] == ""  # no pasta is started for it
    else:
        failed = network.failed("pasta could not set up the runs' network: it said no")
        assert not failed.in_force and failed.refused.endswith("it said no")


@pytest.mark.parametrize(
    ("mode", "protected", "refused"),
    [("chroot", False, True), ("chroot", True, False), ("full", False, False), ("landlock", False, False)],
)
def test_links_are_refused_to_runs_only_in_the_chroot_mode_where_the_kernel_lets_anyone_link(mode, protected, refused):
    """The chroot mode's cells hold hard links to the tree's files on the filesystem of the run's own /tmp: where
    fs.protected_hardlinks is 0 a run's filter refuses link(2) (allowlist.build's refuse_links). Elsewhere /tmp is
    another filesystem (a tmpfs: EXDEV) or Landlock refuses the link, and nothing changes."""
    from runtimes.config import RuntimeConfig
    from runtimes.python.runtime import PythonRuntime

    runtime = PythonRuntime(RuntimeConfig())
    runtime.mode = modes.MODES[mode]
    runtime.platform = dataclasses.replace(ROOT_IN_A_CONTAINER, protected_hardlinks=protected)
    assert runtime.runner_config().refuse_links is refused


def test_hard_links_count_as_protected_only_where_the_kernel_says_1(tmp_path):
    from runtimes.linux.protections import hardlinks_protected

    (tmp_path / "on").write_text("1\n")
    (tmp_path / "off").write_text("0\n")
    assert hardlinks_protected(str(tmp_path / "on"))
    assert not hardlinks_protected(str(tmp_path / "off"))
    assert not hardlinks_protected(str(tmp_path / "missing"))  # a kernel without the setting protects nothing
