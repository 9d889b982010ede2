#!/usr/bin/env bash
# The API function's zip contents (sam build runs it through the Makefile: BuildMethod makefile):
# the project and its dependencies, installed into ARTIFACTS_DIR. Importing handler.lambda_function
# from there needs no libseccomp and no node.
set -euo pipefail
ARTIFACTS_DIR=${1:?usage: infra/build-api.sh ARTIFACTS_DIR}
REPO=$(cd "$(dirname "$0")/.." && pwd)
python3 -m pip install --quiet --disable-pip-version-check --no-cache-dir --target "$ARTIFACTS_DIR" "$REPO[lambda]"
