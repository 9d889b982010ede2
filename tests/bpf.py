"""Classic BPF, run here as the kernel runs a seccomp filter: what a program answers for a call made on any
architecture, read on this machine (an aarch64 call on x86_64 too).

The instructions libseccomp emits and runtimes/linux/seccomp.py assembles: loads of seccomp_data's words
(absolute), of the scratch memory and of constants, stores, ALU on constants, conditional and unconditional
jumps, returns. Anything else raises: a program this reads wrongly must not pass a test.
"""

from __future__ import annotations

import operator
import struct
from dataclasses import dataclass

# the return's action (its top 16 bits) and errno (its low 16)
KILL_PROCESS, KILL_THREAD, TRAP, ERRNO, ALLOW = 0x80000000, 0x00000000, 0x00030000, 0x00050000, 0x7FFF0000
ACTION_MASK = 0xFFFF0000
ALU = {
    0x00: operator.add,
    0x10: operator.sub,
    0x20: operator.mul,
    0x40: operator.or_,
    0x50: operator.and_,
    0x60: operator.lshift,
    0x70: operator.rshift,
    0xA0: operator.xor,
}


@dataclass(frozen=True)
class Call:
    """struct seccomp_data: nr, arch, instruction_pointer, args[6]."""

    nr: int
    arch: int
    args: tuple[int, ...] = ()
    ip: int = 0

    def data(self) -> bytes:
        args = (tuple(self.args) + (0,) * 6)[:6]
        return struct.pack("<iIQ6Q", self.nr, self.arch, self.ip, *(a & 0xFFFFFFFFFFFFFFFF for a in args))


def run(program: bytes, call: Call) -> int:
    """The 32-bit value the program returns for call."""
    insns = list(struct.iter_unpack("HBBI", program))
    data = call.data()
    a = x = 0
    mem = [0] * 16
    pc = 0
    while True:
        code, jt, jf, k = insns[pc]
        pc += 1
        cls = code & 0x07
        if code == 0x20:  # LD W ABS
            (a,) = struct.unpack_from("<I", data, k)
        elif code == 0x00:  # LD W IMM
            a = k
        elif code == 0x60:  # LD W MEM
            a = mem[k]
        elif code == 0x01:  # LDX W IMM
            x = k
        elif code == 0x61:  # LDX W MEM
            x = mem[k]
        elif code == 0x02:  # ST
            mem[k] = a
        elif code == 0x03:  # STX
            mem[k] = x
        elif code == 0x07:  # MISC TAX
            x = a
        elif code == 0x87:  # MISC TXA
            a = x
        elif cls == 0x04:  # ALU
            op, src = code & 0xF0, code & 0x08
            operand = x if src else k
            a = (-a if op == 0x80 else ALU[op](a, operand)) & 0xFFFFFFFF
        elif code == 0x05:  # JA
            pc += k
        elif cls == 0x05:  # conditional jumps on K or X
            op, src = code & 0xF0, code & 0x08
            operand = x if src else k
            taken = {
                0x10: a == operand,
                0x20: a > operand,
                0x30: a >= operand,
                0x40: bool(a & operand),
            }[op]
            pc += jt if taken else jf
        elif code == 0x06:  # RET K
            return k
        elif code == 0x16:  # RET A
            return a
        else:
            raise ValueError(f"instruction {code:#x} at {pc - 1} is not one this reads")


def action(value: int) -> int:
    return value & ACTION_MASK


def insns(program: bytes) -> list[tuple[int, int, int, int]]:
    return list(struct.iter_unpack("HBBI", program))
