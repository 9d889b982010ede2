"""Packages added and removed through the API and the CLI: the next run sees them, no restart; bad specs, failed
builds, queued changes, the admin key, a restart in the middle.

One service for the module (layer builds are slow): its base files are tiny (`six`; a package.json without
dependencies) and added packages come from the index (small pure-Python packages, and is-number from npm).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import httpx
import pytest
from service import API_KEY, Service

from layers import specs
from layers.requested import RequestedPackages

ADMIN_KEY = "admin-" + os.urandom(8).hex()
MISSING = "sandlot-no-such-package-" + os.urandom(3).hex()  # not on the index: its build fails


class Served:
    """The module's service, restartable on the same data dir."""

    def __init__(self):
        self.root = tempfile.mkdtemp(prefix="sandlot-packages-", dir="/var/tmp")  # layers may not live under /tmp
        os.chmod(self.root, 0o755)
        base = os.path.join(self.root, "base")
        os.mkdir(base, 0o755)
        self.requirements = os.path.join(base, "requirements.txt")
        with open(self.requirements, "w") as f:
            f.write("six\n")
        self.package = os.path.join(base, "package.json")
        with open(self.package, "w") as f:
            f.write('{"name": "layer", "version": "1.0.0", "private": true}\n')
        for path in (self.requirements, self.package):
            os.chmod(path, 0o644)
        self.env = {
            "SANDLOT_PYTHON_REQUIREMENTS": self.requirements,
            "SANDLOT_NODEJS_PACKAGE": self.package,
            "SANDLOT_DATA_DIR": os.path.join(self.root, "data"),
            "SANDLOT_ADMIN_KEY": ADMIN_KEY,
            "MAX_WORKERS": "2",
        }
        self.svc = Service(**self.env).start()

    def restart(self) -> None:
        self.svc.stop()
        self.svc = Service(**self.env).start()

    def close(self) -> None:
        self.svc.stop()
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="module")
def served():
    served = Served()
    yield served
    served.close()


@pytest.fixture
def svc(served) -> Service:
    return served.svc


def admin(svc: Service) -> httpx.Client:
    return httpx.Client(base_url=svc.url, headers={"X-Api-Key": ADMIN_KEY}, timeout=60)


def add(svc: Service, *specs: str, language: str = "python3") -> httpx.Response:
    with admin(svc) as client:
        return client.post("/v1/sandlot/packages", json={"language": language, "specs": list(specs)})


def remove(svc: Service, *names: str, language: str = "python3") -> httpx.Response:
    with admin(svc) as client:
        return client.delete("/v1/sandlot/packages", params=[("language", language), *(("name", n) for n in names)])


def wait_build(svc: Service, build_id: int, timeout: float = 300) -> dict:
    deadline = time.monotonic() + timeout
    with admin(svc) as client:
        while time.monotonic() < deadline:
            build = client.get(f"/v1/sandlot/builds/{build_id}", params={"tail": 1000}).json()["data"]
            if build["state"] in ("succeeded", "failed"):
                return build
            time.sleep(0.2)
    raise AssertionError(f"build {build_id} did not end in {timeout}s:\n{svc.output()[-3000:]}")


def listing(svc: Service, language: str = "python3") -> dict:
    with admin(svc) as client:
        return {
            row["name"].lower(): row
            for row in client.get("/v1/sandlot/packages", params={"language": language}).json()["data"]["packages"]
        }


def run(svc: Service, code: str, language: str = "python3") -> dict:
    return svc.run(code, language=language)["data"]


