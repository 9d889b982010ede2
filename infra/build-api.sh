#!/usr/bin/env bash
# The API function's zip contents (sam build runs it through the Makefile: BuildMethod makefile):
# the project and its dependencies, installed into ARTIFACTS_DIR. Importing handler.lambda_function
# from there needs no libseccomp and no node.
#
# Built for the runtime the template declares (ApiFunction's `Runtime: pythonX.Y`), whatever Python runs
# this: the project as a wheel (pure Python), then it and its dependencies as binary wheels for that
# CPython and for Lambda's Linux (manylinux2014), never compiled here. SAM passes the makefile only
# ARTIFACTS_DIR, so the architecture is SANDLOT_API_ARCH (x86_64, the template's default, or arm64: set it
# when you deploy with Architecture=arm64); SANDLOT_API_PYTHON overrides the version read from the template.
# Environment: PYTHON (the pip to use, default python3), and pip's own (PIP_INDEX_URL, proxies...).
set -euo pipefail
ARTIFACTS_DIR=${1:?usage: infra/build-api.sh ARTIFACTS_DIR}
REPO=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python3}

version=${SANDLOT_API_PYTHON:-$(sed -n 's/^ *Runtime: *python\([0-9][0-9.]*\) *\(#.*\)\{0,1\}$/\1/p' "$REPO/template.yaml" | head -1)}
[ -n "$version" ] || { echo "build-api.sh: no 'Runtime: pythonX.Y' in $REPO/template.yaml" >&2; exit 1; }
case "${SANDLOT_API_ARCH:-x86_64}" in
    x86_64) platform=manylinux2014_x86_64 ;;
    arm64) platform=manylinux2014_aarch64 ;;
    *) echo "build-api.sh: SANDLOT_API_ARCH must be x86_64 or arm64" >&2; exit 1 ;;
esac

wheels=$(mktemp -d)
trap 'rm -rf "$wheels"' EXIT
# the project itself from a clean copy of the sources (nothing stale, a build/ directory, slips in)
tar -C "$REPO" --exclude=./.git --exclude=./.venv --exclude=./build --exclude='*.egg-info' --exclude=./.aws-sam \
    -cf - . | (mkdir "$wheels/src" && tar -C "$wheels/src" -xf -)
"$PYTHON" -m pip wheel --quiet --disable-pip-version-check --no-cache-dir --no-deps -w "$wheels/dist" "$wheels/src"
project=("$wheels"/dist/sandlot-*.whl)
"$PYTHON" -m pip install --quiet --disable-pip-version-check --no-cache-dir --upgrade --target "$ARTIFACTS_DIR" \
    --no-warn-conflicts --only-binary=:all: --implementation cp --python-version "$version" --platform "$platform" \
    "${project[0]}[lambda]"
