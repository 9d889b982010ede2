#!/usr/bin/env bash
# The three images for both architectures, one manifest list each, as a registry would publish them:
#
#   infra/images.sh [PLATFORMS]        # as root; PLATFORMS default linux/amd64,linux/arm64
#   IMAGES="runtime-python" infra/images.sh     # only some of them (runtime-python, runtime-nodejs, service)
#
#   localhost/sandlot:latest                  Dockerfile                  (the service)
#   localhost/sandlot-runtime-python:latest   runtimes/python/Dockerfile  (template.yaml's PythonFunction)
#   localhost/sandlot-runtime-nodejs:latest   runtimes/nodejs/Dockerfile  (template.yaml's NodeFunction)
#
# each built by `podman build --platform PLATFORMS --manifest NAME`, then checked: the list holds one image per
# platform, each of its architecture (`podman image inspect`), its interpreters (the venv's python, node) and every
# ELF file under /opt/sandlot (the venv's and the layers' extension modules) of that machine (infra/sam/arches.py).
# One line per check, then `images: N passed, N failed`.
#
# No registry is reachable here: the base images are stand-ins (infra/standins.sh), one per architecture, joined in
# a manifest list under the name the Dockerfiles use. arm64's RUN steps run under qemu-user: the whole script runs
# under infra/arm64_userns.sh (a user namespace with a binfmt_misc of its own; the machine's own is left alone),
# with a podman storage of its own ($STATE/storage, default /var/tmp/sandlot-images/storage; use it with
# `CONTAINERS_STORAGE_CONF=$STATE/storage.conf podman ...`), never the machine's rootful one, which other runs
# share. vfs, not overlay: in a user namespace overlayfs cannot hide a lower layer's directory (no
# whiteout device can be made), and a RUN step's `rm -rf` of what a COPY brought fails with EIO.
# Under emulation an arm64 build takes several times an amd64 one (apt, pip, npm and the layers' builds run
# emulated). qemu-user emulates no seccomp for its guest: these builds prove the images, not the jail on arm64.
#
# Environment: STATE (/var/tmp/sandlot-images), STANDIN_CACHE (infra/standins.sh's).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
STATE=${STATE:-/var/tmp/sandlot-images}
PLATFORMS=${1:-linux/amd64,linux/arm64}

if [ "${SANDLOT_IMAGES_INSIDE:-}" != 1 ]; then
    [ "$(id -u)" = 0 ] || { echo "$0: needs root" >&2; exit 1; }
    case ",$PLATFORMS," in
        *,linux/arm64,*) SANDLOT_IMAGES_INSIDE=1 exec "$ROOT/infra/arm64_userns.sh" "$0" "$@" ;;
        *) export SANDLOT_IMAGES_INSIDE=1 ;;
    esac
fi

started=$(date +%s)
say() { printf '[%4ss] %s\n' "$(($(date +%s) - started))" "$*"; }
fail() { say "FAILED: $*"; exit 1; }
mkdir -p "$STATE"
# this storage for every podman command of the run, arches.py's too
export CONTAINERS_STORAGE_CONF="$STATE/storage.conf"
printf '[storage]\ndriver = "vfs"\ngraphroot = "%s"\nrunroot = "%s"\n' "$STATE/storage" "$STATE/run" >"$CONTAINERS_STORAGE_CONF"
IMAGES=${IMAGES:-runtime-python runtime-nodejs service}

# shellcheck source=infra/standins.sh
. "$ROOT/infra/standins.sh"
export CONTAINERS_CONF="$STATE/containers.conf"
podman_conf "$CONTAINERS_CONF"

# ---- the base images' stand-ins, a manifest list of one per architecture ----------------------------------
standin_list docker.io/library/python:3.11-slim-bookworm standin_python_base "$PLATFORMS"
[ "$IMAGES" = runtime-python ] || standin_list docker.io/library/node:20-bookworm-slim standin_node_base "$PLATFORMS"

# ---- the images ---------------------------------------------------------------------------------------------
results=()
record() {
    say "$1"
    results+=("$1")
}
check_list() { # check_list NAME: one image per platform in the list, of its architecture, with programs of it
    local name=$1 platform arch digest line
    for platform in ${PLATFORMS//,/ }; do
        arch=${platform#linux/}
        digest=$(podman manifest inspect "$name" | python3 -c '
import json, sys
arch = sys.argv[1]
found = [m["digest"] for m in json.load(sys.stdin)["manifests"] if m.get("platform", {}).get("architecture") == arch]
print(found[0] if len(found) == 1 else "")' "$arch")
        if [ -z "$digest" ]; then
            record "FAIL $name: no single $arch image in the list"
            continue
        fi
        # its architecture, its interpreters' and extension modules' ELF machine (infra/sam/arches.py, Lambda's names)
        while read -r line; do
            record "${line/$name@$digest/$name ($arch)}"
        done < <(python3 "$ROOT/infra/sam/arches.py" image "$name@$digest" "$([ "$arch" = amd64 ] && echo x86_64 || echo "$arch")" || true)
    done
}
build_list() { # build_list NAME DOCKERFILE
    local name=$1 dockerfile=$2 begin
    podman manifest exists "$name" 2>/dev/null && podman manifest rm "$name" >/dev/null
    begin=$(date +%s)
    say "building $name for $PLATFORMS from $dockerfile"
    if podman build --quiet --platform "$PLATFORMS" --manifest "$name" --pull=never --network host \
        --isolation chroot --format docker -f "$ROOT/$dockerfile" "$ROOT" >"$STATE/build-${name##*/}.log" 2>&1; then
        say "built $name in $(($(date +%s) - begin)) s (load $(cut -d' ' -f1-3 /proc/loadavg))"
        check_list "$name"
    else
        record "FAIL $name: podman build, see $STATE/build-${name##*/}.log: $(tail -3 "$STATE/build-${name##*/}.log" | tr '\n' ' ')"
    fi
}
for image in $IMAGES; do
    case "$image" in
        runtime-python) build_list localhost/sandlot-runtime-python:latest runtimes/python/Dockerfile ;;
        runtime-nodejs) build_list localhost/sandlot-runtime-nodejs:latest runtimes/nodejs/Dockerfile ;;
        service) build_list localhost/sandlot:latest Dockerfile ;;
        *) fail "IMAGES: $image is none of runtime-python, runtime-nodejs, service" ;;
    esac
done

say "done; logs in $STATE; the images in CONTAINERS_STORAGE_CONF=$CONTAINERS_STORAGE_CONF podman images"
passed=0
for line in "${results[@]}"; do
    echo "$line"
    [[ $line == PASS* ]] && passed=$((passed + 1))
done
echo "images: $passed passed, $((${#results[@]} - passed)) failed"
[ "$passed" = ${#results[@]} ]
