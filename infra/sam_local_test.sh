#!/usr/bin/env bash
# The Lambda shape under AWS's own emulator: template.yaml built and run by SAM local (the SAM CLI and the
# Runtime Interface Emulator its wheel ships), on podman's Docker API.
#
#   infra/sam_local_test.sh            # as root: build, check in the cold and the warm container modes, stop
#   infra/sam_local_test.sh --keep     # the same, then leave start-api and start-lambda (warm) running and print
#                                      # SAM_API_URL=..., SAM_LAMBDA_URL=..., SAM_API_KEY=... lines
#   infra/sam_local_test.sh --stop     # end what --keep left running (that run's, nobody else's)
#
# It installs what is missing (Debian's podman, runc, debootstrap; aws-sam-cli $SAM_CLI_VERSION and boto3 in
# a venv of their own under $STATE), starts podman's API service on a socket of its own, makes the base
# images' stand-ins once (infra/standins.sh: no image registry is reachable here) and then:
#   1. `sam build` (the API zip through Makefile -> infra/build-api.sh, both runtime images), checked by metadata
#      (infra/sam/arches.py); on x86_64 also `sam build ApiFunction` with Architecture=arm64, its zip checked;
#   2. the zip imports on the stand-in of its declared runtime (python3.12), and holds no extension module
#      built for another Python;
#   3. `sam local invoke` of each runtime function with infra/events/ (and the Python function's probe);
#   4. for each container mode in $SAM_TEST_MODES (default: "none EAGER": a new container for every
#      invocation, then warm ones made at start): `sam local start-lambda` with boto3 direct invokes carrying
#      TenantId (a warm container pinned to one tenant refuses another, with the reason), and
#      `sam local start-api` in front of it with Dify-format requests (infra/sam/checks.py).
# One line per check, then `N passed, N failed`; non-zero exit on any failure. State, logs and the SAM venv
# are kept under $STATE (default /var/tmp/sandlot-sam-test), the images in podman's storage.
#
# The API function reaches start-lambda through SANDLOT_LAMBDA_ENDPOINT_URL (declared in template.yaml, empty;
# set with --env-vars), at podman's bridge gateway, where start-lambda listens: SAM's containers are on
# podman's default bridge network, and the host's loopback is not theirs.
#
# Other runs share the machine (another SAM run, other tests' containers): this one removes only the containers it
# started. SAM labels its containers (sam.cli.container.type) but with nothing of the run's own, so every container
# created through this run's podman API socket carries the annotation sandlot.sam-test.run=RUN (the run's id, from
# the run's own CONTAINERS_CONF), and only SAM's containers with this run's annotation are removed.
#
# SAM_ARCH=arm64 builds for Lambda's arm64 (template.yaml's Architecture, and SANDLOT_API_ARCH for the API zip) and
# checks what was built by its metadata (infra/sam/arches.py): the runtime images are arm64 (their architecture,
# and the ELF machine of their interpreter and of an extension module of their venv), the zip's extension modules
# aarch64 ELF files. The invokes follow only where this machine is arm64. On another machine the images' RUN steps
# run under qemu-user: the whole run goes into infra/arm64_userns.sh (a user namespace with a binfmt_misc of its
# own), with infra/images.sh's storage (vfs, $IMAGES_STATE, default /var/tmp/sandlot-images: its stand-ins' manifest
# lists, made there if missing, and its layers' cache) through CONTAINERS_STORAGE_CONF for every podman command of
# the run. Podman's Docker API builds with runc whatever BUILDAH_ISOLATION says (podman 4.3), and runc as root in a
# user namespace fails twice on this machine: a new sysfs cannot be mounted (the network namespace is the host's)
# and the devices cgroup cannot be written (hybrid cgroups). So podman is told it is rootless
# (_CONTAINERS_USERNS_CONFIGURED: the namespace is set up; its RUN steps then get /sys bound in), and runc runs with
# --rootless=true (cgroup permission errors ignored), through a runtime of that name in the run's containers.conf.
#
# Environment: SAM_CLI_VERSION (1.170.0), SAM_TEST_MODES ("none EAGER"), STATE, SAM_LAMBDA_PORT (18201),
# SAM_API_PORT (18202), SAM_ARCH (x86_64 or arm64; default x86_64), IMAGES_STATE (another architecture's storage).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
STATE=${STATE:-/var/tmp/sandlot-sam-test}
SAM_CLI_VERSION=${SAM_CLI_VERSION:-1.170.0}
MODES=${SAM_TEST_MODES:-none EAGER}
LAMBDA_PORT=${SAM_LAMBDA_PORT:-18201}
API_PORT=${SAM_API_PORT:-18202}
ARCH=${SAM_ARCH:-x86_64}
case "$ARCH" in x86_64 | arm64) ;; *) echo "SAM_ARCH must be x86_64 or arm64 (Lambda's names)" >&2; exit 2 ;; esac
# the machine's own architecture, in Lambda's names: only its functions can be invoked here
case "$(uname -m)" in aarch64) NATIVE_ARCH=arm64 ;; *) NATIVE_ARCH=$(uname -m) ;; esac
VENV="$STATE/sam-venv"
RUN_ID=$(date +%s)-$$-$RANDOM
SOCK="$STATE/podman-$RUN_ID.sock" # the run's own: a second run on this machine does not take it over
PIDS="$STATE/kept.pids"
KEPT_RUN="$STATE/kept.run" # the kept run's id, for --stop
RUN_ANNOTATION=sandlot.sam-test.run
ACTION=run
case "${1:-}" in
    --keep) ACTION=keep ;;
    --stop) ACTION=stop ;;
    "") ;;
    *) echo "usage: $0 [--keep|--stop]" >&2; exit 2 ;;
