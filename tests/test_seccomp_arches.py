"""The jail's filters on both architectures Sandlot is built for, x86_64 and aarch64, read on this machine.

libseccomp drops a name its architecture lacks without a word (aarch64 has no open, stat, poll, dup2, pipe,
fork...), so a list written on x86_64 builds on aarch64 and may refuse what a run needs there. Here every name
of the allow-list resolves on each architecture or is declared with its stand-ins (allowlist.LEGACY_CALLS);
the program built for aarch64 (libseccomp's, exported here) allows each call and refuses each narrowed argument
as the x86_64 one does, run by a BPF interpreter (tests/bpf.py) on each architecture's numbers; and every
program, libseccomp's and the hand-written clock fence, kills a call made under another architecture.
"""

from __future__ import annotations

import errno

import pyseccomp
import pytest
from bpf import ALLOW, ERRNO, KILL_PROCESS, KILL_THREAD, Call, action, insns, run

from runtimes.jail.policy import allowlist
from runtimes.linux import seccomp as engine

X86_64, AARCH64 = int(pyseccomp.Arch.X86_64), int(pyseccomp.Arch.AARCH64)
ARCHES = {"x86_64": X86_64, "aarch64": AARCH64}
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}

# the calls allowed only with some arguments, besides the unconditional list
NARROWED = (
    "clone",
    "close_range",
    "socketpair",
    "fcntl",
    "fallocate",
    "setsockopt",
    "ioctl",
    "madvise",
    "fadvise64",
    "preadv2",
    "pwritev2",
    "kill",
    "tgkill",
    "tkill",
    "socket",
    "connect",
    *allowlist.SELF_ONLY,
)


def number(name: str, arch: int) -> int | None:
    return engine.syscall_number(name, arch)


def allowed_names() -> tuple[str, ...]:
    return (*allowlist.BASE_SYSCALLS, *NARROWED)


def test_audit_arches_are_the_kernels():
    assert {name: int(arch) for name, arch in ARCHES.items()} == AUDIT_ARCH


@pytest.mark.parametrize("arch_name", ARCHES)
def test_every_allowed_name_resolves_or_has_declared_stand_ins(arch_name):
    """A name an architecture lacks is one the list declares, with stand-ins that exist there and are allowed."""
    arch = ARCHES[arch_name]
    listed = set(allowed_names())
    missing = [name for name in allowed_names() if number(name, arch) is None]
    undeclared = [name for name in missing if name not in allowlist.LEGACY_CALLS]
    assert not undeclared, f"dropped on {arch_name} without a word: {undeclared}"
    for name in missing:
        for stand_in in allowlist.LEGACY_CALLS[name]:
            assert stand_in in listed, (name, stand_in)
            assert number(stand_in, arch) is not None, (arch_name, name, stand_in)


def test_the_declared_legacy_calls_are_x86_64s_and_all_missing_on_aarch64():
    """The declaration is exact: each is a call of x86_64 that aarch64 lacks, none is left over."""
    for name in allowlist.LEGACY_CALLS:
        assert number(name, X86_64) is not None, name
        assert number(name, AARCH64) is None, name
        assert name in allowlist.BASE_SYSCALLS, name


def test_aarch64_allows_what_x86_64_allows_or_its_stand_ins():
    """For each call the x86_64 list allows, aarch64's list allows it or every stand-in of it."""
    aarch64 = {name for name in allowed_names() if number(name, AARCH64) is not None}
    for name in allowed_names():
        if number(name, X86_64) is None:
            continue
        if name in aarch64:
            continue
        assert set(allowlist.LEGACY_CALLS[name]) <= aarch64, name


def test_never_allowed_names_cover_aarch64s_calls_by_their_own_names():
    """aarch64 names no call x86_64 lacks: NEVER_ALLOWED, read by name, is the same policy there."""
    for nr in range(0, 1024):
        try:
            name = engine.syscall_name(nr, AARCH64)
        except ValueError:
            continue
        assert number(name, X86_64) is not None, name


# ---- the programs, read by the interpreter --------------------------------------------------------------

THREAD = allowlist.CLONE_THREAD | allowlist.CLONE_FILES
CLONE_VM_SIGHAND = 0x00000100 | 0x00000800
SIGCHLD = 17


def program(arch: int, network: bool = True) -> bytes:
    return engine.export(allowlist.build(network, arch=arch))


def call(name: str, arch: int, *args: int) -> Call:
    nr = number(name, arch)
    assert nr is not None, name
    return Call(nr, arch, args)


