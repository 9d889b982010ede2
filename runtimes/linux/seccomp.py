"""seccomp as an engine: libseccomp's filters (pyseccomp) as BPF programs, rules on argument ranges, a small
assembler for the hand-written programs, and a probe that loads a program in a throwaway child.

No policy here: what a run, a build or a zygote may call is the jail's (runtimes/jail/policy/allowlist.py) or the
build's (layers/). Every program, libseccomp's and the hand-written ones, starts by checking the architecture it
was built for.
"""

from __future__ import annotations

import os
import struct
import sys

from runtimes.linux.libseccomp import pyseccomp
from runtimes.linux.syscalls import SeccompProgram, set_no_new_privs

# struct seccomp_data's offsets, and the classic BPF instructions the hand-written programs use
DATA_NR, DATA_ARCH, DATA_ARG0 = 0, 4, 16
LD_ABS, JEQ, JGT, JGE, SUB, RET = 0x20, 0x15, 0x25, 0x35, 0x14, 0x06
RET_KILL_PROCESS, RET_ALLOW, RET_ERRNO = 0x80000000, 0x7FFF0000, 0x00050000
LITTLE_ENDIAN = sys.byteorder == "little"
INSN = "HBBI"  # struct sock_filter: code, jt, jf, k

# The architectures Sandlot is built for, by the audit arch a filter's seccomp_data.arch holds (libseccomp's
# SCMP_ARCH_* values are these), and the name `uname -m` gives them
ARCHITECTURES = {pyseccomp.Arch.X86_64: "x86_64", pyseccomp.Arch.AARCH64: "aarch64"}


def native_arch() -> int:
    """This machine's audit arch (AUDIT_ARCH_X86_64 0xc000003e, AUDIT_ARCH_AARCH64 0xc00000b7...)."""
    return int(pyseccomp.system_arch())


def arch_name(arch: int | None = None) -> str:
    arch = native_arch() if arch is None else arch
    return ARCHITECTURES.get(arch, f"audit arch {arch:#x}")


def syscall_number(name: str, arch: int | None = None) -> int | None:
    """The number of a system call on an architecture (this machine's by default), None where it has none:
    libseccomp answers a negative pseudo-number for a name it knows of another architecture only (open on
    aarch64) and -1 for a name it does not know at all (one newer than itself)."""
    number = pyseccomp.resolve_syscall(native_arch() if arch is None else arch, name)
    return int(number) if number >= 0 else None


def syscall_name(number: int, arch: int | None = None) -> str:
    """The name libseccomp gives a system call number on an architecture (this machine's by default);
    ValueError for a number that is none there."""
    name = pyseccomp.resolve_syscall(native_arch() if arch is None else arch, number)
    return name.decode() if isinstance(name, bytes) else str(name)


def for_arch(flt: pyseccomp.SyscallFilter, arch: int | None) -> pyseccomp.SyscallFilter:
    """flt made for another architecture than this machine's (its rules then resolve names there): what the tests
    read on x86_64 of the programs an aarch64 machine builds. None: unchanged (this machine's)."""
    native = native_arch()
    if arch is not None and arch != native:
        flt.add_arch(arch)
        flt.remove_arch(native)
    return flt


def all_but(excluded: set[int], below: int) -> tuple[tuple[int, int], ...]:
    """(mask, value) pairs that together match every value from 0 to below (a power of two) but the excluded
    ones: aligned blocks, each tested on an argument's low 32 bits, all of them (the kernel reads an int
    argument's low 32 bits whatever the upper ones say, so a test of all 64 would let a caller past a rule
    with bits the kernel never reads, and a test of fewer would let values past `below` through)."""
    pairs = []

    def cover(low: int, size: int) -> None:
        if not any(low <= value < low + size for value in excluded):
            pairs.append((0xFFFFFFFF & ~(size - 1), low))
        elif size > 1:
            cover(low, size // 2)
            cover(low + size // 2, size // 2)

    cover(0, below)
    return tuple(pairs)


def allow(flt: pyseccomp.SyscallFilter, name: str, *args: pyseccomp.Arg) -> None:
    try:
        flt.add_rule(pyseccomp.ALLOW, name, *args)
    except (ValueError, OSError):
        pass  # not a system call on this architecture (e.g. "open" on arm64)


def refuse(flt: pyseccomp.SyscallFilter, error: int, name: str) -> None:
    try:
        flt.add_rule(pyseccomp.ERRNO(error), name)
    except (ValueError, OSError):
        pass  # not a system call on this architecture (e.g. "times" on some)


def assemble(code: list[tuple]) -> bytes:
    """BPF bytes for code: (op, jt, jf, k) instructions and (label,) markers; a jump given as a label's name
    goes there (forward only, as classic BPF jumps)."""
    labels, index = {}, 0
    for item in code:
        if len(item) == 1:
            labels[item[0]] = index
        else:
            index += 1
    program, index = [], 0
    for item in code:
        if len(item) == 1:
            continue
        op, jt, jf, k = item
        index += 1
        jt = labels[jt] - index if isinstance(jt, str) else jt
        jf = labels[jf] - index if isinstance(jf, str) else jf
        program.append(struct.pack(INSN, op, jt, jf, k & 0xFFFFFFFF))
    return b"".join(program)


def export(flt: pyseccomp.SyscallFilter) -> bytes:
    fd = os.memfd_create("sandlot-seccomp", os.MFD_CLOEXEC)
    try:
        with os.fdopen(os.dup(fd), "wb") as sink:
            flt.export_bpf(sink)
        size = os.lseek(fd, 0, os.SEEK_END)
        return os.pread(fd, size, 0)
    finally:
        os.close(fd)


def compile_program(flt: pyseccomp.SyscallFilter) -> SeccompProgram:
    """libseccomp's BPF for the filter, ready to load in a child with one call."""
    return SeccompProgram(export(flt))


def probe(program: SeccompProgram) -> str | None:
    """Load the filter in a throwaway child: some platforms refuse seccomp(), some kill the caller. None if it loads."""
    from runtimes.linux.protections import in_child

    def load() -> None:
        set_no_new_privs()
        program.load()

    return in_child(load)[1] or None
