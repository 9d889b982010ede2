"""The emulated arm64 machine's kill check (infra/arm64/vm.py): every seccomp kill its kernel printed on the console
is found and named, phase by phase, and a sign that the kernel dropped audit lines is reported, not read as none."""

from __future__ import annotations

import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location("arm64_vm", os.path.join(ROOT, "infra", "arm64", "vm.py"))
vm = importlib.util.module_from_spec(spec)
spec.loader.exec_module(vm)

# as Debian's arm64 kernel prints a seccomp kill (audit type 1326) on its console
KILLED = (
    "[  812.041233] audit: type=1326 audit(1796450000.123:45): auid=4294967295 uid=1500000003 gid=1500000003 "
    'ses=4294967295 subj=unconfined pid=4242 comm="python3" exe="/usr/bin/python3.11" sig=31 arch=c00000b7 '
    "syscall=173 compat=0 ip=0xffff8a3c4d2c code=0x80000000\n"
)


class Agent:
    """The machine's agent, answering the name lookup as pyseccomp does there."""

    def __init__(self):
        self.asked: list[str] = []

    def run(self, command: str, timeout: float = 900) -> tuple[int, str]:
        self.asked.append(command)
        return 0, "getppid\n"


def test_a_kill_on_the_console_is_found_once_and_named(tmp_path):
    console = tmp_path / "console.log"
    console.write_text("[    0.000000] Booting Linux on physical CPU 0x0000000000 [0x410fd083]\narm64: SANDLOT-READY\n")
    kills = vm.Kills(Agent(), str(console))
    assert kills.since() == ([], [])
    with open(console, "a") as f:
        f.write(KILLED + KILLED[:40])  # the next line still being written
    found, lost = kills.since()
    assert found == ["seccomp kill: python3 syscall 173 (getppid) sig 31 arch c00000b7"] and lost == []
    assert kills.since() == ([], [])  # read once, in the phase it happened in
    with open(console, "a") as f:
        f.write(KILLED[40:])  # the rest of the half-written line: a kill of the next phase
    assert len(kills.since()[0]) == 1


def test_dropped_audit_lines_are_reported(tmp_path):
    console = tmp_path / "console.log"
    console.write_text(
        "[  900.1] audit: printk limit exceeded\n[  900.2] kauditd_printk_skb: 12 callbacks suppressed\n"
        "[  900.3] audit: audit_lost=0 audit_rate_limit=0 audit_backlog_limit=64\n"
    )
    found, lost = vm.Kills(Agent(), str(console)).since()
    assert found == []
    assert lost == ["audit: printk limit exceeded", "kauditd_printk_skb: 12 callbacks suppressed"]