esac

started=$(date +%s)
say() { printf '[%4ss] %s\n' "$(($(date +%s) - started))" "$*"; }
fail() { say "FAILED: $*"; exit 1; }

stop_pid() { # stop_pid PID: SIGTERM, SIGKILL after 20 s (SAM leaves its containers: remove_sam_containers)
    local pid=$1
    [ -n "$pid" ] || return 0
    kill -0 "$pid" 2>/dev/null || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 40); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.5
    done
    kill -KILL "$pid" 2>/dev/null || true
}

run_containers() { # run_containers RUN: the ids of SAM's containers that RUN started (its annotation), none other
    local id run
    podman ps -aq --no-trunc --filter label=sam.cli.container.type 2>/dev/null | while read -r id; do
        run=$(podman container inspect -f "{{index .Config.Annotations \"$RUN_ANNOTATION\"}}" "$id" 2>/dev/null) || continue
        [ "$run" = "$1" ] && echo "$id"
    done
    return 0
}

remove_sam_containers() { # remove_sam_containers [RUN]: what SAM left of this run (or of RUN), by id
    local ids
    ids=$(run_containers "${1:-$RUN_ID}")
    [ -z "$ids" ] || podman rm -f $ids >/dev/null 2>&1 || true
}

run_conf() { # run_conf FILE: this machine's podman settings (infra/standins.sh), every container annotated with the run
    podman_conf "$1"
    sed -i "s|^\[containers\]\$|[containers]\nannotations = [\"$RUN_ANNOTATION=$RUN_ID\"]|" "$1"
    grep -qF "$RUN_ANNOTATION=$RUN_ID" "$1" || fail "$1: no run annotation"
    if [ $EMULATED = 1 ]; then # runc in this user namespace: cgroup permission errors ignored (see above)
        sed -i "s|^runtime = .*|runtime = \"runc-userns\"\n[engine.runtimes]\nrunc-userns = [\"$STATE/runc-userns\"]|" "$1"
        grep -qF "runc-userns = " "$1" || fail "$1: no runtime runc-userns"
    fi
}

