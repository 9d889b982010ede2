#!/usr/bin/env bash
# The service image in a real container: build the root Dockerfile with podman and run it in each shape,
#   1. default: default privileges (what `docker run`, Dify's compose, Kubernetes' RuntimeDefault and
#      Fargate give: Docker's 14 capabilities and its seccomp profile): the chroot mode's protections;
#   2. compose: the compose file's privileges (SYS_ADMIN, NET_ADMIN, AppArmor unconfined): the full jail;
#   3. userns: a user namespace of the container's own (`--uidmap 0:100000:65536`, as rootless podman or
#      Docker, userns-remap, Kubernetes' hostUsers: false give): ids from the container's own map;
#      Its volume's root is 0770 and the container's root's (as `install -d -m 0770` gives): no other uid passes
#      through it. userns-additions: the same with an operator's addition (dify-sandbox's dependencies file),
#      built at start into that volume from the package index;
#   4. restricted: an arbitrary uid, group 0, no capabilities, no_new_privs (Kubernetes' restricted Pod
#      Security Standard, OpenShift's restricted-v2): podman's seccomp profile lets user namespaces through
#      but refuses sethostname, so the userns mode with the run's hostname step dropped.
# The shapes started with `podman run` reach no package index (PIP_INDEX_URL and npm's registry point at a closed
# port): the image's own default layers serve them. Each line gives the time from `podman run` (or `kube play`) to
# the first correct run (a Python run importing the default layer's packages), and beside it the time from the
# container's own exec (its StartedAt: what podman spends making the container left out), and the memory the container's
# cgroup is charged once idle (SANDLOT_CT_IDLE_SECONDS after its last run, default 30: past the 20 s after which
# the surplus ready children go), nothing dropped by hand.
# Each must be healthy, serve both languages, report its mode; a literal /tmp round trip (write
# /tmp/report.txt, read it back) is run and reported, and must pass in the modes whose /tmp is the run's own
# (full, userns: a tmpfs; chroot: its cell's directory), and elsewhere (landlock) say where to write instead. `sandlot serve` is the container's pid 1 and must have put its init in front
# (handler/pid_one.py).
#
#   infra/container_test.sh [--keep]     # as root; --keep leaves the containers running
#   infra/container_test.sh --stop       # removes what the runs kept with --keep left (theirs, nobody else's)
#
# Other runs share the machine (this script's from another tree, SAM's, other tests'): a run names everything it
# makes with its own id (containers, pods, their volumes and secrets, the image's tag), labels its containers
# sandlot.container-test.run=ID, and removes only those, by name or id, never by a pattern.
#
# No image registry is reachable here, so the Dockerfile's two base images are local stand-ins
# tagged with the names it uses (infra/standins.sh: Debian bookworm's minbase from debootstrap with
# python3 and python3-venv; the same with this machine's node and npm at the image's places). Both are
# made once and kept in podman's storage, as is the state under $SANDLOT_CT_DIR (default
# /var/tmp/sandlot-container-test).
#
# Needs root, and Debian's podman, runc, slirp4netns and debootstrap (installed when missing). Takes about five
# minutes with the stand-ins made and the image cached, 30 s of it at rest per shape (the first time: about 2
# minutes more; an image build, a minute or two: it builds the default layers). Not
# part of `./dev.sh test`: CI runs it first, as root (.ci/run), and anyone can run it alone.
#
# Environment: EXPECT_DEFAULT_MODE (chroot), EXPECT_COMPOSE_MODE (full), EXPECT_USERNS_MODE (chroot),
# EXPECT_RESTRICTED_MODE (userns), SANDLOT_CT_DIR; SANDLOT_CT_SHAPES (only these shapes, by name),
# SANDLOT_CT_IDLE_SECONDS (30). Everything a run makes carries its run id in its name (or label), so runs beside
# each other remove only their own.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
STATE=${SANDLOT_CT_DIR:-/var/tmp/sandlot-container-test}
EXPECT_DEFAULT_MODE=${EXPECT_DEFAULT_MODE:-chroot}
EXPECT_COMPOSE_MODE=${EXPECT_COMPOSE_MODE:-full}
EXPECT_USERNS_MODE=${EXPECT_USERNS_MODE:-chroot}
EXPECT_RESTRICTED_MODE=${EXPECT_RESTRICTED_MODE:-userns}
RESTRICTED_UID=1000990000 # as OpenShift's restricted-v2 picks one
# no package index is reachable from the shapes that serve the image's default layers (the Dockerfile bakes them)
NO_INDEX=(-e PIP_INDEX_URL=http://127.0.0.1:9/simple/ -e npm_config_registry=http://127.0.0.1:9/)
DEFAULT_PY='import requests, httpx, jinja2\nprint(6 * 7)' # the default layer's packages, and the answer
IDLE_SECONDS=${SANDLOT_CT_IDLE_SECONDS:-30}                  # at rest this long before its memory is read
SHAPES=${SANDLOT_CT_SHAPES:-} # only these shapes (names, space-separated); all when empty
wanted() { [ -z "$SHAPES" ] || [[ " $SHAPES " == *" $1 "* ]]; }
# names of this run's own (containers, pods, volumes, secrets, image): another run of this script may share the machine
RUN_ID=$(date +%s)-$$-$RANDOM
RUN_LABEL=sandlot.container-test.run=$RUN_ID
IMAGE=localhost/sandlot-container-test:$RUN_ID
KEY=container-test-$RANDOM$RANDOM
KEEP=0
case "${1:-}" in
    --keep) KEEP=1 ;;
    --stop) KEEP=stop ;;
    "") ;;
    *) echo "usage: $0 [--keep|--stop]" >&2; exit 2 ;;
