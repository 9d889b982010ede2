"""The host's checks of infra/arm64/lambda_invoke.sh (plain python3): SAM-style invokes of the arm64 runtime
images in the emulated machine, each through its RIE's Invoke API (`POST /2015-03-31/functions/function/invocations`,
the tenant id as `X-Amz-Tenant-Id`, as `sam local invoke --tenant-id` sends it), forwarded to this host's loopback.

    lambda_checks.py [--machine aarch64] --function LANGUAGE=URL:UID:PLATFORM ...

PLATFORM is where infra/arm64/lambda_platform.py started the function: `lambda` (Lambda's restrictions) or `sam`
(SAM local's container: root, Docker's defaults). Per function on `lambda`, in this order (an environment pins the
first tenant id it runs code for):
  1. the probe (the first invoke: the RIE starts the image's ENTRYPOINT, its init): the platform is what
     lambda_platform.py made it, seen from inside: its uid, seccomp refused (EPERM), Landlock there and in force in
     the jail, the root not writable;
  2. a run without a tenant id: refused (TenantRefused): the filter cannot be installed there, and RequireSeccomp
     is template.yaml's default;
  3. a run with tenant t1: its output, from an aarch64 kernel;
  4. a hostile run of t1: the jail is on (Landlock: no write to /tmp beside its own directory, no reach into the
     runtime client, awslambdaric, of the same uid and left dumpable: prctl is refused) and the platform's refusal
     holds (prctl: EPERM); no credential reaches the run;
  5. a run of tenant t2 on the environment t1's ran in: refused (TenantRefused).
On `sam`: the probe (root; the jail is `chroot` with the seccomp filter in force), a run without a tenant id
(served: the filter is the boundary), one of t1, the hostile run cases of tests/cases/run_cases.json that the
filter refuses (process creation, exec, a socket without network: EPERM), checked as tests/test_cases.py checks
them, and t2 refused.
One line per check, `PASS name: detail` or `FAIL name: detail`; last `lambda arm64: N passed, N failed`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request

INVOKE = "/2015-03-31/functions/function/invocations"
FIRST_TIMEOUT = 1800  # the first invoke carries the init: minutes under emulation
RUNS = {
    "python3": {
        "run": ("import os\nprint(6 * 7, os.uname().machine)\n", "42 {machine}\n"),
        "hostile": (
            "import ctypes, os\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "print('prctl', os.strerror(ctypes.get_errno()) if libc.prctl(4, 0, 0, 0, 0) else 'allowed')\n"
            "for place in ('/tmp', os.environ['TMPDIR']):\n"
            "    try:\n"
            "        open(os.path.join(place, 'planted'), 'w').write('x')\n"
            "        print('write', place == '/tmp' and '/tmp' or 'own', 'done')\n"
            "    except OSError as e:\n"
            "        print('write', place == '/tmp' and '/tmp' or 'own', e.strerror)\n"
            "client = None\n"
            "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
            "    try:\n"
            "        client = pid if b'awslambdaric' in open(f'/proc/{pid}/cmdline', 'rb').read() else client\n"
            "    except OSError:\n"
            "        pass\n"
            "try:\n"
            "    open(f'/proc/{client}/environ', 'rb').read(1)\n"
            "    print('client environ opened')\n"
            "except OSError as e:\n"
            "    print('client environ', e.strerror)\n"
            "print('credentials', sorted(k for k in os.environ if k.startswith('AWS_')))\n",
            "prctl Operation not permitted\nwrite /tmp Permission denied\nwrite own done\n"
            "client environ Permission denied\ncredentials []\n",
        ),
    },
    "nodejs": {
        "run": ("const os = require('os')\nconsole.log(6 * 7, os.machine(), process.arch)\n", "42 {machine} {arch}\n"),
        "hostile": (
            "const fs = require('fs'), path = require('path'), os = require('os')\n"
            "for (const place of ['/tmp', process.env.TMPDIR || os.tmpdir()]) {\n"
            "  const name = place === '/tmp' ? '/tmp' : 'own'\n"
            "  try { fs.writeFileSync(path.join(place, 'planted'), 'x'); console.log('write', name, 'done') }\n"
            "  catch (e) { console.log('write', name, e.code) }\n"
            "}\n"
            "let client = null\n"
            "for (const pid of fs.readdirSync('/proc').filter(p => /^[0-9]+$/.test(p))) {\n"
            "  try { if (fs.readFileSync(`/proc/${pid}/cmdline`).includes('awslambdaric')) client = pid }\n"
            "  catch (e) {}\n"
            "}\n"
            "try { fs.readFileSync(`/proc/${client}/environ`); console.log('client environ opened') }\n"
            "catch (e) { console.log('client environ', e.code) }\n"
            "console.log('credentials', JSON.stringify(Object.keys(process.env).filter(k => k.startsWith('AWS_'))))\n",
            "write /tmp EACCES\nwrite own done\nclient environ EACCES\ncredentials []\n",
        ),
    },
}
# the run cases the seccomp filter refuses (`sam`), tests/cases/run_cases.json's
REFUSED_CASES = ("py-fork", "py-exec", "py-subprocess", "py-socket-no-network", "js-child-process")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tests"))
from cases.expect import check  # noqa: E402

failures = 0
passes = 0


def report(ok: bool, name: str, detail: str) -> None:
    global failures, passes
    failures += not ok
    passes += ok
    print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)


def invoke(url: str, event: dict, tenant: str | None, timeout: float = 600) -> tuple[float, object]:
    headers = {"Content-Type": "application/json"}
    if tenant is not None:
        headers["X-Amz-Tenant-Id"] = tenant
    request = urllib.request.Request(url + INVOKE, data=json.dumps(event).encode(), headers=headers)
    began = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
    except urllib.error.HTTPError as e:
        body = e.read()
    except OSError as e:
        return time.monotonic() - began, f"no answer: {e}"
    try:
        return time.monotonic() - began, json.loads(body)
    except ValueError:
        return time.monotonic() - began, body.decode(errors="replace")


def short(value: object, limit: int = 400) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


def refused(answer: object) -> bool:
    return isinstance(answer, dict) and answer.get("errorType") == "TenantRefused"


def run_output(answer: object) -> str | None:
    return answer.get("stdout") if isinstance(answer, dict) and "outcome" in answer else None


NODE_ARCH = {"aarch64": "arm64", "x86_64": "x64"}


def check_sam(language: str, url: str, machine: str) -> None:
    name = f"{language} ({machine}, sam)"
    seconds, probe = invoke(url, {"action": "probe"}, "t1", FIRST_TIMEOUT)
    try:
        protections = probe["protections"]
        got = {key: protections[key] for key in ("mode", "seccomp", "own_uid")} | {"euid": probe["platform"]["euid"]}
        want = {"mode": "chroot", "seccomp": True, "own_uid": True, "euid": 0}
        report(got == want, f"{name}: the probe, at the first invoke (init)", f"{seconds:.0f} s; {got}")
    except (KeyError, TypeError) as e:
        report(False, f"{name}: the probe, at the first invoke (init)", f"{e!r} in {short(probe)}")
    code, expected = RUNS[language]["run"]
    expected = expected.format(machine=machine, arch=NODE_ARCH.get(machine))
    event = {"language": language, "code": code, "enable_network": True}
    for tenant, what in ((None, "without a tenant id (the filter is the boundary)"), ("t1", "of tenant t1")):
        seconds, answer = invoke(url, event, tenant)
        report(run_output(answer) == expected, f"{name}: a run {what}", f"{seconds:.1f} s; {short(answer)}")
    with open(os.path.join(REPO, "tests", "cases", "run_cases.json")) as f:
        cases = [c for c in json.load(f)["cases"] if c["id"] in REFUSED_CASES and c["language"] == language]
    for case in cases:
        body = {"language": language, "code": case["code"], "enable_network": case["enable_network"]}
        seconds, answer = invoke(url, body, "t1")
        try:
            assert isinstance(answer, dict) and "outcome" in answer, answer
            check(case["expect"], answer)
            report(True, f"{name}: hostile {case['id']} (t1)", f"{seconds:.1f} s; error {answer['error'][:160]!r}")
        except (AssertionError, KeyError) as e:
            report(False, f"{name}: hostile {case['id']} (t1)", f"{e!r}: {short(answer)}")
    seconds, answer = invoke(url, event, "t2")
    report(
        refused(answer), f"{name}: tenant t2 on t1's environment is refused", f"{seconds:.1f} s; {short(answer, 200)}"
    )


def check_function(language: str, url: str, uid: int, machine: str) -> None:
    name = f"{language} ({machine}, lambda)"
    seconds, probe = invoke(url, {"action": "probe"}, "t1", FIRST_TIMEOUT)
    try:
        platform, protections = probe["platform"], probe["protections"]
        problems = []
        if platform["euid"] != uid:
            problems.append(f"euid {platform['euid']}, not {uid}")
        if platform["seccomp"] is not False or "Operation not permitted" not in platform["errors"]["seccomp"]:
            problems.append(f"seccomp {platform['seccomp']} ({platform['errors'].get('seccomp')})")
        if not platform["landlock"] or protections["landlock"] != platform["landlock"]:
            problems.append(f"landlock {platform['landlock']}, in force {protections['landlock']}")
        if "/" in platform["writable"]:
            problems.append(f"writable {platform['writable']}")
        report(
            not problems,
            f"{name}: the probe, at the first invoke (init)",
            "; ".join(problems)
            or f"{seconds:.0f} s; uid {uid}, seccomp refused (EPERM), Landlock ABI {platform['landlock']} in force, "
            f"writable {platform['writable']}, boundary {probe.get('tenancy', {}).get('boundary')!r}",
        )
    except (KeyError, TypeError) as e:
        report(False, f"{name}: the probe, at the first invoke (init)", f"{e!r} in {short(probe)}")
    code, expected = RUNS[language]["run"]
    expected = expected.format(machine=machine, arch=NODE_ARCH.get(machine))
    event = {"language": language, "code": code, "enable_network": True}
    seconds, answer = invoke(url, event, None)
    report(refused(answer), f"{name}: a run without a tenant id is refused", f"{seconds:.1f} s; {short(answer, 240)}")
    seconds, answer = invoke(url, event, "t1")
    report(run_output(answer) == expected, f"{name}: a run of tenant t1", f"{seconds:.1f} s; {short(answer)}")
    code, expected = RUNS[language]["hostile"]
    seconds, answer = invoke(url, {"language": language, "code": code, "enable_network": True}, "t1")
    report(
        run_output(answer) == expected,
        f"{name}: a hostile run of t1 (Landlock, the platform's refusal, no credentials)",
        f"{seconds:.1f} s; {short(answer)}",
    )
    seconds, answer = invoke(url, event, "t2")
    report(
        refused(answer), f"{name}: tenant t2 on t1's environment is refused", f"{seconds:.1f} s; {short(answer, 240)}"
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--function", action="append", required=True, help="LANGUAGE=URL:UID:PLATFORM")
    parser.add_argument("--machine", default="aarch64", help="the kernel's machine the runs must report")
    args = parser.parse_args()
    for spec in args.function:
        language, rest = spec.split("=", 1)
        url, uid, platform = rest.rsplit(":", 2)
        if platform == "sam":
            check_sam(language, url, args.machine)
        else:
            check_function(language, url, int(uid), args.machine)
    print(f"lambda {NODE_ARCH.get(args.machine, args.machine)}: {passes} passed, {failures} failed", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