# another architecture (arm64 on x86_64): under qemu-user, in a user namespace of its own, podman in a storage that
# namespace can use (vfs) and building without runc (chroot isolation); nothing of it is kept (no invoke)
EMULATED=0
SERVICE_ENV=()
if [ "$ARCH" != "$NATIVE_ARCH" ] && [ "$ACTION" != stop ]; then
    [ "$ARCH" = arm64 ] || { echo "$0: only arm64 is emulated here, not $ARCH" >&2; exit 2; }
    if [ "${SANDLOT_SAM_EMULATED:-}" != 1 ]; then
        [ "$(id -u)" = 0 ] || { echo "$0: needs root" >&2; exit 1; }
        SANDLOT_SAM_EMULATED=1 exec "$ROOT/infra/arm64_userns.sh" "$0" "$@"
    fi
    EMULATED=1
    IMAGES_STATE=${IMAGES_STATE:-/var/tmp/sandlot-images}
    mkdir -p "$STATE" "$IMAGES_STATE"
    export CONTAINERS_STORAGE_CONF="$STATE/storage-$ARCH.conf"
    printf '[storage]\ndriver = "vfs"\ngraphroot = "%s"\nrunroot = "%s"\n' "$IMAGES_STATE/storage" \
        "$IMAGES_STATE/run" >"$CONTAINERS_STORAGE_CONF"
    # for the API service alone (the script's own podman commands need no rootless mode)
    SERVICE_ENV=(_CONTAINERS_USERNS_CONFIGURED=done XDG_RUNTIME_DIR="$STATE/run-$ARCH")
    SOCK="$STATE/podman-$ARCH-$RUN_ID.sock"
    mkdir -p "$STATE/run-$ARCH" && chmod 0700 "$STATE/run-$ARCH"
    printf '#!/bin/sh\nexec runc --rootless=true "$@"\n' >"$STATE/runc-userns" && chmod 0755 "$STATE/runc-userns"
fi

export CONTAINERS_CONF="$STATE/containers-$RUN_ID.conf"
if [ "$ACTION" = stop ]; then
    [ -s "$PIDS" ] || { echo "nothing kept (no $PIDS)"; exit 0; }
    while read -r pid; do stop_pid "$pid"; done < <(tac "$PIDS")
    kept_run=$(cat "$KEPT_RUN" 2>/dev/null || true)
    if [ -s "$STATE/containers-$kept_run.conf" ]; then export CONTAINERS_CONF="$STATE/containers-$kept_run.conf"; else unset CONTAINERS_CONF; fi
    [ -z "$kept_run" ] || remove_sam_containers "$kept_run"
    rm -f "$PIDS" "$KEPT_RUN" "$STATE/containers-$kept_run.conf"
    [ -z "$kept_run" ] || rm -f "$STATE"/podman-*"-$kept_run.sock"
    echo "stopped"
    exit 0
fi

[ "$(id -u)" = 0 ] || fail "needs root (podman's rootful storage, debootstrap)"
[ -s "$PIDS" ] && fail "a kept run is still registered in $PIDS: $0 --stop first"
mkdir -p "$STATE"

# ---- tools -------------------------------------------------------------------------------------------------
missing=()
for tool in podman runc debootstrap; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends \
        podman runc debootstrap >/dev/null
fi
if ! "$VENV/bin/sam" --version 2>/dev/null | grep -qF "$SAM_CLI_VERSION"; then
    say "installing aws-sam-cli $SAM_CLI_VERSION in $VENV"
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "aws-sam-cli==$SAM_CLI_VERSION" boto3 \
        >"$STATE/pip-sam.log" 2>&1 || fail "pip install aws-sam-cli: see $STATE/pip-sam.log"
fi
SAM="$VENV/bin/sam"
export SAM_CLI_TELEMETRY=0 AWS_DEFAULT_REGION=us-east-1 AWS_REGION=us-east-1
# dummy credentials: start-lambda checks no signature, and no real ones reach the containers
export AWS_ACCESS_KEY_ID=sam-local AWS_SECRET_ACCESS_KEY=sam-local

# shellcheck source=infra/standins.sh
source "$ROOT/infra/standins.sh"
run_conf "$CONTAINERS_CONF"

