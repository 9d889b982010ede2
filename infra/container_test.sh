#!/usr/bin/env bash
# The service image in a real container: build the root Dockerfile with podman and run it in each shape,
#   1. default: default privileges (what `docker run`, Dify's compose, Kubernetes' RuntimeDefault and
#      Fargate give: Docker's 14 capabilities and its seccomp profile): the chroot mode's protections;
#   2. compose: the compose file's privileges (SYS_ADMIN, NET_ADMIN, AppArmor unconfined): the full jail;
#   3. userns: a user namespace of the container's own (`--uidmap 0:100000:65536`, as rootless podman or
#      Docker, userns-remap, Kubernetes' hostUsers: false give): ids from the container's own map;
#   4. restricted: an arbitrary uid, group 0, no capabilities, no_new_privs (Kubernetes' restricted Pod
#      Security Standard, OpenShift's restricted-v2): podman's seccomp profile lets user namespaces through
#      but refuses sethostname, so the userns mode with the run's hostname step dropped.
# Each must be healthy, serve both languages, report its mode; a literal /tmp round trip (write
# /tmp/report.txt, read it back) is run and reported, and must pass in the modes whose /tmp is the run's own
# tmpfs (full, userns). `sandlot serve` is the container's pid 1 and must have put its init in front
# (handler/pid_one.py).
#
#   infra/container_test.sh [--keep]     # as root; --keep leaves the containers running
#
# No image registry is reachable here, so the Dockerfile's two base images are local stand-ins
# tagged with the names it uses (docker.io/library/python:3.11-slim-bookworm: Debian bookworm's
# minbase from debootstrap with python3, python3-venv and ca-certificates; .../node:20-bookworm-slim:
# this machine's node and npm at the image's places). Both are made once and kept in podman's
# storage, as is the state under $SANDLOT_CT_DIR (default /var/tmp/sandlot-container-test).
# Downloads from inside go through this machine's network: its CA files are copied into the stand-in.
#
# Needs root, and Debian's podman, runc, slirp4netns and debootstrap (installed when missing). Takes about
# half a minute with the stand-ins made and the image cached (the first time: about 2 minutes more). Not
# part of `./dev.sh test`: CI runs it first, as root (.ci/run), and anyone can run it alone.
#
# Environment: EXPECT_DEFAULT_MODE (chroot), EXPECT_COMPOSE_MODE (full), EXPECT_USERNS_MODE (chroot),
# EXPECT_RESTRICTED_MODE (userns), SANDLOT_CT_DIR.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
STATE=${SANDLOT_CT_DIR:-/var/tmp/sandlot-container-test}
EXPECT_DEFAULT_MODE=${EXPECT_DEFAULT_MODE:-chroot}
EXPECT_COMPOSE_MODE=${EXPECT_COMPOSE_MODE:-full}
EXPECT_USERNS_MODE=${EXPECT_USERNS_MODE:-chroot}
EXPECT_RESTRICTED_MODE=${EXPECT_RESTRICTED_MODE:-userns}
RESTRICTED_UID=1000990000 # as OpenShift's restricted-v2 picks one
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
IMAGE=localhost/sandlot-container-test:latest
PYTHON_BASE=docker.io/library/python:3.11-slim-bookworm
NODE_BASE=docker.io/library/node:20-bookworm-slim
KEY=container-test-$RANDOM$RANDOM
KEEP=0
[ "${1:-}" = "--keep" ] && KEEP=1

started=$(date +%s)
say() { printf '[%4ss] %s\n' "$(($(date +%s) - started))" "$*"; }
fail() { say "FAILED: $*"; exit 1; }

[ "$(id -u)" = 0 ] || fail "needs root (podman's rootful storage, debootstrap)"
missing=()
# slirp4netns: the containers' network (below); podman does not pull it in on every Debian release
for tool in podman runc slirp4netns debootstrap; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    # another apt (a neighbour's install) may hold dpkg's lock: wait for it rather than fail
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

mkdir -p "$STATE"
# This machine's podman: runc (crun refuses the hybrid cgroup setup), open-file limits within the hard
# limit, and Docker's default capability set (podman's own default leaves out MKNOD, NET_RAW, AUDIT_WRITE).
export CONTAINERS_CONF="$STATE/containers.conf"
cat >"$CONTAINERS_CONF" <<'EOF'
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
default_capabilities = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "SETPCAP",
  "NET_BIND_SERVICE", "NET_RAW", "SYS_CHROOT", "MKNOD", "AUDIT_WRITE", "SETFCAP"]
[engine]
runtime = "runc"
EOF