def cli(svc: Service, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": svc.source, "SANDLOT_URL": svc.url, "SANDLOT_ADMIN_KEY": ADMIN_KEY}
    env.pop("API_KEY", None)
    return subprocess.run(
        [sys.executable, "-m", "handler.cli", "packages", *args], env=env, capture_output=True, text=True, timeout=600
    )


# ---- the admin key, and specs that are refused (no build) ------------------------------------------------------------


def test_the_package_routes_take_the_admin_key_and_not_the_api_key(svc):
    for headers in ({}, {"X-Api-Key": API_KEY}, {"X-Api-Key": ADMIN_KEY + "x"}, {"Authorization": f"Bearer {API_KEY}"}):
        for method, path in (
            ("GET", "/v1/sandlot/packages"),
            ("POST", "/v1/sandlot/packages"),
            ("GET", "/v1/sandlot/builds"),
        ):
            response = httpx.request(method, svc.url + path, headers=headers, json={"spec": "six"})
            assert response.status_code == 401, (headers, path)
    assert (
        httpx.get(svc.url + "/v1/sandlot/packages", headers={"Authorization": f"Bearer {ADMIN_KEY}"}).status_code == 200
    )
    # dify-sandbox's own routes keep theirs: the API key
    with svc.client() as client:
        assert client.get("/v1/sandbox/dependencies").json()["data"]["dependencies"][0]["name"] == "six"
    assert httpx.get(svc.url + "/v1/sandbox/dependencies", headers={"X-Api-Key": ADMIN_KEY}).status_code == 401


def test_without_an_admin_key_the_routes_take_the_api_key_and_the_page_is_off(service):
    with service.client() as client:
        listed = client.get("/v1/sandlot/packages", params={"language": "python3"}).json()
        assert listed["code"] == 0 and listed["data"]["editable"] is True
        assert client.get("/admin").status_code == 404
        assert "SANDLOT_ADMIN_KEY" in client.get("/admin").text


@pytest.mark.parametrize(
    "language, spec, complaint",
    [
        ("python3", "git+https://github.com/benjaminp/six.git", "not a valid requirement"),
        ("python3", "six @ https://example.com/six-1.16.0-py2.py3-none-any.whl", "URLs, paths and VCS links"),
        ("python3", "--index-url https://example.com/simple", "pip options"),
        ("python3", "-e ./local", "pip options"),
        ("python3", "./local/package", "not a valid requirement"),
        ("python3", "six\n--extra-index-url https://example.com/", "one line"),
        ("python3", "six; python_version < '3'", "markers"),
        ("python3", "six===", "not a valid requirement"),
        ("python3", "", "empty"),
        ("nodejs", "git+https://github.com/jonschlinkert/is-number.git", "URLs, paths, git and file specs"),
        ("nodejs", "is-number@git+https://github.com/jonschlinkert/is-number.git", "not a semver range"),
        ("nodejs", "is-number@file:../x", "not a semver range"),
        ("nodejs", "is-number@latest", "not a semver range"),
        ("nodejs", "is-number@npm:other@1", "not a semver range"),
        ("nodejs", "file:../x", "URLs, paths, git and file specs"),
        ("nodejs", "jonschlinkert/is-number", "not an npm package name"),
        ("nodejs", "Is-Number", "lowercase"),
        ("nodejs", "_private", "cannot start with"),
        ("nodejs", "is-number@", "nothing after"),
    ],
)
def test_specs_with_urls_paths_or_options_are_refused(svc, language, spec, complaint):
    response = add(svc, spec, language=language)
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["code"] == -400 and body["data"] is None
    assert complaint in body["message"]


@pytest.mark.parametrize(
    "language, spec, name, build",
    [
        ("python3", "six", "six", "six"),
        ("python3", "Six==1.16.0", "six", "Six==1.16.0"),
        ("python3", "requests[socks] >=2.31, <3", "requests", "requests[socks]<3,>=2.31"),
        ("python3", "zope.interface~=6.0", "zope-interface", "zope.interface~=6.0"),
        ("nodejs", "is-number", "is-number", "*"),
        ("nodejs", "is-number@^7.0.0", "is-number", "^7.0.0"),
        ("nodejs", "@types/node@>=20 <21", "@types/node", ">=20 <21"),
        ("nodejs", "lodash@4.17.x || ^5", "lodash", "4.17.x || ^5"),
    ],
)
def test_a_name_with_a_version_constraint_is_accepted(language, spec, name, build):
    parsed = specs.parse(language, spec)
    assert (parsed.name, parsed.build) == (name, build)


def test_any_spec_passes_only_where_the_setting_allows_it():
    for language, spec in (("python3", "--extra-index-url https://example.com/simple"), ("nodejs", "x@github:a/b")):
        with pytest.raises(specs.SpecError):
            specs.parse(language, spec)
        assert specs.parse(language, spec, allow_any=True).spec == spec
    with pytest.raises(specs.SpecError):  # still one line, even then
        specs.parse("python3", "six\n--index-url https://example.com/", allow_any=True)


def test_instances_sharing_a_data_dir_keep_each_others_changes(tmp_path):
    first, second = (RequestedPackages("python3", tmp_path / "python3.json") for _ in range(2))
    first.queue([{"id": "a", "op": "add", "name": "six", "spec": specs.parse("python3", "six").to_dict()}])
    second.queue([{"id": "b", "op": "add", "name": "idna", "spec": specs.parse("python3", "idna").to_dict()}])
    first.commit([{"id": "a", "op": "add", "name": "six", "spec": specs.parse("python3", "six").to_dict()}])
    kept = RequestedPackages("python3", tmp_path / "python3.json")
    assert list(kept.installed) == ["six"] and [c["id"] for c in kept.pending] == ["b"]


def test_malformed_requests_are_refused_with_what_is_wrong(svc):
    with admin(svc) as client:
        cases = [
            (client.post("/v1/sandlot/packages", content=b"{"), "malformed JSON"),
            (client.post("/v1/sandlot/packages", json={"language": "ruby", "spec": "rails"}), "unsupported language"),
            (client.post("/v1/sandlot/packages", json={"spec": "six", "specs": ["six"]}), "give `spec`"),
            (client.post("/v1/sandlot/packages", json={"specs": "six"}), "non-empty list"),
            (client.post("/v1/sandlot/packages", json={"specs": ["six", "Six"]}), "named twice"),
            (client.post("/v1/sandlot/packages", json={"spec": "six", "index": "x"}), "unknown field"),
            (client.delete("/v1/sandlot/packages", params={"language": "python3"}), "`name`"),
            (client.get("/v1/sandlot/builds/latest", params={"language": "cobol"}), "unsupported language"),
            (client.post("/v1/sandlot/packages", json={"specs": ["six"] * 30000}), "too large"),
            (client.post("/v1/sandlot/packages", json={"specs": ["six"] * 51}), "at most 50"),
        ]
        for response, complaint in cases:
            assert response.status_code == 400 and response.json()["code"] == -400, response.text
            assert complaint in response.json()["message"]
        assert client.get("/v1/sandlot/builds/999999").json() == {
            "code": -404,
            "message": "no build 999999",
            "data": None,
        }
        unknown = client.delete("/v1/sandlot/packages", params={"language": "python3", "name": "pyjokes"})
        assert unknown.status_code == 404 and "not a requested python3 package" in unknown.json()["message"]
        base = client.delete("/v1/sandlot/packages", params={"language": "python3", "name": "six"})
        assert base.status_code == 409 and "comes from the base file" in base.json()["message"]
        assert client.get("/v1/sandlot/builds").json()["data"]["builds"] == []  # nothing was queued


# ---- Python through the API ------------------------------------------------------------------------------------------


def test_an_added_package_is_imported_by_the_next_run_and_a_removed_one_is_gone(svc):
    layer = svc.detail()["runtimes"]["python3"]["layer"]
    assert "No module named 'pyjokes'" in run(svc, "import pyjokes")["error"]
    response = add(svc, "pyjokes")
    assert response.status_code == 200
    queued = response.json()["data"]
    assert queued["changes"][0]["op"] == "add" and queued["changes"][0]["name"] == "pyjokes"
    build = wait_build(svc, queued["build"]["id"])
    assert build["state"] == "succeeded", build
    assert any("Successfully installed" in line for line in build["log"]["lines"])  # pip's own output
    assert run(svc, "import pyjokes\nprint(pyjokes.get_joke()[:0] + 'joke ok')")["stdout"] == "joke ok\n"
    assert svc.detail()["runtimes"]["python3"]["layer"] == build["layer"] != layer
    rows = listing(svc)
    assert rows["pyjokes"]["requested"] == "pyjokes" and rows["pyjokes"]["version"] and not rows["pyjokes"]["base"]
    assert rows["six"]["base"] and rows["six"]["requested"] is None and rows["six"]["kind"] == "base"

    build = wait_build(svc, remove(svc, "PyJokes").json()["data"]["build"]["id"])  # pip's names: any case
    assert build["state"] == "succeeded", build
    assert "No module named 'pyjokes'" in run(svc, "import pyjokes")["error"]
    assert "pyjokes" not in listing(svc)
    assert run(svc, "import six\nprint(six.__name__)")["stdout"] == "six\n"  # the base stays


def test_every_run_that_starts_after_the_switch_imports_the_package(svc):
    """Children prepared ahead of demand from the old zygote must not serve a run after the switch: runs back to
    back keep the pool preparing children while the build ends."""
    seen: list[tuple[float, int]] = []
    stop = threading.Event()

    def keep_running():
        while not stop.is_set():
            started = time.time()
            seen.append((started, run(svc, "import wcwidth")["exit_code"]))

    runners = [threading.Thread(target=keep_running) for _ in range(2)]
    for runner in runners:
        runner.start()
    try:
        build = wait_build(svc, add(svc, "wcwidth").json()["data"]["build"]["id"])
        time.sleep(2)
    finally:
        stop.set()
        for runner in runners:
            runner.join()
    assert build["state"] == "succeeded"
    after = [code for started, code in seen if started > build["finished_at"]]
    assert after and all(code == 0 for code in after), after


def test_two_adds_at_once_both_land(svc):
    answers = {}
    threads = [
        threading.Thread(target=lambda spec=spec: answers.setdefault(spec, add(svc, spec).json()))
        for spec in ("tabulate", "termcolor")
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ids = {answer["data"]["build"]["id"] for answer in answers.values()}
    for build_id in sorted(ids):
        assert wait_build(svc, build_id)["state"] == "succeeded"
    data = run(svc, "import tabulate, termcolor\nprint(tabulate.tabulate([[1]]).split(), termcolor.__name__)")
    assert data["stdout"] == "['-', '1', '-'] termcolor\n", data
    rows = listing(svc)
    assert rows["tabulate"]["requested"] == "tabulate" and rows["termcolor"]["requested"] == "termcolor"


def test_a_failing_build_leaves_the_old_layer_serving_and_says_why(svc):
    layer = svc.detail()["runtimes"]["python3"]["layer"]
    build = wait_build(svc, add(svc, f"{MISSING}==1.0").json()["data"]["build"]["id"])
    assert build["state"] == "failed"
    assert "pip failed" in build["error"] and MISSING in build["error"]
    assert [change["name"] for change in build["dropped"]] == [MISSING]
    assert svc.detail()["runtimes"]["python3"]["layer"] == layer
    assert run(svc, "import tabulate, termcolor\nprint('old layer')")["stdout"] == "old layer\n"
    assert MISSING not in listing(svc)
    with admin(svc) as client:
        latest = client.get("/v1/sandlot/builds/latest", params={"language": "python3"}).json()["data"]
    assert latest["id"] == build["id"] and latest["error"] == build["error"]
    assert any("No matching distribution" in line for line in latest["log"]["lines"])
    shown = cli(svc, "build-log")
    assert shown.returncode == 1
    assert "No matching distribution" in shown.stdout and MISSING in shown.stderr and "failed" in shown.stdout


def test_a_bad_spec_among_good_ones_does_not_take_them_down(svc):
    shown = cli(svc, "add", "iso8601", MISSING)  # one build for both: it fails, then each is retried alone
    assert shown.returncode == 1, shown.stdout + shown.stderr  # not all of ours landed
    assert "each change is retried alone" in shown.stdout and "succeeded" in shown.stdout
    assert f"No matching distribution found for {MISSING}" in shown.stdout + shown.stderr
    with admin(svc) as client:
        history = client.get("/v1/sandlot/builds", params={"language": "python3"}).json()["data"]["builds"]
    first = next(b for b in history if len(b["changes"]) == 2 and b["changes"][0]["name"] == "iso8601")
    assert first["state"] == "failed" and len(first["retried_in"]) == 2
    retries = [wait_build(svc, build_id) for build_id in first["retried_in"]]
    outcome = {retry["changes"][0]["name"]: retry["state"] for retry in retries}
    assert outcome == {"iso8601": "succeeded", MISSING: "failed"}
    assert run(svc, "import iso8601\nprint(iso8601.parse_date('2024-01-02').year)")["stdout"] == "2024\n"


def test_the_update_route_rebuilds_with_the_added_packages_and_shows_its_build(svc):
    with svc.client() as client:  # dify-sandbox's route, the API key
        assert client.post("/v1/sandbox/dependencies/update", json={"language": "python3"}, timeout=300).json() == {
            "code": 0,
            "message": "success",
            "data": {},
        }
    assert run(svc, "import tabulate, termcolor, iso8601\nprint('still there')")["stdout"] == "still there\n"
    with admin(svc) as client:
        latest = client.get("/v1/sandlot/builds/latest", params={"language": "python3"}).json()["data"]
    assert latest["trigger"] == "update" and latest["state"] == "succeeded"
    assert any("Successfully installed" in line for line in latest["log"]["lines"])


# ---- the CLI ---------------------------------------------------------------------------------------------------------


def test_the_cli_adds_lists_and_removes_showing_the_build(svc):
    added = cli(svc, "add", "idna")
    assert added.returncode == 0, added.stderr
    assert "Successfully installed" in added.stdout and "succeeded" in added.stdout  # pip's log, as it came
    assert run(svc, "import idna\nprint(idna.encode('bücher.example').decode())")["stdout"] == "xn--bcher-kva.example\n"
    shown = cli(svc, "list")
    assert shown.returncode == 0
    line = next(line for line in shown.stdout.splitlines() if line.startswith("idna "))
    assert "requested" in line and line.split()[-1] == "idna"
    assert any(line.split()[:1] == ["six"] and "base" in line for line in shown.stdout.splitlines())
    removed = cli(svc, "remove", "idna")
    assert removed.returncode == 0, removed.stderr
    assert "No module named 'idna'" in run(svc, "import idna")["error"]
    refused = cli(svc, "add", "https://example.com/x.whl")
    assert refused.returncode == 125 and "not a valid requirement" in refused.stderr
    env = {**os.environ, "PYTHONPATH": svc.source, "SANDLOT_URL": svc.url, "API_KEY": API_KEY}
    env.pop("SANDLOT_ADMIN_KEY", None)
    wrong = subprocess.run(
        [sys.executable, "-m", "handler.cli", "packages", "list"], env=env, capture_output=True, text=True
    )
    assert wrong.returncode == 125 and "refused the key" in wrong.stderr


# ---- Node.js ---------------------------------------------------------------------------------------------------------


def test_node_packages_the_same_way(svc):
    assert "Cannot find module 'is-number'" in run(svc, "require('is-number')", "nodejs")["error"]
    build = wait_build(svc, add(svc, "is-number@^7.0.0", language="nodejs").json()["data"]["build"]["id"])
    assert build["state"] == "succeeded", build
    data = run(svc, "const isNumber = require('is-number'); console.log(isNumber(5), isNumber('x'))", "nodejs")
    assert data["stdout"] == "true false\n", data
    assert not os.path.exists(os.path.join(build["layer"], ".npm"))  # npm's cache and logs stay out of the layer
    row = listing(svc, "nodejs")["is-number"]
    assert row["requested"] == "is-number@^7.0.0" and row["version"].startswith("7.")
    build = wait_build(svc, remove(svc, "is-number", language="nodejs").json()["data"]["build"]["id"])
    assert build["state"] == "succeeded"
    assert "Cannot find module 'is-number'" in run(svc, "require('is-number')", "nodejs")["error"]
    layer = svc.detail()["runtimes"]["nodejs"]["layer"]
    failed = wait_build(svc, add(svc, f"{MISSING}@^1.0.0", language="nodejs").json()["data"]["build"]["id"])
    assert failed["state"] == "failed" and "npm failed" in failed["error"] and "404" in failed["error"]
    assert svc.detail()["runtimes"]["nodejs"]["layer"] == layer
    assert run(svc, "console.log('old layer')", "nodejs")["stdout"] == "old layer\n"


# ---- restarts --------------------------------------------------------------------------------------------------------


def test_the_list_and_pending_changes_survive_a_restart(served):
    svc = served.svc
    layer = svc.detail()["runtimes"]["python3"]["layer"]
    served.restart()  # nothing pending: the same layer serves again, no build
    svc = served.svc
    assert svc.detail()["runtimes"]["python3"]["layer"] == layer
    assert run(svc, "import tabulate, termcolor, iso8601\nprint('kept')")["stdout"] == "kept\n"
    assert listing(svc)["tabulate"]["requested"] == "tabulate"
    with admin(svc) as client:  # and the last builds are still there to read
        assert client.get("/v1/sandlot/builds").json()["data"]["builds"]

    # a change left pending by a service that stopped before building it (as the list file keeps it) is built
    # once the service is back
    served.svc.stop()
    state = os.path.join(served.env["SANDLOT_DATA_DIR"], "packages", "python3.json")
    with open(state) as f:
        kept = json.load(f)
    spec = {"name": "pyjokes", "spec": "pyjokes", "build": "pyjokes"}
    kept["pending"].append({"id": "left-pending", "op": "add", "name": "pyjokes", "spec": spec, "build": 0})
    with open(state, "w") as f:
        json.dump(kept, f)
    served.svc = Service(**served.env).start()
    svc = served.svc
    with admin(svc) as client:
        resumed = client.get("/v1/sandlot/builds/latest", params={"language": "python3"}).json()["data"]
    assert resumed["trigger"] == "resume" and [c["name"] for c in resumed["changes"]] == ["pyjokes"]
    assert wait_build(svc, resumed["id"])["state"] == "succeeded"
    assert run(svc, "import pyjokes, tabulate\nprint('resumed')")["stdout"] == "resumed\n"
    assert listing(svc)["pyjokes"]["requested"] == "pyjokes"
