"""Landlock: what a run may touch, enforced by the kernel for it and everything it starts.

A run's domain allows reading and executing the tree, writing its own /tmp and
the device nodes, and nothing else of the filesystem; no TCP port may be bound
(ABI 4); no signal may reach, and no abstract unix socket be connected to, a
process outside the domain (ABI 6: each run's domain is its own, so another
run, a child waiting for a later run, the zygote and the service are all
outside). Rights the kernel's ABI does not know are left out, so the same call
works from ABI 1 up; `restrict` says which ABI it used (0: no Landlock here).

Where runs share the service's uid without a tree of their own (the landlock mode), the readable places are
only what the runtime's tree would hold (landlock_mode.py) instead of the whole of "/"; and where runs with
network may only reach the operator's proxy (proxy_egress.py), TCP connect (ABI 4) is handled too, allowed
to the proxies' ports only.

In every mode a domain also closes every process outside it to ptrace access, and so
/proc/<pid>/mem, environ and fd: in `single` (Lambda), where the run shares the uid of the
runtime client and the zygote and prctl cannot make them non-dumpable, that is what keeps
them out of the run's reach; its writable place is then the run's own directory.

Standard library only (the zygote imports it before it confines itself).
"""

from __future__ import annotations

import ctypes
import os
import stat
import struct

_SYS_CREATE_RULESET = 444  # the same numbers on every architecture
_SYS_ADD_RULE = 445
_SYS_RESTRICT_SELF = 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1

EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
_ABI1_FS = (1 << 13) - 1  # execute .. make_sym
REFER = 1 << 13  # ABI 2
TRUNCATE = 1 << 14  # ABI 3
_FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE  # the rights a rule on a file (not a directory) may carry
BIND_TCP = 1 << 0  # ABI 4 (network rights)
CONNECT_TCP = 1 << 1
NETWORK_ABI = 4  # the first ABI with TCP port rules
_RULE_NET_PORT = 2
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall  # resolved here, once: in the zygote, not in every child
_RULE = struct.Struct("<Qi")  # struct landlock_path_beneath_attr: allowed_access, parent_fd


def _call(number: int, *args) -> int:
    result = _syscall(ctypes.c_long(number), *args)
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"landlock ({number}): {os.strerror(err)}")
    return result


def abi_version() -> int:
    """The kernel's Landlock ABI version; OSError (ENOSYS, EOPNOTSUPP, ...) where there is none."""
    return _call(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))


def _filesystem_rights(abi: int) -> int:
    rights = _ABI1_FS
    if abi >= 2:
        rights |= REFER
    if abi >= 3:
        rights |= TRUNCATE
    return rights  # device ioctls (ABI 5) stay unhandled: terminals' and pipes' ioctls are harmless


class Prepared:
    """The part of a domain that is the same for every run of a zygote, made once by the zygote inside its
    tree: the ruleset's attributes, and the tree's root and device nodes held open (O_PATH, close-on-exec)
    with their rules packed. A child then only adds its own writable place and enters the domain
    (`restrict`), then closes what it inherited of this before user code (child.confine)."""

    def __init__(
        self,
        abi: int,
        devices: tuple[str, ...],
        readable: tuple[str, ...] = ("/",),
        connect_ports: tuple[int, ...] | None = None,
        listable: tuple[str, ...] = (),
    ):
        """readable: the places a run may read and execute (files or directories; those missing here are left
        out). connect_ports (ABI 4+): None leaves TCP connect unhandled; a tuple allows it to those ports only
        (empty: to none). listable: directories whose names (theirs and their subdirectories') may be listed,
        not their files read (a layer build's view of the service's site-packages: pip's own directory alone
        is readable in it)."""
        self.handled_fs = _filesystem_rights(abi)
        network = BIND_TCP | (CONNECT_TCP if connect_ports is not None else 0)
        if connect_ports is not None and abi < 4:
            raise OSError(f"TCP connect rules need Landlock ABI 4 or later; this kernel gives ABI {abi}")
        attr = struct.pack("<Q", self.handled_fs)
        if abi >= 4:
            attr += struct.pack("<Q", network)
        if abi >= 6:
            attr += struct.pack("<Q", SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL)
        self._attr = ctypes.create_string_buffer(attr, len(attr))
        self._attr_size = ctypes.c_size_t(len(attr))
        file_rights = WRITE_FILE | READ_FILE | (TRUNCATE if abi >= 3 else 0)
        wanted = [(path, EXECUTE | READ_FILE | READ_DIR) for path in readable]
        wanted += [(d, file_rights) for d in devices]
        wanted += [(path, READ_DIR) for path in listable]
        self._fds: list[int] = []
        self._rules = []
        self._net_rules = [_net_rule(CONNECT_TCP, port) for port in connect_ports or ()]
        try:
            for path, rights in wanted:
                try:
                    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
                except FileNotFoundError:
                    continue
                self._fds.append(fd)
                if not stat.S_ISDIR(os.fstat(fd).st_mode):
                    rights &= _FILE_RIGHTS  # a file's rule may only carry a file's rights
                if not rights & self.handled_fs:
                    os.close(fd)
                    self._fds.pop()
                    continue
                self._rules.append(_rule(rights & self.handled_fs, fd))
        except BaseException:
            self.close()
            raise

    def restrict(self, writable: tuple[str, ...]) -> None:
        """Confine the calling process (no_new_privs must be set): the fixed rules, and writable places."""
        ruleset = _call(_SYS_CREATE_RULESET, self._attr, self._attr_size, ctypes.c_uint32(0))
        try:
            for rule in self._rules:
                _add_rule(ruleset, rule)
            for rule in self._net_rules:
                _call(_SYS_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_RULE_NET_PORT), rule, ctypes.c_uint32(0))
            for path in writable:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
                try:
                    _add_rule(ruleset, _rule(self.handled_fs & ~EXECUTE, fd))
                finally:
                    os.close(fd)
            _call(_SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0))
        finally:
            os.close(ruleset)

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds = []


def restrict(
    abi: int,
    writable: tuple[str, ...],
    devices: tuple[str, ...],
    readable: tuple[str, ...] = ("/",),
    connect_ports: tuple[int, ...] | None = None,
    listable: tuple[str, ...] = (),
) -> None:
    """Confine the calling process (no_new_privs must be set) to the rules above, in one step."""
    prepared = Prepared(abi, devices, readable, connect_ports, listable)
    try:
        prepared.restrict(writable)
    finally:
        prepared.close()


def _rule(rights: int, fd: int) -> ctypes.Array:
    return ctypes.create_string_buffer(_RULE.pack(rights, fd), _RULE.size)


_NET_RULE = struct.Struct("<QQ")  # struct landlock_net_port_attr: allowed_access, port


def _net_rule(rights: int, port: int) -> ctypes.Array:
    return ctypes.create_string_buffer(_NET_RULE.pack(rights, port), _NET_RULE.size)


def _add_rule(ruleset: int, rule: ctypes.Array) -> None:
    _call(_SYS_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH), rule, ctypes.c_uint32(0))