# ---- podman's Docker API -------------------------------------------------------------------------------------
kept=()
cleanup() {
    local pid
    for ((i = ${#kept[@]} - 1; i >= 0; i--)); do stop_pid "${kept[$i]}"; done
    remove_sam_containers
    rm -f "$CONTAINERS_CONF" "$SOCK"
}
trap cleanup EXIT
SERVICE_LOG="$STATE/podman-service.log"
[ $EMULATED = 0 ] || SERVICE_LOG="$STATE/podman-service-$ARCH.log"
env "${SERVICE_ENV[@]}" podman system service --time=0 "unix://$SOCK" >"$SERVICE_LOG" 2>&1 &
kept+=($!)
export DOCKER_HOST="unix://$SOCK"
for _ in $(seq 1 50); do [ -S "$SOCK" ] && break; sleep 0.2; done
[ -S "$SOCK" ] || fail "podman system service did not start: see $SERVICE_LOG"

# ---- stand-ins -------------------------------------------------------------------------------------------------
api_runtime=$(sed -n 's/^ *Runtime: *python\([0-9][0-9.]*\).*/\1/p' "$ROOT/template.yaml" | head -1)
if [ $EMULATED = 1 ]; then # lists, as images.sh makes them: each build takes its architecture's image
    standin_list docker.io/library/python:3.11-slim-bookworm standin_python_base "linux/$ARCH"
    standin_list docker.io/library/node:20-bookworm-slim standin_node_base "linux/$ARCH"
else
    standin_python_base
    standin_node_base
    standin_lambda_python "$api_runtime"
fi

results=()
record() { # record LINE...: a check's summary line (PASS ... or FAIL ...)
    local line
    for line in "$@"; do
        [[ $line == PASS* || $line == FAIL* ]] || continue
        say "$line"
        results+=("$line")
    done
}
check() { # check NAME COMMAND...: PASS when the command succeeds
    local name=$1
    shift
    if "$@" >"$STATE/check.log" 2>&1; then record "PASS $name"; else record "FAIL $name: $(tail -3 "$STATE/check.log" | tr '\n' ' ')"; fi
}

# ---- 1. sam build -------------------------------------------------------------------------------------------------
BUILD="$STATE/build"
BUILD_CACHE="$STATE/cache"
BUILD_LOG="$STATE/build.log"
[ "$ARCH" = x86_64 ] || { BUILD="$STATE/build-$ARCH"; BUILD_CACHE="$STATE/cache-$ARCH"; BUILD_LOG="$STATE/build-$ARCH.log"; }
say "sam build for $ARCH (podman; the first time about 2 minutes)"
begin=$(date +%s)
if (cd "$ROOT" && SANDLOT_API_ARCH=$ARCH "$SAM" build --skip-pull-image --build-dir "$BUILD" \
    --cache-dir "$BUILD_CACHE" --cached --parameter-overrides "Architecture=$ARCH") >"$BUILD_LOG" 2>&1; then
    record "PASS sam build: $(($(date +%s) - begin)) s (load $(cut -d" " -f1-3 /proc/loadavg))"
else
    record "FAIL sam build: see $BUILD_LOG: $(grep -m3 -i 'error' "$BUILD_LOG" | tr '\n' ' ')"
fi
TEMPLATE="$BUILD/template.yaml"
# what was built, by its metadata: the zip's ELF files and each runtime image are of $ARCH
mapfile -t lines < <(python3 "$ROOT/infra/sam/arches.py" zip "$BUILD/ApiFunction" "$ARCH" || true)
record "${lines[@]}"
for image in $(sed -n 's/^ *ImageUri: *//p' "$TEMPLATE" 2>/dev/null); do
    mapfile -t lines < <(python3 "$ROOT/infra/sam/arches.py" image "$image" "$ARCH" || true)
    record "${lines[@]}"
done
if [ "$ARCH" = "$NATIVE_ARCH" ] && [ "$ARCH" = x86_64 ]; then
    # Lambda's other architecture, as far as it builds without emulation: `sam build` of the API function alone with
    # Architecture=arm64 (its zip's wheels are manylinux aarch64; the runtime images for arm64 need qemu-user:
    # SAM_ARCH=arm64, by hand, as its build takes far longer than CI's budget)
    begin=$(date +%s)
    if (cd "$ROOT" && SANDLOT_API_ARCH=arm64 "$SAM" build ApiFunction --build-dir "$STATE/build-arm64-zip" \
        --cache-dir "$STATE/cache-arm64-zip" --cached --parameter-overrides Architecture=arm64) \
        >"$STATE/build-arm64-zip.log" 2>&1; then
        say "sam build ApiFunction for arm64: $(($(date +%s) - begin)) s"
        mapfile -t lines < <(python3 "$ROOT/infra/sam/arches.py" zip "$STATE/build-arm64-zip/ApiFunction" arm64 || true)
        record "${lines[@]}"
    else
        record "FAIL sam build ApiFunction for arm64: see $STATE/build-arm64-zip.log"
    fi
fi
if [ "$ARCH" != "$NATIVE_ARCH" ]; then # nothing of another architecture runs here: the summary
    say "no invoke: the functions are $ARCH, this machine $NATIVE_ARCH (infra/arm64_test.sh runs arm64's)"
    passed=0
    for line in "${results[@]}"; do
        echo "$line"
        [[ $line == PASS* ]] && passed=$((passed + 1))
    done
    echo "sam_local: $passed passed, $((${#results[@]} - passed)) failed"
    [ "$passed" = ${#results[@]} ]
    exit
fi

# ---- 2. the zip on its runtime's stand-in --------------------------------------------------------------------------
lambda_image="public.ecr.aws/lambda/python:$api_runtime-$ARCH"
others=$(find "$BUILD/ApiFunction" -name '*.cpython-3*.so' ! -name "*.cpython-${api_runtime/./}-*" | head -3)
record "$([ -z "$others" ] && echo PASS || echo FAIL) the API zip holds only python$api_runtime extension modules${others:+: $others}"
check "the API zip imports on the python$api_runtime stand-in (handler.lambda_function)" \
    podman run --rm --network none -e AWS_REGION=us-east-1 -e AWS_DEFAULT_REGION=us-east-1 -e API_KEY="sam-import-check-$RANDOM$RANDOM" \
    -v "$BUILD/ApiFunction:/var/task:ro" \
    --entrypoint /var/lang/bin/python3 "$lambda_image" -c \
    "import sys, handler.lambda_function; assert sys.version_info[:2] == tuple(map(int, '$api_runtime'.split('.')))"

# ---- 3. sam local invoke -------------------------------------------------------------------------------------------------
checks() { "$VENV/bin/python" "$ROOT/infra/sam/checks.py" "$@" 2>"$STATE/checks.err" || true; }
for target in "PythonFunction python3 runtime-python3-run.json" "NodeFunction nodejs runtime-nodejs-run.json" \
    "PythonFunction probe runtime-probe.json"; do
    read -r function what event <<<"$target"
    begin=$(date +%s%N)
    "$SAM" local invoke "$function" --template "$TEMPLATE" --skip-pull-image --tenant-id invoke-tenant \
        -e "$ROOT/infra/events/$event" >"$STATE/invoke-$what.out" 2>"$STATE/invoke-$what.log" || true
    say "sam local invoke $function ($event): $((($(date +%s%N) - begin) / 1000000)) ms"
    mapfile -t lines < <(checks invoke "$what" "$STATE/invoke-$what.out")
    [ ${#lines[@]} -gt 0 ] || lines=("FAIL invoke $function: no answer; see $STATE/invoke-$what.log")
    record "${lines[@]}"
done

# ---- 4. start-lambda and start-api, per container mode ----------------------------------------------------------
# SAM's containers are on podman's default bridge; the API's reaches start-lambda at the bridge's gateway
podman run --rm --network podman --entrypoint /bin/true "$lambda_image" >/dev/null 2>&1 || true # the bridge up
GATEWAY=$(podman network inspect podman --format '{{range .Subnets}}{{.Gateway}}{{end}}' 2>/dev/null | head -1)
[ -n "$GATEWAY" ] || fail "no gateway for podman's default network"
KEY=sam-local-test-$RANDOM$RANDOM$RANDOM
LAMBDA_URL="http://$GATEWAY:$LAMBDA_PORT"
API_URL="http://127.0.0.1:$API_PORT"
ENV_VARS="$STATE/env-vars.json"
printf '{"ApiFunction": {"SANDLOT_LAMBDA_ENDPOINT_URL": "%s"}}\n' "$LAMBDA_URL" >"$ENV_VARS"

wait_port() { # wait_port HOST PORT PID: until something listens (or the process is gone)
    for _ in $(seq 1 600); do
        (echo >"/dev/tcp/$1/$2") 2>/dev/null && return 0
        kill -0 "$3" 2>/dev/null || return 1
        sleep 0.5
    done
    return 1
}

start_lambda() { # start_lambda MODE LOG: start-lambda in the background (lambda_pid)
    local warm=()
    [ "$1" = none ] || warm=(--warm-containers "$1")
    "$SAM" local start-lambda --template "$TEMPLATE" --skip-pull-image --host "$GATEWAY" --port "$LAMBDA_PORT" \
        "${warm[@]}" >"$2" 2>&1 &
    lambda_pid=$!
    kept+=("$lambda_pid")
}
start_api() { # start_api MODE LOG: start-api in the background (api_pid), its API function pointed at start-lambda
    local warm=()
    [ "$1" = none ] || warm=(--warm-containers "$1")
    "$SAM" local start-api --template "$TEMPLATE" --skip-pull-image --host 127.0.0.1 --port "$API_PORT" \
        --env-vars "$ENV_VARS" --parameter-overrides "ApiKey=$KEY" "${warm[@]}" >"$2" 2>&1 &
    api_pid=$!
    kept+=("$api_pid")
}
stop_servers() {
    stop_pid "${api_pid:-}"
    stop_pid "$lambda_pid"
    kept=("${kept[0]}")
    remove_sam_containers
}

for port in "$GATEWAY:$LAMBDA_PORT" "127.0.0.1:$API_PORT"; do
    if (echo >"/dev/tcp/${port%:*}/${port##*:}") 2>/dev/null; then
        fail "$port is already in use (a kept run? $0 --stop; or set SAM_LAMBDA_PORT, SAM_API_PORT)"
    fi
done
for mode in $MODES; do
    # boto3 direct invokes first, on start-lambda alone: in a warm mode they pin its containers to tenant-a
    say "mode $mode: start-lambda on $LAMBDA_URL"
    api_pid=
    start_lambda "$mode" "$STATE/start-lambda-$mode.log"
    begin=$(date +%s)
    if wait_port "$GATEWAY" "$LAMBDA_PORT" "$lambda_pid"; then
        say "mode $mode: start-lambda listening after $(($(date +%s) - begin)) s"
        mapfile -t lines < <(checks lambda "$LAMBDA_URL" "$mode")
        [ ${#lines[@]} -gt 0 ] || lines=("FAIL start-lambda checks ($mode): no output; see $STATE/checks.err")
        record "${lines[@]}"
    else
        record "FAIL mode $mode: start-lambda did not listen; see $STATE/start-lambda-$mode.log"
    fi
    stop_servers
    # then the Dify-format requests through start-api, in front of a new start-lambda
    say "mode $mode: start-lambda on $LAMBDA_URL, start-api on $API_URL"
    start_lambda "$mode" "$STATE/start-lambda-$mode-api.log"
    start_api "$mode" "$STATE/start-api-$mode.log"
    begin=$(date +%s)
    if wait_port "$GATEWAY" "$LAMBDA_PORT" "$lambda_pid" && wait_port 127.0.0.1 "$API_PORT" "$api_pid"; then
        say "mode $mode: both listening after $(($(date +%s) - begin)) s"
        mapfile -t lines < <(checks api "$API_URL" "$KEY" "$mode")
        [ ${#lines[@]} -gt 0 ] || lines=("FAIL start-api checks ($mode): no output; see $STATE/checks.err")
        record "${lines[@]}"
    else
        record "FAIL mode $mode: start-lambda or start-api did not listen; see $STATE/start-*-$mode*.log"
    fi
    if [ "$ACTION" = keep ] && [ "$mode" = "${MODES##* }" ]; then
        break # the last mode's servers stay
    fi
    stop_servers
done

# ---- summary -------------------------------------------------------------------------------------------------------
say "done; logs in $STATE"
passed=0
for line in "${results[@]}"; do
    echo "$line"
    [[ $line == PASS* ]] && passed=$((passed + 1))
done
if [ "$ACTION" = keep ]; then
    printf '%s\n' "${kept[@]}" >"$PIDS"
    echo "$RUN_ID" >"$KEPT_RUN"
    trap - EXIT
    echo "SAM_API_URL=$API_URL"
    echo "SAM_LAMBDA_URL=$LAMBDA_URL"
    echo "SAM_API_KEY=$KEY"
    echo "DOCKER_HOST=$DOCKER_HOST"
    echo "(left running; $0 --stop ends them. In a warm mode each start-lambda container serves the first tenant id"
    echo " it is invoked with, the API's own after a request through SAM_API_URL: direct invokes with another"
    echo " TenantId are refused; SAM_TEST_MODES=none gives a new container to every invocation)"
fi
echo "sam_local: $passed passed, $((${#results[@]} - passed)) failed"
[ "$passed" = ${#results[@]} ]