@pytest.mark.parametrize("arch_name", ARCHES)
def test_each_architectures_program_allows_its_own_numbers_of_the_list(arch_name):
    arch = ARCHES[arch_name]
    bpf = program(arch, network=False)
    for name in allowlist.BASE_SYSCALLS:
        if number(name, arch) is None:
            continue
        assert run(bpf, call(name, arch)) == ALLOW, (arch_name, name)
    # and refuses what it never lists, on its own numbers
    for name in ("execve", "ptrace", "mount", "unshare", "bpf", "socket", "sysinfo"):
        assert run(bpf, call(name, arch)) == ERRNO | errno.EPERM, (arch_name, name)


@pytest.mark.parametrize("arch_name", ARCHES)
def test_each_architectures_program_narrows_arguments_alike(arch_name):
    """clone takes its flags first on both (the argument libseccomp tests), socket family, type and protocol."""
    arch = ARCHES[arch_name]
    bpf = program(arch)
    pthread = THREAD | CLONE_VM_SIGHAND | 0x00010000 | 0x00080000 | 0x00100000 | 0x00200000 | 0x00040000
    assert run(bpf, call("clone", arch, pthread, 0x7F0000, 0, 0, 0)) == ALLOW
    assert run(bpf, call("clone", arch, SIGCHLD, 0, 0, 0, 0)) == ERRNO | errno.EPERM  # fork through clone
    assert run(bpf, call("clone", arch, CLONE_VM_SIGHAND | 0x00010000, 0, 0, 0, 0)) == ERRNO | errno.EPERM
    assert run(bpf, call("clone3", arch)) == ERRNO | errno.ENOSYS
    af_inet, af_unix = allowlist.AF_INET, allowlist.AF_UNIX
    assert run(bpf, call("socket", arch, af_inet, allowlist.SOCK_STREAM, 0)) == ALLOW
    assert run(bpf, call("socket", arch, af_inet, allowlist.SOCK_STREAM | 0x80000, allowlist.IPPROTO_TCP)) == ALLOW
    assert run(bpf, call("socket", arch, af_inet, allowlist.SOCK_DGRAM, allowlist.IPPROTO_UDP)) == ALLOW
    assert run(bpf, call("socket", arch, af_inet, allowlist.SOCK_STREAM, 262)) == ERRNO | errno.EPERM  # MPTCP
    assert run(bpf, call("socket", arch, af_inet, allowlist.SOCK_DGRAM, 136)) == ERRNO | errno.EPERM  # UDP-Lite
    assert run(bpf, call("socket", arch, af_unix, allowlist.SOCK_STREAM, 0)) == ERRNO | errno.EPERM
    assert run(bpf, call("socketpair", arch, af_unix, allowlist.SOCK_STREAM, 0)) == ALLOW
    assert run(bpf, call("socketpair", arch, af_inet, allowlist.SOCK_STREAM, 0)) == ERRNO | errno.EPERM
    assert run(bpf, call("close_range", arch, 3, 10, allowlist.CLOSE_RANGE_UNSHARE)) == ERRNO | errno.EPERM
    assert run(bpf, call("fcntl", arch, 3, allowlist.F_SETPIPE_SZ, 1 << 20)) == ERRNO | errno.EPERM
    assert run(bpf, call("fadvise64", arch, 3, 0, 0, 4)) == ERRNO | errno.EPERM  # POSIX_FADV_DONTNEED
    assert run(bpf, call("preadv2", arch, 3, 0, 1, 0, 0, allowlist.RWF_NOWAIT)) == ERRNO | errno.EOPNOTSUPP
    assert run(bpf, call("getpgid", arch, 0)) == ALLOW
    assert run(bpf, call("getpgid", arch, 1)) == ERRNO | errno.EPERM


@pytest.mark.parametrize("arch_name", ARCHES)
def test_each_architectures_stand_ins_are_allowed(arch_name):
    arch = ARCHES[arch_name]
    bpf = program(arch, network=False)
    for stand_ins in allowlist.LEGACY_CALLS.values():
        for name in stand_ins:
            if name == "getpgid":
                assert run(bpf, call(name, arch, 0)) == ALLOW
            else:
                assert run(bpf, call(name, arch)) == ALLOW, (arch_name, name)


def other(arch_name: str) -> str:
    return next(name for name in ARCHES if name != arch_name)


@pytest.mark.parametrize("arch_name", ARCHES)
def test_libseccomps_programs_kill_a_call_of_another_architecture(arch_name):
    """The allow-list and the fence: an architecture's numbers mean other calls on another (x86_64's 57 fork is
    aarch64's close), so a call made under another arch never reaches the rules."""
    arch, foreign = ARCHES[arch_name], ARCHES[other(arch_name)]
    for bpf in (program(arch), engine.export(allowlist.fence_for(1234, arch))):
        assert insns(bpf)[0] == (0x20, 0, 0, engine.DATA_ARCH)  # the first load is seccomp_data.arch
        for nr in (0, 57, 59, 220, 221):
            assert action(run(bpf, Call(nr, foreign))) in (KILL_THREAD, KILL_PROCESS)


# ---- the hand-written clock fence -------------------------------------------------------------------------


