#!/usr/bin/env bash
# Lays out a runtime function's image under PREFIX: what the Dockerfiles run, and what the tests run
# to exercise the same layout without Docker.
#
#   infra/layout.sh PREFIX                 everything: venv with the project + awslambdaric, both layers
#   infra/layout.sh PREFIX --project-only  reinstall only the project's own code into PREFIX/venv
#
#   PREFIX/venv             the interpreter's venv: the project, awslambdaric, pyseccomp (read-only at run time)
#   PREFIX/layers/python    the Python dependency layer (pip install --target), preloaded by the zygote
#   PREFIX/layers/nodejs    the Node.js dependency layer (node_modules), when node is installed
#
# The layers are built by `sandlot layers build` (layers/), the same build the service runs.
# Environment: PYTHON (default python3), and what that build reads: SANDLOT_PYTHON_REQUIREMENTS,
# SANDLOT_NODEJS_PACKAGE, NODEJS_PATH (default /usr/bin/node; without it, no Node.js layer), PIP_MIRROR_URL,
# SANDLOT_PIP_FIND_LINKS, proxies.
set -euo pipefail

PREFIX=${1:?usage: infra/layout.sh PREFIX [--project-only]}
MODE=${2:-all}
REPO=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python3}
PIP_FLAGS=(--quiet --disable-pip-version-check --no-cache-dir)

project() {
    # a copy of the code, not a link to the checkout: the function's code is read-only and self-contained;
    # built from a clean copy of the sources, so that nothing stale (a build/ directory) slips in
    local source
    source=$(mktemp -d)
    tar -C "$REPO" --exclude=./.git --exclude=./.venv --exclude=./build --exclude='*.egg-info' -cf - . | tar -C "$source" -xf -
    "$PREFIX/venv/bin/python" -m pip install "${PIP_FLAGS[@]}" --no-deps --force-reinstall --no-build-isolation "$source"
    rm -rf "$source"
}

# A Lambda runtime process drops the role's credentials as its interpreter starts (runtimes/function/early.py's
# early hook), before anything is imported: a .pth file of the venv, which `site` runs
early_hook() {
    local site
    site=$("$PREFIX/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    "$PREFIX/venv/bin/python" -c 'import runtimes.function.early as c, sys; sys.stdout.write(c.EARLY_HOOK)' \
        >"$site/sandlot-early.pth"
}

# The Node.js runtime function's first zygote starts on a startup snapshot baked here (runtimes/nodejs/snapshot.py:
# loaded with rehashing, a seed of its own for every run) instead of building one at every cold start
bake_snapshot() {
    local node=${NODEJS_PATH:-/usr/bin/node}
    [ -x "$node" ] || return 0
    NODEJS_PATH="$node" "$PREFIX/venv/bin/python" -m runtimes.nodejs.snapshot --bake >/dev/null
}

if [ "$MODE" = "--project-only" ]; then
    project
    early_hook
    bake_snapshot
    chmod -R a+rX,go-w "$PREFIX/venv"
    exit 0
fi

mkdir -p "$PREFIX"
[ -x "$PREFIX/venv/bin/python" ] || "$PYTHON" -m venv "$PREFIX/venv"
"$PREFIX/venv/bin/python" -m pip install "${PIP_FLAGS[@]}" "setuptools>=68" wheel
"$PREFIX/venv/bin/python" -m pip install "${PIP_FLAGS[@]}" "$REPO[lambda]"
project
early_hook
bake_snapshot

# The dependency layers: the project's own build (`sandlot layers build`, as the service builds them: pip install
# --target, npm ci with a lock or npm install, as an unprivileged uid in a tree of its own), into a scratch data
# directory (not under /tmp, as SANDLOT_DATA_DIR may not be), then moved to where the functions read them.
data=$(mktemp -d "$PREFIX/.layers-build.XXXXXX")
# mktemp makes it 0700: the build may fall back to running as its unprivileged uid (where unshare is refused,
# as inside `docker build` or `podman build`), which must be able to reach its tree below
chmod 0711 "$data"
trap 'rm -rf "$data"' EXIT
SANDLOT_CONFIG=/nonexistent SANDLOT_DATA_DIR="$data" "$PREFIX/venv/bin/sandlot" layers build >/dev/null
for language in python nodejs; do
    rm -rf "${PREFIX:?}/layers/$language"
    built=("$data/layers/$language"/*)
    if [ -d "${built[0]}" ]; then
        [ "${#built[@]}" -eq 1 ] || { echo "more than one $language layer in $data: ${built[*]}" >&2; exit 1; }
        mkdir -p "$PREFIX/layers"
        mv "${built[0]}" "$PREFIX/layers/$language"
    fi
done
# The functions read the layer read-only, so no interpreter can cache its bytecode there: compile it once here,
# not at every cold start (the layer never changes after this, so the sources need not be checked)
[ -d "$PREFIX/layers/python" ] && "$PREFIX/venv/bin/python" -m compileall -q -j 0 \
    --invalidation-mode unchecked-hash "$PREFIX/layers/python" >/dev/null

chmod -R a+rX,go-w "$PREFIX"
echo "laid out under $PREFIX"
