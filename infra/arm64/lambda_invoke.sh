#!/usr/bin/env bash
# The arm64 runtime images answering SAM-style invokes on a real arm64 kernel (as root):
#
#   infra/arm64_test.sh --lambda                  # its machine's kernel and root filesystem (built once, kept), then this
#   infra/arm64/lambda_invoke.sh MACHINE_DIR      # the same with a machine arm64_test.sh built (its images/KEY)
#   LAMBDA_FUNCTIONS=python3 ...                  # only these functions (python3, nodejs; default both)
#   LAMBDA_PLATFORMS=lambda ...                   # only these platforms (lambda, sam; default both)
#
# 1. The images: localhost/sandlot-runtime-python and -nodejs, the arm64 ones of their manifest lists in
#    infra/images.sh's storage ($IMAGES_STATE, default /var/tmp/sandlot-images); built there when missing
#    (`IMAGES="runtime-python runtime-nodejs" infra/images.sh linux/arm64`: under qemu-user, half an hour and more;
#    their lists then hold the arm64 image alone).
# 2. The functions' disk, on this host with no arm64 program run: each image's filesystem (`podman image mount`) with
#    SAM's Runtime Interface Emulator for arm64 at /var/rapid/aws-lambda-rie, as SAM's own layer puts it there (the
#    RIE from the SAM CLI's wheel, $SAM_CLI_VERSION: its venv of infra/sam_local_test.sh, else the wheel alone,
#    downloaded once), and the image's Config (ENV, ENTRYPOINT, CMD, WORKDIR); an ext4 image kept under
#    $STATE/lambda, keyed by the images' ids and the RIE.
# 3. The machine of infra/arm64_test.sh booted with that disk (a copy-on-write overlay of its root filesystem), its
#    run tar carrying infra/arm64/lambda-init as its services: each image's ENTRYPOINT started behind the RIE as
#    Lambda starts it (infra/arm64/lambda_platform.py: read-only root, a tmpfs on /tmp, not root, Lambda's refusals
#    by seccomp), and again as SAM local's container starts it (root, Docker's default capabilities and seccomp
#    profile), each RIE's invoke port forwarded to this host's loopback.
# 4. infra/arm64/lambda_checks.py: per function and platform, the probe, runs with and without a tenant id, hostile
#    runs (Landlock's refusals on `lambda`; the seccomp filter's on `sam`), another tenant.
#    Last line: `lambda arm64: N passed, N failed`.
# Removes only what it started: its own qemu (by the pid qemu wrote), its run directory, its image mounts.
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$(pwd)
MACHINE=${1:?usage: infra/arm64/lambda_invoke.sh MACHINE_DIR (infra/arm64_test.sh --lambda finds it)}
MACHINE=$(cd "$MACHINE" && pwd)
STATE=${SANDLOT_ARM64_STATE:-/var/tmp/sandlot-arm64}
IMAGES_STATE=${IMAGES_STATE:-/var/tmp/sandlot-images}
SAM_STATE=${SAM_STATE:-/var/tmp/sandlot-sam-test}
SAM_CLI_VERSION=${SAM_CLI_VERSION:-1.170.0}
FUNCTIONS=("python3:localhost/sandlot-runtime-python:latest" "nodejs:localhost/sandlot-runtime-nodejs:latest")
# each function on each platform (infra/arm64/lambda_platform.py): `lambda` as Lambda runs it (each function a uid of
# its own: a runtime function sweeps its uid after every run; Lambda's sbx_user1051 is 993), `sam` as SAM local's
# container runs it (root, Docker's defaults)
PLATFORMS=${LAMBDA_PLATFORMS:-lambda sam}
if [ -n "${LAMBDA_FUNCTIONS:-}" ]; then # only these (python3, nodejs)
    chosen=()
    for spec in "${FUNCTIONS[@]}"; do [[ " $LAMBDA_FUNCTIONS " == *" ${spec%%:*} "* ]] && chosen+=("$spec"); done
    [ ${#chosen[@]} -gt 0 ] || { echo "LAMBDA_FUNCTIONS: none of python3, nodejs" >&2; exit 2; }
    FUNCTIONS=("${chosen[@]}")
fi
[ "$(id -u)" = 0 ] || { echo "lambda_invoke.sh: needs root" >&2; exit 1; }
[ -f "$MACHINE/root.img" ] || { echo "lambda_invoke.sh: no root.img in $MACHINE" >&2; exit 1; }
started=$(date +%s)
log() { echo "arm64 lambda: [$(($(date +%s) - started)) s] $*" >&2; }
export CONTAINERS_STORAGE_CONF="$IMAGES_STATE/storage.conf"

# ---- 1. the images ------------------------------------------------------------------------------------------------
arm64_image() { # arm64_image NAME: the id of the arm64 image of NAME's manifest list ("" when none)
    podman manifest inspect "$1" 2>/dev/null | python3 -c '
import json, sys
found = [m["digest"] for m in json.load(sys.stdin)["manifests"] if m.get("platform", {}).get("architecture") == "arm64"]
print(found[0] if len(found) == 1 else "")' 2>/dev/null | while read -r digest; do
        [ -n "$digest" ] && podman image inspect --format '{{.Id}}' "${1%:*}@$digest"
    done
    return 0
}
missing=()
for spec in "${FUNCTIONS[@]}"; do
    IFS=: read -r _ name tag <<<"$spec"
    [ -f "$CONTAINERS_STORAGE_CONF" ] && [ -n "$(arm64_image "$name:$tag")" ] || missing+=("${name##*/sandlot-}")
done
if [ ${#missing[@]} -gt 0 ]; then
    log "no arm64 ${missing[*]} in $IMAGES_STATE: building them (infra/images.sh, under qemu-user: half an hour and more)"
    STATE=$IMAGES_STATE IMAGES="${missing[*]}" infra/images.sh linux/arm64 >&2
fi

# ---- 2. the functions' disk --------------------------------------------------------------------------------------
rie=$(compgen -G "$SAM_STATE/sam-venv/lib/python3*/site-packages/samcli/local/rapid/aws-lambda-rie-arm64" | head -1 || true)
if [ -z "$rie" ] || ! "$SAM_STATE/sam-venv/bin/sam" --version 2>/dev/null | grep -qF "$SAM_CLI_VERSION"; then
    rie="$STATE/downloads/aws-lambda-rie-arm64-$SAM_CLI_VERSION"
    if [ ! -s "$rie" ]; then
        log "the RIE for arm64: from the SAM CLI $SAM_CLI_VERSION wheel (once)"
        mkdir -p "$STATE/downloads"
        wheel_dir=$(mktemp -d "$STATE/downloads/sam.XXXXXX")
        python3 -m pip download --quiet --disable-pip-version-check --no-deps -d "$wheel_dir" \
            "aws-sam-cli==$SAM_CLI_VERSION" 2>&1 | grep -v "^WARNING: Location" >&2 || true
        python3 -c 'import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel, wheel.open("samcli/local/rapid/aws-lambda-rie-arm64") as rie:
    shutil.copyfileobj(rie, sys.stdout.buffer)' "$wheel_dir"/aws_sam_cli-*.whl >"$rie.part"
        rm -rf "$wheel_dir"
        mv "$rie.part" "$rie"
    fi
fi
ids=()
for spec in "${FUNCTIONS[@]}"; do
    IFS=: read -r _ name tag <<<"$spec"
    ids+=("$(arm64_image "$name:$tag")")
done
KEY=$( { printf '%s\n' "${ids[@]}" "${FUNCTIONS[@]}"; sha256sum <"$rie"; } | sha256sum | cut -c1-16)
DISK="$STATE/lambda/$KEY.img"
mkdir -p "$STATE/lambda"
exec 8>"$STATE/lambda/build.lock"
flock 8
if [ ! -f "$DISK" ]; then
    work=$(mktemp -d "$STATE/lambda/build.XXXXXX")
    mounted=()
    unmount_images() { local id; for id in "${mounted[@]}"; do podman image unmount "$id" >/dev/null 2>&1 || true; done; }
    trap 'unmount_images; rm -rf "$work"' EXIT
    for i in "${!FUNCTIONS[@]}"; do
        function=${FUNCTIONS[$i]%%:*}
        id=${ids[$i]}
        log "the functions' disk: $function's image ${id:0:12}"
        mkdir -p "$work/disk/$function"
        source=$(podman image mount "$id")
        mounted+=("$id")
        cp -a "$source/." "$work/disk/$function/root/"
        podman image inspect --format '{{json .Config}}' "$id" >"$work/disk/$function/config.json"
        mkdir -p "$work/disk/$function/root/var/rapid"
        install -m 0755 "$rie" "$work/disk/$function/root/var/rapid/aws-lambda-rie"
    done
    unmount_images
    mounted=()
    size=$(du -sm "$work/disk" | cut -f1)
    mkfs.ext4 -q -F -L sandlot-lambda -d "$work/disk" "$work/functions.img" "$((size * 5 / 4 + 64))M" >/dev/null
    mv "$work/functions.img" "$DISK"
    rm -rf "$work"
    trap - EXIT
    # disks of other keys: made by this script for images that are no more
    find "$STATE/lambda" -maxdepth 1 -name '*.img' ! -name "$KEY.img" -delete
    log "the functions' disk made: $DISK ($(du -sm "$DISK" | cut -f1) MB)"
fi
flock -u 8

# ---- 3. the machine --------------------------------------------------------------------------------------------------
mkdir -p "$STATE/runs"
RUN=$(mktemp -d "$STATE/runs/lambda.XXXXXX")
qemu_alive() { # qemu_alive: its qemu, by the pid it wrote, still that qemu
    local pid
    pid=$(cat "$RUN/qemu.pid" 2>/dev/null) || return 1
    [ -n "$pid" ] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$RUN/"
}
stop_machine() { # power it off through its agent, else end its qemu; remove the run dir
    if qemu_alive; then
        timeout 30 python3 "$REPO/infra/arm64/vm.py" exec "$RUN/ctl.sock" poweroff >/dev/null 2>&1 || true
        for _ in $(seq 50); do qemu_alive || break; sleep 0.2; done
        if qemu_alive; then kill "$(cat "$RUN/qemu.pid")" 2>/dev/null || true; fi
        for _ in $(seq 50); do qemu_alive || break; sleep 0.2; done
    fi
    rm -rf "$RUN"
}
trap stop_machine EXIT
qemu-img create -q -f qcow2 -F raw -b "$MACHINE/root.img" "$RUN/overlay.qcow2"
# the run tar: what lambda-init needs, lambda-init itself as the infra/arm64/serve-init that root-init starts
mkdir -p "$RUN/src/infra/arm64" "$RUN/src/tests"
cp infra/arm64/lambda-init "$RUN/src/infra/arm64/serve-init"
cp infra/arm64/agent.py infra/arm64/lambda_platform.py "$RUN/src/infra/arm64/"
cp tests/outer_filter.py "$RUN/src/tests/"
specs=()
forwards=()
checks=()
n=0
for platform in $PLATFORMS; do
    case "$platform" in lambda | sam) ;; *) echo "LAMBDA_PLATFORMS: $platform is neither lambda nor sam" >&2; exit 2 ;; esac
    for i in "${!FUNCTIONS[@]}"; do
        function=${FUNCTIONS[$i]%%:*}
        uid=0
        [ "$platform" = sam ] || uid=$((993 + i))
        port=$((8080 + n)) api=$((9001 + n))
        n=$((n + 1))
        specs+=("$function:$platform:$uid:$port:$api")
        host_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
        forwards+=("hostfwd=tcp:127.0.0.1:$host_port-:$port")
        checks+=(--function "$function=http://127.0.0.1:$host_port:$uid:$platform")
    done
done
echo "FUNCTIONS=\"${specs[*]}\"" >"$RUN/src/.arm64-run.env"
tar -C "$RUN/src" -cf "$RUN/src.tar" .
rm -rf "$RUN/src"
truncate -s %512 "$RUN/src.tar"
booted=$(date +%s)
qemu-system-aarch64 -M virt -cpu cortex-a72 -smp 2 -m 2048 -display none -no-reboot -daemonize \
    -pidfile "$RUN/qemu.pid" -kernel "$MACHINE/vmlinuz" -initrd "$MACHINE/initrd.img" \
    -append "console=ttyAMA0 panic=-1 sandlot.init=/sbin/sandlot-init" \
    -drive "if=none,id=root,file=$RUN/overlay.qcow2,format=qcow2" -device virtio-blk-pci,drive=root \
    -drive "if=none,id=src,file=$RUN/src.tar,format=raw,readonly=on" -device virtio-blk-pci,drive=src \
    -drive "if=none,id=functions,file=$DISK,format=raw,readonly=on" -device virtio-blk-pci,drive=functions \
    -netdev "user,id=net,$(IFS=,; echo "${forwards[*]}")" \
    -device virtio-net-pci,netdev=net,romfile= -device virtio-rng-pci \
    -device virtio-serial-pci -chardev "socket,id=ctl,path=$RUN/ctl.sock,server=on,wait=off" \
    -device virtserialport,chardev=ctl,name=ctl -serial "file:$RUN/console.log" -monitor none
for _ in $(seq 900); do
    grep -q "SANDLOT-FAILED" "$RUN/console.log" 2>/dev/null && break
    grep -q "SANDLOT-READY" "$RUN/console.log" 2>/dev/null && break
    sleep 1
done
if ! grep -q "SANDLOT-READY" "$RUN/console.log" 2>/dev/null || grep -q "SANDLOT-FAILED" "$RUN/console.log"; then
    tail -40 "$RUN/console.log" >&2
    echo "lambda arm64: 0 passed, 1 failed"
    exit 1
fi
log "the machine is up in $(($(date +%s) - booted)) s (load $(cut -d' ' -f1-3 /proc/loadavg))"

# ---- 4. the invokes ------------------------------------------------------------------------------------------------
set +e
python3 infra/arm64/lambda_checks.py "${checks[@]}" | tee "$RUN/report.txt"
status=${PIPESTATUS[0]}
set -e
if [ "$status" != 0 ]; then
    for spec in "${specs[@]}"; do
        IFS=: read -r function platform _ <<<"$spec"
        echo "---- the machine's /var/log/lambda/$function-$platform.log (its last lines)" >&2
        timeout 60 python3 infra/arm64/vm.py exec "$RUN/ctl.sock" "tail -30 /var/log/lambda/$function-$platform.log" >&2 || true
    done
fi
log "booted and invoked in $(($(date +%s) - booted)) s (load $(cut -d' ' -f1-3 /proc/loadavg))"
exit "$status"
