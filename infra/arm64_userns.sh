#!/usr/bin/env bash
# Runs a command where this x86_64 machine can execute arm64 (aarch64) programs, and nothing else sees it:
#
#   infra/arm64_userns.sh COMMAND [ARG...]      # as root
#
# The command runs in a user namespace of its own (every id mapped to itself: root stays root, files keep their
# owners) and a mount namespace of its own, with a binfmt_misc instance of its own (Linux 6.7 and later let a user
# namespace mount one) in which Debian's qemu-user-static is registered for aarch64 ELF files, with the flag F
# (the emulator is opened once, here: it runs in chroots and containers too). What `podman build --platform
# linux/arm64` needs for a Dockerfile's RUN steps, and debootstrap's second stage of an arm64 root. The machine's
# own binfmt_misc (not mounted in this container) and every other process are left alone: other runs and tests
# on the machine never meet an emulated program.
#
# qemu-user emulates the CPU, not the kernel's seccomp for its guest: a jail started under it is no proof of the
# jail on arm64 (infra/arm64_test.sh boots a real arm64 kernel for that).
#
# podman in here is root in a user namespace: give it a storage of its own (`podman --root DIR --runroot DIR`),
# not the machine's rootful one, which other runs use at the same time (infra/standins.sh, arm64_podman).
set -euo pipefail

[ $# -gt 0 ] || { echo "usage: $0 COMMAND [ARG...]" >&2; exit 2; }
QEMU=/usr/libexec/qemu-binfmt/aarch64-binfmt-P
# qemu-user-static's own registration (/usr/lib/binfmt.d/qemu-aarch64.conf), aarch64's ELF header
MAGIC='\x7f\x45\x4c\x46\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00'
MASK='\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff'

USERNS='
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWUSER, CLONE_NEWNS, MS_REC, MS_PRIVATE = 0x10000000, 0x00020000, 0x4000, 0x40000
ready, go = os.pipe(), os.pipe()
pid = os.fork()
if pid == 0:
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0:
        sys.exit(f"unshare: {os.strerror(ctypes.get_errno())}")
    os.write(ready[1], b".")
    if os.read(go[0], 1) != b".":
        sys.exit(1)
    if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        sys.exit(f"mount --make-rprivate /: {os.strerror(ctypes.get_errno())}")
    os.execvp(sys.argv[1], sys.argv[1:])
if os.read(ready[0], 1) != b".":
    sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
for name in ("uid_map", "gid_map"):
    with open(f"/proc/{pid}/{name}", "w") as f:
        f.write("0 0 4294967295\n")
os.write(go[1], b".")
sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
'

if [ "${SANDLOT_ARM64_USERNS:-}" != inside ]; then
    [ "$(id -u)" = 0 ] || { echo "$0: needs root (a user namespace mapping every id)" >&2; exit 1; }
    if [ ! -x "$QEMU" ]; then
        echo "$0: installing Debian's qemu-user-static" >&2
        apt-get -o DPkg::Lock::Timeout=600 update -qq
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends \
            qemu-user-static >/dev/null
    fi
    # util-linux's unshare maps more than one id only through newuidmap (uidmap, for subordinate ids): the
    # parent writes the child's maps itself, as root may
    SANDLOT_ARM64_USERNS=inside exec python3 -c "$USERNS" "$0" "$@"
fi

# inside: this namespace's own binfmt_misc, aarch64 registered in it
mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc 2>/dev/null || {
    echo "$0: this kernel does not let a user namespace mount its own binfmt_misc (Linux 6.7 or later does)" >&2
    exit 1
}
printf ':qemu-aarch64:M::%s:%s:%s:OPF' "$MAGIC" "$MASK" "$QEMU" >/proc/sys/fs/binfmt_misc/register
unset SANDLOT_ARM64_USERNS
exec "$@"
