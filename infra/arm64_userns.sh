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
# The emulator: qemu-user 10 or later. Debian 12's own (7.2) answers prctl(PR_SET_CHILD_SUBREAPER) with EINVAL,
# which the layer build's jailer needs (layers/jailer.py: its subreaper ends what a build left running), so the
# runtime images' `infra/layout.sh` step cannot run under it; 10.0 passes the call to the kernel. Where the machine's
# is older, Debian's own newer one is used, from its release's backports (bookworm-backports: qemu-user 10.0),
# fetched once with `apt-get download` (a source list and package lists of its own: the machine's apt sources and
# installed packages are left as they are) into $QEMU_CACHE (default /var/tmp/sandlot-qemu), its qemu-aarch64 alone
# kept. $SANDLOT_QEMU_AARCH64 names another emulator (a static qemu-aarch64 of any version).
#
# podman in here is root in a user namespace: give it a storage of its own (`podman --root DIR --runroot DIR`),
# not the machine's rootful one, which other runs use at the same time (infra/standins.sh, arm64_podman).
set -euo pipefail

[ $# -gt 0 ] || { echo "usage: $0 COMMAND [ARG...]" >&2; exit 2; }
SYSTEM_QEMU=/usr/libexec/qemu-binfmt/aarch64-binfmt-P
QEMU_CACHE=${QEMU_CACHE:-/var/tmp/sandlot-qemu}
QEMU_MIN_MAJOR=10 # the first release tried here that passes PR_SET_CHILD_SUBREAPER (7.2 does not)
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

qemu_major() { # qemu_major EMULATOR: its major version ("0" when it does not say)
    "$(readlink -f "$1")" --version 2>/dev/null | sed -n '1s/^qemu-[a-z0-9_]* version \([0-9]*\)\..*/\1/p' | grep . || echo 0
}

backports_qemu() { # the newest qemu-aarch64 of this Debian release's backports, fetched once into $QEMU_CACHE: its path
    local codename apt dir deb version cached
    cached=$(compgen -G "$QEMU_CACHE/qemu-user-*/aarch64-binfmt-P" | sort -V | tail -1 || true)
    if [ -n "$cached" ] && [ "$(qemu_major "$cached")" -ge $QEMU_MIN_MAJOR ]; then
        echo "$cached"
        return 0
    fi
    codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
    [ -n "$codename" ] || { echo "$0: no VERSION_CODENAME in /etc/os-release: set SANDLOT_QEMU_AARCH64" >&2; return 1; }
    apt="$QEMU_CACHE/apt-$codename"
    mkdir -p "$apt/lists/partial"
    echo "deb http://deb.debian.org/debian $codename-backports main" >"$apt/sources.list"
    local options=(-o "Dir::Etc::SourceList=$apt/sources.list" -o Dir::Etc::SourceParts=- -o "Dir::State::Lists=$apt/lists"
        -o "Dir::Cache::pkgcache=$apt/pkgcache.bin" -o "Dir::Cache::srcpkgcache=$apt/srcpkgcache.bin" -o APT::Sandbox::User=root)
    apt-get "${options[@]}" update -qq >&2 || return 1
    version=$(apt-cache "${options[@]}" policy qemu-user | sed -n 's/^ *Candidate: *//p')
    case "$version" in "" | "(none)") echo "$0: no qemu-user in $codename-backports" >&2; return 1 ;; esac
    dir="$QEMU_CACHE/qemu-user-${version//[:~+]/_}"
    if [ ! -x "$dir/aarch64-binfmt-P" ]; then
        echo "$0: fetching qemu-user $version from $codename-backports (once, into $dir)" >&2
        rm -rf "$dir.part" && mkdir -p "$dir.part/deb"
        (cd "$dir.part" && apt-get "${options[@]}" download -qq "qemu-user=$version" >&2) || return 1
        deb=$(ls "$dir.part"/qemu-user_*.deb)
        dpkg-deb --fsys-tarfile "$deb" | tar -C "$dir.part/deb" -x ./usr/bin/qemu-aarch64 || return 1
        mv "$dir.part/deb/usr/bin/qemu-aarch64" "$dir.part/qemu-aarch64"
        # the name Debian registers it by (qemu-user-binfmt): the -binfmt-P name tells it argv[0] is preserved
        ln -s qemu-aarch64 "$dir.part/aarch64-binfmt-P"
        rm -rf "$dir.part/deb" "$deb"
        rm -rf "$dir" && mv "$dir.part" "$dir"
    fi
    echo "$dir/aarch64-binfmt-P"
}

if [ "${SANDLOT_ARM64_USERNS:-}" != inside ]; then
    [ "$(id -u)" = 0 ] || { echo "$0: needs root (a user namespace mapping every id)" >&2; exit 1; }
    if [ -n "${SANDLOT_QEMU_AARCH64:-}" ]; then
        QEMU=$SANDLOT_QEMU_AARCH64
    else
        if [ ! -x "$SYSTEM_QEMU" ]; then # the machine's own, for debootstrap and the version's check
            echo "$0: installing Debian's qemu-user-static" >&2
            apt-get -o DPkg::Lock::Timeout=600 update -qq
            DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends \
                qemu-user-static >/dev/null
        fi
        QEMU=$SYSTEM_QEMU
        if [ "$(qemu_major "$QEMU")" -lt $QEMU_MIN_MAJOR ]; then
            QEMU=$(backports_qemu) || {
                echo "$0: no qemu-user $QEMU_MIN_MAJOR or later (the machine's is $(qemu_major "$SYSTEM_QEMU")): set SANDLOT_QEMU_AARCH64" >&2
                exit 1
            }
        fi
    fi
    [ -f "$QEMU" ] && [ -x "$QEMU" ] || { echo "$0: $QEMU is no emulator" >&2; exit 1; }
    export SANDLOT_ARM64_QEMU=$QEMU
    # util-linux's unshare maps more than one id only through newuidmap (uidmap, for subordinate ids): the
    # parent writes the child's maps itself, as root may
    SANDLOT_ARM64_USERNS=inside exec python3 -c "$USERNS" "$0" "$@"
fi

# inside: this namespace's own binfmt_misc, aarch64 registered in it
mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc 2>/dev/null || {
    echo "$0: this kernel does not let a user namespace mount its own binfmt_misc (Linux 6.7 or later does)" >&2
    exit 1
}
printf ':qemu-aarch64:M::%s:%s:%s:OPF' "$MAGIC" "$MASK" "$SANDLOT_ARM64_QEMU" >/proc/sys/fs/binfmt_misc/register
unset SANDLOT_ARM64_USERNS SANDLOT_ARM64_QEMU
exec "$@"
