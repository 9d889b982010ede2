"""Start a command as root of a user namespace of its own with a uid and gid map, as a container gets one.

    python tests/userns_map.py 0:0:1,1:100001:65535 -- command...

Each INSIDE:OUTSIDE:COUNT is a line of both maps. `podman run --uidmap 0:100000:65536` gives a container
65,536 ids; here root stays root (0:0:1) so that the host's files the command needs stay writable to it, and
the other 65,535 ids are mapped far from the host's. Either way the ids a Sandlot block starts at
(SANDLOT_UID_BASE, 1.5e9) are not mapped: setresuid and chown refuse them with EINVAL.

This process becomes the command (its pid is the command's), in the new user namespace; a helper child in
the old one writes the maps. Needs root.
"""

from __future__ import annotations

import ctypes
import os
import sys

CLONE_NEWUSER = 0x10000000


def main(argv: list[str]) -> None:
    spec, separator, *command = argv
    assert separator == "--" and command, __doc__
    lines = "".join(" ".join(part.split(":")) + "\n" for part in spec.split(","))
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    parent = os.getpid()
    helper = os.fork()
    if helper == 0:  # pragma: no cover - the helper, in the old namespace
        os.close(ready_w)
        os.read(ready_r, 1)  # the parent has unshared
        status = 1
        try:
            for name in ("uid_map", "gid_map"):
                with open(f"/proc/{parent}/{name}", "w") as f:
                    f.write(lines)
            status = 0
        finally:
            os.write(done_w, bytes([status]))
            os._exit(status)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWUSER) != 0:
        sys.exit(f"userns_map: unshare: {os.strerror(ctypes.get_errno())}")
    os.write(ready_w, b"x")
    answer = os.read(done_r, 1)
    os.waitpid(helper, 0)
    if answer != b"\0":
        sys.exit("userns_map: could not write the maps")
    os.setresgid(0, 0, 0)
    os.setresuid(0, 0, 0)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