def test_the_clock_fence_takes_this_machines_arch_and_numbers_from_libseccomp():
    arch, numbers = allowlist._clock_calls()
    assert arch == int(pyseccomp.system_arch())
    assert numbers == tuple(pyseccomp.resolve_syscall(arch, name) for name in allowlist.CLOCK_CALLS)
    assert all(n >= 0 for n in numbers)


@pytest.mark.parametrize("arch_name", ARCHES)
def test_the_clock_fence_checks_its_architecture_first(arch_name):
    arch = ARCHES[arch_name]
    calls = allowlist._clock_calls(arch)
    prefix = allowlist.clock_prefix(4321, calls)
    code = insns(prefix)
    assert code[0] == (engine.LD_ABS, 0, 0, engine.DATA_ARCH)
    assert code[1][0] == engine.JEQ and code[1][3] == AUDIT_ARCH[arch_name]
    assert code[2] == (engine.RET, 0, 0, engine.RET_KILL_PROCESS)
    # its numbers are that architecture's: clock_gettime is 228 on x86_64, 113 on aarch64
    assert {X86_64: 228, AARCH64: 113}[arch] in calls[1]


@pytest.mark.parametrize("arch_name", ARCHES)
def test_the_clock_fence_refuses_other_processes_clocks_and_kills_another_arch(arch_name):
    """Run as the kernel would: the prefix followed by the fence built for the same architecture."""
    arch, foreign = ARCHES[arch_name], ARCHES[other(arch_name)]
    pid = 4321
    bpf = allowlist.clock_prefix(pid, allowlist._clock_calls(arch)) + engine.export(allowlist.fence_for(pid, arch))

    def clock(pid_: int, kind: int) -> int:
        return ((~pid_) << 3 | kind) & 0xFFFFFFFF

    gettime = number("clock_gettime", arch)
    assert run(bpf, Call(gettime, arch, (0,))) == ALLOW  # CLOCK_REALTIME
    assert run(bpf, Call(gettime, arch, (clock(0, 2),))) == ALLOW  # its own, by pid 0
    assert run(bpf, Call(gettime, arch, (clock(pid, 2),))) == ALLOW  # its own, by pid
    assert run(bpf, Call(gettime, arch, (clock(1, 2),))) == ERRNO | errno.EINVAL  # pid 1's
    assert run(bpf, Call(number("kill", arch), arch, (1, 9))) == ERRNO | errno.EPERM
    assert run(bpf, Call(number("kill", arch), arch, (pid, 9))) == ALLOW
    # the same numbers under the other architecture: killed before any rule is read
    assert run(bpf, Call(gettime, foreign, (clock(1, 2),))) == KILL_PROCESS
    assert run(bpf, Call(number("kill", arch), foreign, (1, 9))) == KILL_PROCESS


def test_the_clock_fence_built_here_is_this_machines():
    """What a child loads (fence_program) is the native architecture's prefix and fence."""
    native = engine.native_arch()
    code = insns(bytes(allowlist.fence_program(999)._buffer))
    assert code[0] == (engine.LD_ABS, 0, 0, engine.DATA_ARCH) and code[1][3] == native
    assert code[2] == (engine.RET, 0, 0, engine.RET_KILL_PROCESS)


# ---- ALLOWED_SYSCALLS: the running architecture's numbers ----------------------------------------------------


def test_allowed_syscalls_are_read_as_the_running_architectures_numbers():
    """57 is fork on x86_64 (refused, named) and close on aarch64 (harmless); 220 is clone on aarch64."""
    with pytest.raises(ValueError, match=r"57 \(fork on x86_64\)"):
        allowlist.check_extra_syscalls([57], X86_64)
    assert allowlist.extra_syscall_names([57], AARCH64) == {57: "close"}
    with pytest.raises(ValueError, match=r"220 \(clone on aarch64\)"):
        allowlist.check_extra_syscalls([220], AARCH64)
    with pytest.raises(ValueError, match="not a system call on this machine"):
        allowlist.check_extra_syscalls([5000], AARCH64)
    # the native default is this machine's
    getcpu = number("getcpu", engine.native_arch())
    assert allowlist.extra_syscall_names([getcpu]) == {getcpu: "getcpu"}


def test_an_allowed_syscall_is_allowed_by_its_own_architectures_number():
    getcpu = {arch: number("getcpu", arch) for arch in (X86_64, AARCH64)}
    assert getcpu[X86_64] != getcpu[AARCH64]
    for arch in (X86_64, AARCH64):
        bpf = engine.export(allowlist.build(False, (getcpu[arch],), arch=arch))
        assert run(bpf, Call(getcpu[arch], arch)) == ALLOW
        assert run(engine.export(allowlist.build(False, arch=arch)), Call(getcpu[arch], arch)) == ERRNO | errno.EPERM
