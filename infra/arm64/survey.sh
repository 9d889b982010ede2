#!/bin/bash
# In the arm64 machine (through its agent, on a machine `infra/arm64_test.sh --keep` left up):
#   python3 infra/arm64/vm.py exec /var/tmp/sandlot-arm64/kept/ctl.sock bash /opt/sandlot/src/infra/arm64/survey.sh
# The system calls Python 3.11 and Node 20 make on aarch64 starting and doing a typical run, and pip and npm
# installing a package (strace -f): one line per call, `NAME SCENARIOS...`, sorted, for the review of the
# allow-list (runtimes/jail/policy/allowlist.py) against what the interpreters make on this architecture.
set -uo pipefail
export PATH=/opt/sandlot/venv/bin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 HOME=/tmp
out=$(mktemp -d /tmp/survey.XXXXXX)
[ -f /opt/sandlot/src/.arm64-ca.crt ] && export PIP_CERT=/opt/sandlot/src/.arm64-ca.crt \
    NODE_EXTRA_CA_CERTS=/opt/sandlot/src/.arm64-ca.crt
trace() {  # trace NAME COMMAND...
    local name=$1
    shift
    strace -f -qq -o "$out/$name.raw" "$@" >"$out/$name.out" 2>&1 || echo "survey: $name exited $?" >&2
    sed -n 's/^[0-9]* *\([a-z_0-9]*\)(.*/\1/p' "$out/$name.raw" | sort -u >"$out/$name.calls"
}
PY='import json, base64, datetime, re, hashlib, random, math, collections
data = {"a": [1, 2, 3], "b": "héllo", "when": datetime.datetime.now().isoformat()}
text = json.dumps(data)
print(base64.b64encode(text.encode()).decode(), hashlib.sha256(text.encode()).hexdigest())
print(sum(random.random() for _ in range(1000)) > 0, re.sub(r"\d", "#", "a1b2"), math.sqrt(2))
print(collections.Counter("hello world").most_common(2))'
JS='const data = {a: [1, 2, 3], b: "héllo", when: new Date().toISOString()};
const text = JSON.stringify(data);
console.log(Buffer.from(text).toString("base64"), require("crypto").createHash("sha256").update(text).digest("hex"));
setTimeout(() => console.log([1, 2, 3].map(x => x * 2), "a1b2".replace(/\d/g, "#")), 10);
Promise.resolve(42).then(v => console.log(v));'
trace python-run /usr/bin/python3.11 -c "$PY"
trace python-venv-run /opt/sandlot/venv/bin/python -c "$PY"
trace node-run /usr/local/bin/node -e "$JS"
trace pip-install /opt/sandlot/venv/bin/python -m pip install --no-cache-dir --target "$out/pip-target" six
trace npm-install /usr/local/bin/npm install --no-audit --no-fund --prefix "$out/npm-prefix" left-pad
for name in python-run python-venv-run node-run pip-install npm-install; do
    echo "== $name: $(wc -l <"$out/$name.calls") calls; output: $(head -c 300 "$out/$name.out" | tr '\n' ' ')"
done
echo "== every call (name: scenarios; [base] where the allow-list's BASE_SYSCALLS names it)"
base=$(cd /opt/sandlot/src && python3 -c 'from runtimes.jail.policy import allowlist as a; print(*a.BASE_SYSCALLS)')
cat "$out"/*.calls | sort -u | while read -r call; do
    printf '%s:' "$call"
    case " $base " in *" $call "*) printf ' [base]' ;; esac
    for name in python-run python-venv-run node-run pip-install npm-install; do
        grep -qx "$call" "$out/$name.calls" && printf ' %s' "$name"
    done
    echo
done
rm -rf "$out"
