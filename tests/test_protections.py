"""The protections record: each mechanism probed in a child of its own, refusals reported, never fatal."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import unprivileged
from conftest import needs_root

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PROBE = "import json; from runtimes.linux.protections import probe; print(json.dumps(probe().to_dict()))"


def probe_under(*restrictions: str) -> dict:
    """The record as a process under an outer filter sees it."""
    out = subprocess.run(
        [sys.executable, os.path.join(HERE, "outer_filter.py"), *restrictions, "--", sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=True,
    )
    return json.loads(out.stdout)


def test_the_machine_itself_offers_seccomp_and_limits():
    from runtimes.linux.protections import probe

    record = probe()
    assert record.seccomp and record.no_new_privs and record.rlimits and record.pdeathsig, record.errors
    assert "/tmp" in record.writable
    assert record.privileged == (os.geteuid() == 0)


@needs_root
def test_refused_prctl_and_seccomp_are_reported():
    record = probe_under("--eperm", "prctl,seccomp")
    for name in ("seccomp", "no_new_privs", "dumpable", "pdeathsig"):
        assert record[name] is False, name
        assert record["errors"][name]
    assert "Operation not permitted" in record["errors"]["no_new_privs"]
    assert record["rlimits"] is True


@needs_root
def test_a_probe_killed_by_sigsys_is_reported_not_fatal():
    record = probe_under("--sigsys", "unshare")
    for name in ("user_namespaces", "mount_namespaces", "pid_namespaces", "net_namespaces"):
        assert record[name] is False
        assert record["errors"][name] == "the probe was killed by SIGSYS"
    assert record["seccomp"] is True  # the rest still probed


def _as_unprivileged(tmp_path, uid: int, code: str, *outer: str) -> str:
    """Debian's interpreter running code as uid under tests/outer_filter.py (outer: its other options), from a
    directory that uid can enter; its stdout. Skips where that uid has no interpreter (an unprivileged uid cannot
    execute the pyenv one: see README) or cannot read the project."""
    os.chmod(tmp_path, 0o755)
    python = "/usr/bin/python3.11"
    if not os.access(python, os.X_OK):
        pytest.skip("needs /usr/bin/python3.11 for an unprivileged interpreter")
    out = subprocess.run(
        [sys.executable, os.path.join(HERE, "outer_filter.py"), "--uid", str(uid), *outer, "--", python, "-c", code],
        capture_output=True,
        text=True,
        cwd=str(tmp_path),
        timeout=60,
    )
    if out.returncode != 0 and "Permission denied" in out.stderr:
        pytest.skip(f"the project is not readable by uid {uid}: {out.stderr.strip()[-200:]}")
    return out.stdout


@needs_root
@pytest.mark.parametrize("uid", [65534])
def test_an_unprivileged_uid_cannot_change_identity_or_chroot(uid, tmp_path):
    code = (
        f"import sys; sys.path.insert(0, {unprivileged.source()!r}); "
        "import json; from runtimes.linux import protections as p; "
        "p._PROBES.pop('seccomp'); "  # pyseccomp lives in a venv this uid cannot read
        "r = {n: p.in_child(f) for n, f in p._PROBES.items()}; print(json.dumps(r))"
    )
    record = json.loads(_as_unprivileged(tmp_path, uid, code))
    assert record["setuid"][0] is None and "Operation not permitted" in record["setuid"][1]
    assert record["chroot"][0] is None
    assert "/etc" not in record["writable"][0]


@needs_root
def test_root_on_a_host_can_install_egress_rules_and_make_device_nodes():
    from runtimes.linux.protections import probe

    record = probe()
    assert record.mknod, record.errors.get("mknod")
    assert record.host_nft, record.errors.get("host_nft")
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    assert "sandlot_probe" not in tables  # the probe's table never outlives its transaction


def _table(name: str) -> str:
    return subprocess.run(["nft", "list", "table", "inet", name], capture_output=True, text=True).stdout


@needs_root
@pytest.mark.skipif(not shutil.which("nft"), reason="needs nft")
def test_egress_rules_replace_a_crashed_instances_table_in_one_nft_and_a_refused_set_leaves_none(monkeypatch):
    """The service's start execs nft once per uid block (it was twice: a delete, then the rules); the table a
    killed instance left is replaced in the same transaction, and where nft refuses the new rules nothing of that
    block's table stays."""
    from runtimes.linux import egress

    first = 1_999_990_000 + os.getpid() % 1000  # a block no instance uses
    stale = egress.output_table(f"sandlot_{first}", ['meta skuid 1 counter accept comment "stale"'])
    subprocess.run(["nft", "-f", "-"], input=stale, text=True, check=True)
    calls = []
    real_run = subprocess.run

    def counted(argv, *args, **kwargs):
        calls.append(argv)
        return real_run(argv, *args, **kwargs)

    monkeypatch.setattr(egress.subprocess, "run", counted)
    rules = egress.EgressFilter(first, first + 99)
    try:
        assert rules.install(), rules.error
        assert len(calls) == 1
        table = _table(rules.table)
        assert "stale" not in table and f"meta skuid {first}-{first + 99}" in table
        subprocess.run(["nft", "-f", "-"], input=stale, text=True, check=True)  # left again by a killed instance
        monkeypatch.setattr(rules, "ruleset", lambda: f"table inet {rules.table} {{ chain output {{ bogus }} }}\n")
        assert not rules.install() and "nft refused the rules" in rules.error
        assert _table(rules.table) == ""
    finally:
        real_run(["nft", "delete", "table", "inet", f"sandlot_{first}"], capture_output=True)


