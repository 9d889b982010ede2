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
# Environment: PYTHON (default python3), SANDLOT_PYTHON_REQUIREMENTS, SANDLOT_NODEJS_PACKAGE, NODEJS_PATH.
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

if [ "$MODE" = "--project-only" ]; then
    project
    chmod -R a+rX,go-w "$PREFIX/venv"
    exit 0
fi

mkdir -p "$PREFIX"
[ -x "$PREFIX/venv/bin/python" ] || "$PYTHON" -m venv "$PREFIX/venv"
"$PREFIX/venv/bin/python" -m pip install "${PIP_FLAGS[@]}" "setuptools>=68" wheel
"$PREFIX/venv/bin/python" -m pip install "${PIP_FLAGS[@]}" "$REPO[lambda]"
project

requirements=${SANDLOT_PYTHON_REQUIREMENTS:-$REPO/layers/python/requirements.txt}
rm -rf "$PREFIX/layers/python"
"$PREFIX/venv/bin/python" -m pip install "${PIP_FLAGS[@]}" --target "$PREFIX/layers/python" -r "$requirements"

node=${NODEJS_PATH:-/usr/bin/node}
if [ -x "$node" ]; then
    package=${SANDLOT_NODEJS_PACKAGE:-$REPO/layers/nodejs/package.json}
    rm -rf "$PREFIX/layers/nodejs"
    mkdir -p "$PREFIX/layers/nodejs/node_modules"
    cp "$package" "$PREFIX/layers/nodejs/package.json"
    lock="$(dirname "$package")/package-lock.json"
    [ -f "$lock" ] && cp "$lock" "$PREFIX/layers/nodejs/"
    if grep -q '"dependencies": *{ *[^} ]' "$PREFIX/layers/nodejs/package.json"; then
        (cd "$PREFIX/layers/nodejs" && npm install --omit=dev --ignore-scripts --no-audit --no-fund)
    fi
fi

chmod -R a+rX,go-w "$PREFIX"
echo "laid out under $PREFIX"