# ---- the base images' stand-ins ----------------------------------------------------------------------
if ! podman image exists "$PYTHON_BASE"; then
    say "making the stand-in for $PYTHON_BASE (debootstrap, about 45 s)"
    base="$STATE/python-base"
    rm -rf "$base"
    debootstrap --variant=minbase bookworm "$base" "$MIRROR" >"$STATE/debootstrap.log" 2>&1 ||
        fail "debootstrap: see $STATE/debootstrap.log"
    mkdir -p "$base/usr/local/share/ca-certificates"
    cp /usr/local/share/ca-certificates/*.crt "$base/usr/local/share/ca-certificates/" 2>/dev/null || true
    cp /etc/resolv.conf "$base/etc/resolv.conf"
    chroot "$base" /bin/sh -c 'export DEBIAN_FRONTEND=noninteractive; apt-get update -q &&
        apt-get install -y -q --no-install-recommends python3 python3-venv ca-certificates &&
        apt-get clean && rm -rf /var/lib/apt/lists/*' >"$STATE/apt.log" 2>&1 || fail "apt in the stand-in: see $STATE/apt.log"
    : >"$base/etc/resolv.conf"
    bundle=/etc/ssl/certs/ca-certificates.crt
    # one --change per variable: podman's import reads `ENV A=1 B=2` as A set to "1 B=2"
    tar -C "$base" -c . | podman import \
        --change "ENV LANG=C.UTF-8" --change "ENV PIP_CERT=$bundle" --change "ENV SSL_CERT_FILE=$bundle" \
        --change "ENV REQUESTS_CA_BUNDLE=$bundle" \
        --change 'CMD ["python3"]' --quiet - "$PYTHON_BASE" >/dev/null
    rm -rf "$base"
fi
if ! podman image exists "$NODE_BASE"; then
    say "making the stand-in for $NODE_BASE (this machine's node and npm)"
    base="$STATE/node-base"
    rm -rf "$base"
    mkdir -p "$base/usr/local/bin" "$base/usr/local/lib/node_modules"
    cp "$(readlink -f "$(command -v node)")" "$base/usr/local/bin/node"
    npm_dir=$(dirname "$(dirname "$(readlink -f "$(command -v npm)")")")
    cp -a "$npm_dir" "$base/usr/local/lib/node_modules/npm"
    tar -C "$base" -c . | podman import --quiet - "$NODE_BASE" >/dev/null
    rm -rf "$base"
fi

# ---- the image -------------------------------------------------------------------------------------------
say "building the image from $ROOT/Dockerfile"
# the build's RUN steps on the host's network; the containers on slirp4netns (below): neither needs iptables
podman build --quiet --network host --format docker --pull=never -t "$IMAGE" "$ROOT" >"$STATE/build.log" 2>&1 ||
    { tail -30 "$STATE/build.log"; fail "podman build: see $STATE/build.log"; }
say "built $IMAGE"

# ---- runs ------------------------------------------------------------------------------------------------
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

api() { # api PORT PATH [JSON]: the body of a request to the service
    if [ $# -ge 3 ]; then
        curl -s --max-time 60 -H "X-Api-Key: $KEY" -H 'Content-Type: application/json' -d "$3" "http://127.0.0.1:$1$2"
    else
        curl -s --max-time 60 -H "X-Api-Key: $KEY" "http://127.0.0.1:$1$2"
    fi
}

results=()
DATA_OWNER=""
check() { # check NAME EXPECTED_MODE podman-run-options...: start, wait healthy, run both languages, read the mode
    local name=$1 expected=$2
    shift 2
    local container="sandlot-ct-$name" port data
    port=$(free_port)
    data="$STATE/data-$name"
    podman rm -f "$container" >/dev/null 2>&1 || true
    rm -rf "$data" && mkdir -p "$data"
    # the volume as the shape's own user finds it: root of a user namespace is 100000 here, and a restricted
    # pod's arbitrary uid writes through group 0 (Kubernetes' fsGroup, OpenShift's convention)
    [ -z "$DATA_OWNER" ] || chown "$DATA_OWNER" "$data"
    chmod 0775 "$data"
    say "$name: starting ($*)"
    local begin=$(date +%s)
    podman run -d --name "$container" --no-healthcheck --network slirp4netns:port_handler=slirp4netns \
        -p "127.0.0.1:$port:8194" -e API_KEY="$KEY" \
        -v "$data:/var/lib/sandlot" "$@" "$IMAGE" >/dev/null
    local healthy=0
    for tick in $(seq 1 300); do
        if [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health")" = 200 ]; then
            healthy=1
            break
        fi
        [ "$(podman inspect -f '{{.State.Running}}' "$container" 2>/dev/null)" = true ] || break
        if [ $((tick % 5)) = 0 ] && api "$port" /v1/sandbox/health | python3 -c '
import json, sys
runtimes = (json.load(sys.stdin).get("data") or {}).get("runtimes") or {}
passing = ("starting", "no child confined yet")
refused = runtimes and all(rt.get("error") and rt.get("error") not in passing and not rt.get("ready") for rt in runtimes.values())
sys.exit(0 if refused else 1)' 2>/dev/null; then
            break # every runtime refuses for good: no use waiting
        fi
        sleep 1
    done
    local ready=$(($(date +%s) - begin))
    podman logs "$container" >"$STATE/$name.log" 2>&1 || true
    local python node detail
    python=$(api "$port" /v1/sandbox/run '{"language":"python3","code":"print(6 * 7)","enable_network":true}' || true)
    node=$(api "$port" /v1/sandbox/run '{"language":"nodejs","code":"console.log(6 * 7)","enable_network":true}' || true)
    # a literal /tmp path, written and read back (Dify code writes /tmp/report.pdf)
    local tmp_trip
    tmp_trip=$(api "$port" /v1/sandbox/run '{"language":"python3","code":"open(\"/tmp/report.txt\", \"w\").write(\"kept\")\nprint(open(\"/tmp/report.txt\").read())"}' || true)
    detail=$(api "$port" /v1/sandbox/health || true)
    # `sandlot serve` is the container's pid 1 here: it must have put its init in front (handler/pid_one.py)
    local init
    init=$(podman exec "$container" python3 -c 'print(open("/proc/1/cmdline").read().replace("\0", " "))' || true)
    podman logs "$container" >"$STATE/$name.log" 2>&1 || true
    local verdict
    verdict=$(NAME="$name" EXPECTED="$expected" HEALTHY="$healthy" READY="$ready" PYTHON_RUN="$python" NODE_RUN="$node" \
        DETAIL="$detail" INIT="$init" TMP_TRIP="$tmp_trip" python3 - <<'EOF'
import json, os
def load(name):
    try:
        return json.loads(os.environ[name])
    except ValueError:
        return {}
def stdout(envelope):
    return ((envelope or {}).get("data") or {}).get("stdout")
detail = (load("DETAIL").get("data") or {}).get("runtimes") or {}
modes = {lang: ((rt.get("protections") or {}).get("mode") or "none") for lang, rt in detail.items()}
platform = (detail.get("python3") or {}).get("platform") or {}
record = {k: platform.get(k) for k in ("chroot", "setuid", "mknod", "host_nft", "mount_namespaces", "seccomp")}
serves = {"python3": stdout(load("PYTHON_RUN")) == "42\n", "nodejs": stdout(load("NODE_RUN")) == "42\n"}
ok = os.environ["HEALTHY"] == "1" and all(serves.values()) and all(m == os.environ["EXPECTED"] for m in modes.values())
ok = ok and set(modes) == {"python3", "nodejs"}
init = "pid_one.py" in os.environ["INIT"]
ok = ok and init
trip = load("TMP_TRIP")
tmp = stdout(trip) == "kept\n"
if not tmp and set(modes.values()) <= {"full", "userns"}:
    ok = False  # the run's own tmpfs on /tmp: a literal path must work
tmp_shown = tmp or ((trip.get("data") or {}).get("stderr") or trip.get("message") or "no answer").strip().splitlines()[-1:]
hostname = {lang: (rt.get("protections") or {}).get("hostname") for lang, rt in detail.items()}
why = {lang: rt.get("error") for lang, rt in detail.items() if rt.get("error")}
print(f"{'PASS' if ok else 'FAIL'} {os.environ['NAME']}: healthy={os.environ['HEALTHY'] == '1'} in {os.environ['READY']} s, "
      f"serves={serves}, init={init}, modes={modes} (expected {os.environ['EXPECTED']}), tmp={tmp_shown}, "
      f"hostname={hostname}, record={record}"
      + (f", errors={why}" if why else ""))
EOF
    )
    say "$verdict"
    results+=("$verdict")
    if [ $KEEP = 0 ]; then
        podman rm -f "$container" >/dev/null 2>&1 || true
    else
        say "$name: left running on 127.0.0.1:$port (API key $KEY)"
    fi
}

check default "$EXPECT_DEFAULT_MODE"
check compose "$EXPECT_COMPOSE_MODE" --cap-add SYS_ADMIN --cap-add NET_ADMIN --security-opt apparmor=unconfined
DATA_OWNER=100000:100000 check userns "$EXPECT_USERNS_MODE" --uidmap 0:100000:65536 --gidmap 0:100000:65536
DATA_OWNER=$RESTRICTED_UID:0 check restricted "$EXPECT_RESTRICTED_MODE" \
    --user "$RESTRICTED_UID:0" --cap-drop=all --security-opt no-new-privileges

say "done; logs in $STATE/{default,compose,userns,restricted}.log"
passed=0
for line in "${results[@]}"; do
    echo "$line"
    [[ $line == PASS* ]] && passed=$((passed + 1))
done
echo "containers: $passed passed, $((${#results[@]} - passed)) failed"
[ "$passed" = ${#results[@]} ]