@needs_root
def test_a_default_container_has_no_egress_rules_but_device_nodes():
    """Docker's default set keeps MKNOD but not NET_ADMIN: the chroot mode's tree gets real /dev nodes,
    and its runs with network cannot be filtered."""
    record = probe_under("--caps", "docker-default", "--profile", "docker-default")
    assert record["mknod"] is True and record["chroot"] is True and record["setuid"] is True
    assert record["host_nft"] is False and "Operation not permitted" in record["errors"]["host_nft"]
    # said from the capability set, without loading libnftables into the probe's child
    assert "no CAP_NET_ADMIN" in record["errors"]["host_nft"]


@needs_root
def test_without_mknod_device_nodes_are_reported_missing():
    record = probe_under("--caps", "setuid,setgid,sys_chroot,net_admin")
    assert record["mknod"] is False and "Operation not permitted" in record["errors"]["mknod"]
    assert record["host_nft"] is True


@needs_root
def test_what_the_process_itself_rules_out_is_said_without_a_child_and_the_record_is_the_same(tmp_path):
    """A Lambda-like platform (no capabilities, no user namespaces): the mechanisms the process's own state rules
    out are reported missing, saying why, without a child each (a fork of a Lambda function's init is a few ms of
    its CPU); every value is still the one a child of its own finds."""
    code = (
        f"import sys; sys.path.insert(0, {unprivileged.source()!r}); "
        "import json, os; from runtimes.linux import protections as p\n"
        "def no_pyseccomp():\n"  # pyseccomp lives in a venv this uid cannot read
        "    raise ImportError('no pyseccomp for this uid')\n"
        "p._PROBES['seccomp'] = no_pyseccomp\n"
        "each = {n: p.in_child(f) for n, f in p._PROBES.items()}\n"
        "forks, fork = [], os.fork\n"
        "os.fork = lambda: forks.append(1) or fork()\n"
        "record = p.probe().to_dict()\n"
        "print(json.dumps({'each': each, 'record': record, 'forks': len(forks)}))"
    )
    found = json.loads(_as_unprivileged(tmp_path, 65534, code, "--eperm", "unshare"))
    each, record = found["each"], found["record"]
    for name, (value, error) in each.items():
        expected = {"writable": value or [], "landlock": value or 0}.get(name, bool(value))
        assert record[name] == expected, (name, each[name])
        assert bool(record["errors"].get(name)) == bool(error), (name, record["errors"].get(name), error)
    for name, capability in (("setuid", "CAP_SETUID"), ("chroot", "CAP_SYS_CHROOT"), ("mknod", "CAP_MKNOD")):
        assert capability in record["errors"][name] and "Operation not permitted" in record["errors"][name]
    for name in ("mount_namespaces", "pid_namespaces", "net_namespaces", "netns_egress", "hostname"):
        assert "user namespace" in record["errors"][name], record["errors"][name]
    # seccomp, no_new_privs, dumpable, pdeathsig, user_namespaces, rlimits, landlock, writable (/tmp): 19 before
    assert found["forks"] <= 8, found["forks"]


def _run(script: str) -> str:
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_a_probe_started_ahead_gives_the_record_this_process_would_probe():
    """`sandlot serve` has a forked child probe while it loads its code (its probe children side by side): the
    record it reads is the one probing in the process gives."""
    ahead, here = json.loads(
        _run(
            "import json\nfrom runtimes.linux import protections as p\n"
            "assert p.probe_ahead()\nahead = p.platform_protections().to_dict()\n"
            "print(json.dumps([ahead, p.probe().to_dict()]))"
        )
    )
    assert set(ahead.pop("errors")) == set(here.pop("errors"))
    assert ahead == here


def test_a_probe_started_ahead_and_never_read_leaves_no_process():
    """A start that stops before its runtimes ask for the record (a refused setting) ends the prober."""
    _run(
        "import os\nfrom runtimes.linux import protections as p\n"
        "assert p.probe_ahead()\npid = p._ahead[0]\np.cancel_ahead()\n"
        "assert not os.path.exists(f'/proc/{pid}')\n"
        "try:\n    os.waitpid(-1, os.WNOHANG)\n    raise SystemExit('a child is left')\n"
        "except ChildProcessError:\n    pass\n"
    )


def test_no_probe_is_started_ahead_once_another_thread_runs():
    """A fork then could copy a lock another thread holds: the record is probed in the process instead."""
    _run(
        "import threading\nfrom runtimes.linux import protections as p\n"
        "stop = threading.Event()\nt = threading.Thread(target=stop.wait)\nt.start()\n"
        "assert not p.probe_ahead()\nassert p.platform_protections().rlimits\nstop.set()\nt.join()\n"
    )