esac

started=$(date +%s)
say() { printf '[%4ss] %s\n' "$(($(date +%s) - started))" "$*"; }
fail() { say "FAILED: $*"; exit 1; }

[ "$(id -u)" = 0 ] || fail "needs root (podman's rootful storage, debootstrap)"

# what this run made, one "KIND NAME" a line (container ID, pod NAME, volume NAME, secret NAME, image NAME): removed
# at its end, or kept in $STATE/kept-RUN.list for --stop
MADE="$STATE/made-$RUN_ID.list"
made() { echo "$1 $2" >>"$MADE"; }
remove_made() { # remove_made LIST: what a run listed, each by its own name or id, the pods before their volumes
    local kind name
    [ -s "$1" ] || return 0
    for kind in container pod volume secret image; do
        while read -r k name; do
            [ "$k" = "$kind" ] || continue
            case "$kind" in
                container) podman rm -f "$name" ;;
                pod) podman pod rm -f "$name" ;;
                volume) podman volume rm -f "$name" ;;
                secret) podman secret rm "$name" ;;
                image) podman rmi "$name" ;; # the tag (the layers stay cached for the next run)
            esac >/dev/null 2>&1 || true
        done <"$1"
    done
}
if [ "$KEEP" = stop ]; then
    shopt -s nullglob
    lists=("$STATE"/kept-*.list)
    [ ${#lists[@]} -gt 0 ] || { echo "nothing kept (no $STATE/kept-*.list)"; exit 0; }
    for list in "${lists[@]}"; do remove_made "$list" && rm -f "$list"; done
    echo "stopped"
    exit 0
fi
mkdir -p "$STATE"
: >"$MADE"
finish() {
    if [ "$KEEP" = 1 ]; then
        mv "$MADE" "$STATE/kept-$RUN_ID.list"
    else
        remove_made "$MADE"
        rm -f "$MADE"
    fi
}
trap finish EXIT

missing=()
# slirp4netns: the containers' network (below), which podman does not pull in on every Debian release;
# catatonit: the pause process of the pods `podman kube play` makes
for tool in podman runc slirp4netns catatonit debootstrap; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    # another apt (a neighbour's install) may hold dpkg's lock: wait for it rather than fail
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

mkdir -p "$STATE"
# shellcheck source=infra/standins.sh
. "$ROOT/infra/standins.sh"
export CONTAINERS_CONF="$STATE/containers.conf"
podman_conf "$CONTAINERS_CONF"

# ---- the base images' stand-ins (infra/standins.sh, shared with infra/sam_local_test.sh) -----------------
standin_python_base
standin_node_base

# ---- the image -------------------------------------------------------------------------------------------
say "building the image from $ROOT/Dockerfile"
# the build's RUN steps on the host's network; the containers on slirp4netns (below): neither needs iptables
made image "$IMAGE"
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
DATA_MODE=0775
PY_CODE=$DEFAULT_PY
OFFLINE=1 # 0: the shape reaches the package index (it builds an operator's addition)
check() { # check NAME EXPECTED_MODE podman-run-options...: start, wait healthy, run both languages, read the mode
    local name=$1 expected=$2
    shift 2
    wanted "$name" || return 0
    local container="sandlot-ct-$name-$RUN_ID" port data id
    port=$(free_port)
    data="$STATE/data-$name-$RUN_ID"
    rm -rf "$data" && mkdir -p "$data"
    # the volume as the shape's own user finds it: root of a user namespace is 100000 here, and a restricted
    # pod's arbitrary uid writes through group 0 (Kubernetes' fsGroup, OpenShift's convention)
    [ -z "$DATA_OWNER" ] || chown "$DATA_OWNER" "$data"
    # a group-owned volume, or one made with `install -d -m 0770`, is closed to every other uid (DATA_MODE=0770)
    chmod "$DATA_MODE" "$data"
    say "$name: starting ($*)"
    local offline=()
    [ "$OFFLINE" = 0 ] || offline=("${NO_INDEX[@]}")
    local begin=$(date +%s.%N)
    id=$(podman run -d --name "$container" --label "$RUN_LABEL" --no-healthcheck \
        --network slirp4netns:port_handler=slirp4netns -p "127.0.0.1:$port:8194" -e API_KEY="$KEY" \
        -v "$data:/var/lib/sandlot" "${offline[@]}" "$@" "$IMAGE") || fail "$name: podman run"
    made container "$id"
    verify "$name" "$expected" "$port" "$id" "$KEY" "$begin"
    if [ $KEEP = 0 ]; then
        podman rm -f "$id" >/dev/null 2>&1 || true
        rm -rf "$data"
    else
        say "$name: left running on 127.0.0.1:$port (API key $KEY)"
    fi
}

# Kubernetes' RuntimeDefault seccomp profile (containerd's and CRI-O's, as Docker's): podman's own, less what
# it gives a container without CAP_SYS_ADMIN that those do not: the namespace and mount calls, and clone with
# any CLONE_NEW* flag (clone3 answers ENOSYS so that libc falls back to clone, whose flags a filter can read)
runtime_default_profile() {
    python3 - "$1" <<'EOF'
import json, sys
profile = json.load(open("/usr/share/containers/seccomp.json"))
admin = {"unshare", "setns", "mount", "umount", "umount2", "pivot_root", "clone", "clone3", "sethostname"}
for rule in profile["syscalls"]:
    if rule["action"] == "SCMP_ACT_ALLOW" and not rule.get("includes") and not rule.get("args"):
        rule["names"] = [n for n in rule["names"] if n not in admin]
profile["syscalls"] += [
    {"names": sorted(admin - {"clone", "clone3"}), "action": "SCMP_ACT_ERRNO", "errnoRet": 1},  # EPERM, as theirs
    {"names": ["clone"], "action": "SCMP_ACT_ALLOW",
     "args": [{"index": 0, "value": 0x7E020000, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}]},
    {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38},
]
json.dump(profile, open(sys.argv[1], "w"))
EOF
}

check_kube() { # check_kube NAME EXPECTED_MODE MANIFEST [runAsUser]: `podman kube play` of a manifest as it is
    local name=$1 expected=$2 manifest=$3 user=${4:-}
    wanted "$name" || return 0
    local port played="$STATE/kube-$name-$RUN_ID.yaml" pod="sandlot-ct-$name-$RUN_ID-pod-0" key
    local secret="sandlot-api-key-$name-$RUN_ID"
    port=$(free_port)
    mkdir -p "$STATE/seccomp"
    runtime_default_profile "$STATE/seccomp/runtime-default.json"
    # What a cluster does that podman's kube play does not, done here and nothing else: the Secret the
    # operator creates with kubectl (made here as a podman secret of the form podman 4.3's env lookup reads;
    # the manifests hold no key), a host port on loopback to reach the pod, the RuntimeDefault
    # profile (by annotation), and for the restricted variant the uid OpenShift would pick.
    key=$(NAME="$name-$RUN_ID" MANIFEST="$manifest" PLAYED="$played" PORT="$port" RUN_AS="$user" IMAGE="$IMAGE" \
        SECRET="$secret" python3 - <<'EOF'
import base64, json, os, re
played = open(os.environ["MANIFEST"]).read().split("\n---\n")
key = "kube-" + os.urandom(16).hex()  # the operator's Secret: the manifests hold no key
for i, doc in enumerate(played):
    if "kind: Deployment" in doc:
        doc = doc.replace("              containerPort: 8194", "              containerPort: 8194\n"
                          f"              hostPort: {os.environ['PORT']}\n              hostIP: 127.0.0.1")
        doc = doc.replace("\n  name: sandbox\n", f"\n  name: sandlot-ct-{os.environ['NAME']}\n", 1)  # its pod's name
        # podman makes a named volume of each emptyDir, by its name: one of each shape's own here
        doc = re.sub(r"(- name: )(data|tmp)\b", rf"\1sandlot-ct-{os.environ['NAME']}-\2", doc)
        doc = doc.replace("image: localhost/sandlot:latest", f"image: {os.environ['IMAGE']}")
        doc = doc.replace("name: sandlot-api-key\n", f"name: {os.environ['SECRET']}\n")  # the run's own secret
        doc = doc.replace("    metadata:\n      labels:", "    metadata:\n      annotations:\n"
                          "        seccomp.security.alpha.kubernetes.io/pod: localhost/runtime-default.json\n      labels:")
        if os.environ["RUN_AS"]:
            doc = doc.replace("        runAsNonRoot: true\n", "        runAsNonRoot: true\n"
                              f"        runAsUser: {os.environ['RUN_AS']}\n        runAsGroup: 0\n", 1)
        played[i] = doc
open(os.environ["PLAYED"], "w").write("\n---\n".join(played))
json.dump({"api-key": base64.b64encode(key.encode()).decode()}, open(os.environ["PLAYED"] + ".secret", "w"))
print(key)
EOF
    )
    podman secret create "$secret" "$played.secret" >/dev/null 2>&1 || fail "$name: podman secret create $secret"
    made secret "$secret"
    rm -f "$played.secret"
    say "$name: podman kube play $manifest"
    local begin=$(date +%s.%N)
    made pod "$pod"
    made volume "sandlot-ct-$name-$RUN_ID-data"
    made volume "sandlot-ct-$name-$RUN_ID-tmp"
    podman kube play --network slirp4netns:port_handler=slirp4netns --seccomp-profile-root "$STATE/seccomp" \
        "$played" >"$STATE/$name.play.log" 2>&1 || cat "$STATE/$name.play.log"
    verify "$name" "$expected" "$port" "$pod-sandlot" "$key" "$begin"
    if [ $KEEP = 0 ]; then
        podman pod rm -f "$pod" >/dev/null 2>&1 || true
        podman volume rm -f "sandlot-ct-$name-$RUN_ID-data" "sandlot-ct-$name-$RUN_ID-tmp" >/dev/null 2>&1 || true
        podman secret rm "$secret" >/dev/null 2>&1 || true
        rm -f "$played"
    else
        say "$name: left running on 127.0.0.1:$port (API key $key)"
    fi
}

verify() { # verify NAME EXPECTED PORT CONTAINER API_KEY BEGIN: wait healthy, run both languages, read the mode
    local name=$1 expected=$2 port=$3 container=$4 KEY=$5 begin=$6
    # exec -> first correct run: a Python run asked for again and again from `podman run` (or `kube play`) on,
    # until one answers right (a run that comes while the service starts waits for it, within its timeout)
    local first_run="" from_exec="" answered="" tick=0 answer
    while [ "$expected" != refused ] && [ $tick -lt 1200 ]; do
        tick=$((tick + 1))
        answer=$(curl -s --max-time 30 -H "X-Api-Key: $KEY" -H 'Content-Type: application/json' \
            -d "{\"language\":\"python3\",\"code\":\"$PY_CODE\"}" "http://127.0.0.1:$port/v1/sandbox/run" || true)
        if [[ $answer == *'"stdout":"42\n"'* ]]; then
            answered=$(date +%s.%N)
            first_run=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$begin" "$answered")
            # and from the container's own exec (the runtime's StartedAt): what podman spends making the container
            # (its storage, its user namespace, slirp4netns) left out
            from_exec=$(podman inspect -f '{{.State.StartedAt}}' "$container" 2>/dev/null | python3 -c '
import sys
from datetime import datetime
day, clock = sys.stdin.read().split()[:2]
whole, _, fraction = clock.partition(".")
started = datetime.fromisoformat(f"{day}T{whole}+00:00").timestamp() + float("0." + (fraction or "0"))
print(f"{float(sys.argv[1]) - started:.2f}")' "$answered" 2>/dev/null || true)
            break
        fi
        if [ $((tick % 20)) = 0 ]; then
            [ "$(podman inspect -f '{{.State.Running}}' "$container" 2>/dev/null)" = true ] || break
            [[ $answer == *'"code":-500'* ]] && break # refused for good (a layer that could not be built)
        fi
        sleep 0.1
    done
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
    local ready
    ready=$(python3 -c "import sys, time; print(f'{time.time() - float(sys.argv[1]):.1f}')" "$begin")
    podman logs "$container" >"$STATE/$name.log" 2>&1 || true
    local python node detail
    python=$(api "$port" /v1/sandbox/run "{\"language\":\"python3\",\"code\":\"$PY_CODE\",\"enable_network\":true}" || true)
    node=$(api "$port" /v1/sandbox/run '{"language":"nodejs","code":"console.log(6 * 7)","enable_network":true}' || true)
    # a literal /tmp path, written and read back (Dify code writes /tmp/report.pdf)
    local tmp_trip
    tmp_trip=$(api "$port" /v1/sandbox/run '{"language":"python3","code":"open(\"/tmp/report.txt\", \"w\").write(\"kept\")\nprint(open(\"/tmp/report.txt\").read())"}' || true)
    detail=$(api "$port" /v1/sandbox/health || true)
    local health_code
    health_code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health" || true)
    # `sandlot serve` is the container's pid 1 here: it must have put its init in front (handler/pid_one.py)
    local init
    init=$(podman exec "$container" python3 -c 'print(open("/proc/1/cmdline").read().replace("\0", " "))' || true)
    podman logs "$container" >"$STATE/$name.log" 2>&1 || true
    # charged idle memory: what the container's memory cgroup is charged at rest (podman stats' figure; the
    # cgroup's own usage and its page cache beside it), nothing dropped by hand
    sleep "$IDLE_SECONDS"
    local memory cgroup_dir
    memory=$(podman stats --no-stream --format '{{.MemUsage}}' "$container" 2>/dev/null | awk '{print $1}' || true)
    cgroup_dir=/sys/fs/cgroup/memory$(podman inspect -f '{{.State.CgroupPath}}' "$container" 2>/dev/null || true)
    [ -f "$cgroup_dir/memory.usage_in_bytes" ] || cgroup_dir=/sys/fs/cgroup$(podman inspect -f '{{.State.CgroupPath}}' "$container" 2>/dev/null || true)
    local cgroup_memory
    cgroup_memory=$(CGROUP="$cgroup_dir" python3 -c '
import os
d = os.environ["CGROUP"]
def read(name):
    try:
        return open(os.path.join(d, name)).read()
    except OSError:
        return ""
usage = read("memory.usage_in_bytes") or read("memory.current")
stat = dict(line.split() for line in read("memory.stat").splitlines() if len(line.split()) == 2)
cache = stat.get("total_cache") or stat.get("file") or "0"
# kernel memory (dentries, inodes, page tables, stacks): the kmem counter of cgroup v1, "kernel" (or slab) of v2
kernel = read("memory.kmem.usage_in_bytes").strip() or stat.get("kernel") or stat.get("slab") or "0"
print(f"{int(usage or 0) / 1e6:.0f} MB (page cache {int(cache) / 1e6:.0f} MB, kernel {int(kernel) / 1e6:.0f} MB)" if usage else "unknown")
' || true)
    local verdict
    verdict=$(NAME="$name" EXPECTED="$expected" HEALTHY="$healthy" READY="$ready" PYTHON_RUN="$python" NODE_RUN="$node" \
        DETAIL="$detail" INIT="$init" TMP_TRIP="$tmp_trip" HEALTH_CODE="$health_code" FIRST_RUN="$first_run" FROM_EXEC="$from_exec" \
        MEMORY="$memory" CGROUP_MEMORY="$cgroup_memory" BUILDS="${BUILDS:-0}" python3 - <<'EOF'
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
expected = os.environ["EXPECTED"]
why = {lang: rt.get("error") for lang, rt in detail.items() if rt.get("error")}
if expected == "refused":  # healthy-with-reason: 503, runs -500 saying why, never served without a jail
    runs = [load("PYTHON_RUN"), load("NODE_RUN")]
    ok = os.environ["HEALTHY"] == "0" and os.environ["HEALTH_CODE"] == "503" and set(why) == {"python3", "nodejs"}
    ok = ok and all(r.get("code") == -500 and "jail" in (r.get("message") or "") for r in runs)
else:
    ok = os.environ["HEALTHY"] == "1" and all(serves.values()) and all(m == expected for m in modes.values())
    ok = ok and set(modes) == {"python3", "nodejs"}
init = "pid_one.py" in os.environ["INIT"]
ok = ok and init
trip = load("TMP_TRIP")
tmp = stdout(trip) == "kept\n"
tmp_error = ((trip.get("data") or {}).get("stderr") or trip.get("message") or "no answer").strip()
if not tmp and set(modes.values()) <= {"full", "userns", "chroot"}:
    ok = False  # the run's own tmpfs on /tmp, or its cell's /tmp (chroot): a literal path must work
if not tmp and "write under the working directory" not in tmp_error:
    ok = False  # where /tmp cannot be the run's own (landlock), the error says where to write instead
tmp_shown = tmp or tmp_error.splitlines()[-1:]
hostname = {lang: (rt.get("protections") or {}).get("hostname") for lang, rt in detail.items()}
first_run = os.environ["FIRST_RUN"]
from_exec = os.environ["FROM_EXEC"]
print(f"{'PASS' if ok else 'FAIL'} {os.environ['NAME']}: first correct run {first_run or 'never'} s after start"
      + (f" ({from_exec} s after the container's exec)" if first_run and from_exec else "")
      + (" (builds an operator's addition)" if os.environ["BUILDS"] == "1" else "")
      + f", idle memory {os.environ['MEMORY'] or 'unknown'} (cgroup: {os.environ['CGROUP_MEMORY']}), "
      f"healthy={os.environ['HEALTHY'] == '1'} in {os.environ['READY']} s, "
      f"serves={serves}, init={init}, modes={modes} (expected {expected}), tmp={tmp_shown}, "
      f"hostname={hostname}, record={record}"
      + (f", errors={why}" if why else ""))
EOF
    )
    say "$verdict"
    results+=("$verdict")
}

check default "$EXPECT_DEFAULT_MODE"
check compose "$EXPECT_COMPOSE_MODE" --cap-add SYS_ADMIN --cap-add NET_ADMIN --security-opt apparmor=unconfined
# the volume's root as `install -d -m 0770` gives it, the container's root's: no other uid passes through it
DATA_OWNER=100000:100000 DATA_MODE=0770 check userns "$EXPECT_USERNS_MODE" --uidmap 0:100000:65536 --gidmap 0:100000:65536
# the same with an operator's addition (dify-sandbox's dependencies file: one more package), which is built at
# start into that volume, from the package index: the build's uid cannot pass through the volume's root
printf 'requests\nhttpx\njinja2\nsix\n' >"$STATE/additions-requirements.txt"
chmod 0644 "$STATE/additions-requirements.txt"
DATA_OWNER=100000:100000 DATA_MODE=0770 PY_CODE='import requests, six\nprint(6 * 7)' OFFLINE=0 BUILDS=1 \
    check userns-additions "$EXPECT_USERNS_MODE" --uidmap 0:100000:65536 --gidmap 0:100000:65536 \
    -v "$STATE/additions-requirements.txt:/dependencies/python-requirements.txt:ro"
DATA_OWNER=$RESTRICTED_UID:0 check restricted "$EXPECT_RESTRICTED_MODE" \
    --user "$RESTRICTED_UID:0" --cap-drop=all --security-opt no-new-privileges

# the manifests under infra/kubernetes/ as they are. The restricted one (an arbitrary uid, no capabilities, no
# privilege escalation, RuntimeDefault: no root and no user namespaces) is served only by the Landlock jail:
# expected where runtimes/jail/modes.py has it, else healthy-with-reason (503, runs -500 saying why).
if grep -q '"landlock"' "$ROOT/runtimes/jail/modes.py"; then
    EXPECT_KUBE_RESTRICTED=${EXPECT_KUBE_RESTRICTED:-landlock}
else
    EXPECT_KUBE_RESTRICTED=${EXPECT_KUBE_RESTRICTED:-refused}
fi
check_kube kube-default "$EXPECT_DEFAULT_MODE" "$ROOT/infra/kubernetes/default/sandlot.yaml"
check_kube kube-restricted "$EXPECT_KUBE_RESTRICTED" "$ROOT/infra/kubernetes/restricted/sandlot.yaml" "$RESTRICTED_UID"

say "done; logs in $STATE/{default,compose,userns,restricted,kube-default,kube-restricted}.log"
passed=0
for line in "${results[@]}"; do
    echo "$line"
    [[ $line == PASS* ]] && passed=$((passed + 1))
done
echo "containers: $passed passed, $((${#results[@]} - passed)) failed"
[ "$passed" = ${#results[@]} ]
