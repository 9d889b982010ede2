"""The wire format Dify and other clients rely on: routes, envelope, errors, auth."""

import base64
import json
import os

import httpx
from service import API_KEY

DIFY_PYTHON_WRAPPER = """
# declare main function
def main(a: int, b: int) -> dict:
    return {"sum": a + b, "text": "héllo"}

import json
from base64 import b64decode

# decode and prepare input dict
inputs_obj = json.loads(b64decode('%s').decode('utf-8'))

# execute main function
output_obj = main(**inputs_obj)

# convert output to json and print
output_json = json.dumps(output_obj, indent=4)

result = f'''<<RESULT>>{output_json}<<RESULT>>'''
print(result)
"""

DIFY_JINJA2_CODE = """
import jinja2
template = jinja2.Template('''{{ greeting }}, {{ names | join(", ") }}!''')

import json
from base64 import b64decode

# decode and prepare input dict
inputs_obj = json.loads(b64decode('%s').decode('utf-8'))

# render template
result = template.render(**inputs_obj)

# print result
print(f'''<<RESULT>>{result}<<RESULT>>''')
"""

DIFY_JINJA2_PRELOAD = """
import jinja2
from base64 import b64decode

def _jinja2_preload_():
    # prepare jinja2 environment, load template and render before to avoid sandbox issue
    template = jinja2.Template('{{s}}')
    template.render(s='a')

if __name__ == '__main__':
    _jinja2_preload_()
"""


def b64(obj) -> str:
    return base64.b64encode(json.dumps(obj).encode()).decode()


def dify_request(client, code, preload=""):
    """Exactly what Dify's code executor sends."""
    body = {"language": "python3", "code": code, "preload": preload, "enable_network": True}
    response = client.post("/v1/sandbox/run", json=body)
    assert response.status_code == 200
    return response.json()


def test_health_is_ok_when_runs_can_be_served(service):
    response = httpx.get(service.url + "/health")
    assert response.status_code == 200
    assert response.json() == "ok"


def test_success_envelope_is_byte_exact(client):
    envelope = dify_request(client, 'print(1 + 1)\nprint("é\\t世界")')
    assert envelope["code"] == 0 and envelope["message"] == "success"
    data = envelope["data"]
    assert data["stdout"] == "2\né\t世界\n"
    assert data["error"] == "" and data["stderr"] == "" and data["exit_code"] == 0


def test_dify_python_wrapper(client):
    data = dify_request(client, DIFY_PYTHON_WRAPPER % b64({"a": 2, "b": 40}))["data"]
    assert data["stdout"] == '<<RESULT>>{\n    "sum": 42,\n    "text": "h\\u00e9llo"\n}<<RESULT>>\n'
    assert data["error"] == ""


def test_dify_jinja2_template_with_preload_field(client):
    code = DIFY_JINJA2_CODE % b64({"greeting": "Hi", "names": ["Ann", "Bo"]})
    data = dify_request(client, code, preload=DIFY_JINJA2_PRELOAD)["data"]
    assert data["stdout"] == "<<RESULT>>Hi, Ann, Bo!<<RESULT>>\n"
    assert data["error"] == ""


def test_stderr_alone_is_not_an_error(client):
    data = dify_request(client, "import sys\nprint('warn', file=sys.stderr)\nprint('ok')")["data"]
    assert data == {**data, "stdout": "ok\n", "stderr": "warn\n", "error": "", "exit_code": 0}


def test_exit_code_and_error_text(client):
    data = dify_request(client, "import sys\nprint('oops', file=sys.stderr)\nsys.exit(3)")["data"]
    assert data["exit_code"] == 3
    assert data["error"].startswith("process exited with code 3")
    assert "oops\n" in data["error"]


def test_stdin_extension(client):
    body = {"language": "python3", "code": "import sys\nprint(sys.stdin.read().upper())", "stdin": "abc"}
    assert client.post("/v1/sandbox/run", json=body).json()["data"]["stdout"] == "ABC\n"


def test_wrong_or_missing_key_is_401_with_empty_body(service):
    for headers in ({}, {"X-Api-Key": "wrong"}, {"X-Api-Key": API_KEY + "x"}):
        for method, path in (
            ("POST", "/v1/sandbox/run"),
            ("GET", "/v1/sandbox/health"),
            ("GET", "/v1/sandbox/dependencies"),
        ):
            response = httpx.request(method, service.url + path, headers=headers, json={"language": "python3"})
            assert response.status_code == 401, (headers, path)
            assert response.content == b""


def post_raw(client, content: bytes):
    return client.post("/v1/sandbox/run", content=content, headers={"Content-Type": "application/json"})


def test_bad_requests_get_the_400_envelope(client):
    bad = {
        b"{not json": "malformed",
        b"[1, 2]": "object",
        json.dumps({"language": "python3"}).encode(): "code",
        json.dumps({"language": "python3", "code": ""}).encode(): "code",
        json.dumps({"language": "python3", "code": 5}).encode(): "code",
        json.dumps({"language": "python3", "code": "1", "enable_network": "yes"}).encode(): "enable_network",
        json.dumps({"language": "python3", "code": "1", "timeout": "10"}).encode(): "timeout",
        json.dumps({"language": "python3", "code": "1", "surprise": 1}).encode(): "surprise",
        json.dumps({"code": "1"}).encode(): "language",
    }
    for body, word in bad.items():
        response = post_raw(client, body)
        assert response.status_code == 400, body
        envelope = response.json()
        assert envelope["code"] == -400 and envelope["data"] is None, body
        assert word in envelope["message"], (body, envelope["message"])


def test_unsupported_language(client):
    response = client.post("/v1/sandbox/run", json={"language": "ruby", "code": "puts 1"})
    assert response.status_code == 400
    assert response.json() == {"code": -400, "message": "unsupported language", "data": None}


def test_ten_megabyte_body_is_refused_and_service_keeps_serving(client):
    huge = json.dumps({"language": "python3", "code": "x = '" + "a" * (10 * 1024 * 1024) + "'"}).encode()
    response = post_raw(client, huge)
    assert response.status_code == 400 and response.json()["code"] == -400
    assert "too large" in response.json()["message"]
    assert dify_request(client, "print('still here')")["data"]["stdout"] == "still here\n"


def test_dependencies_field_is_accepted_and_installs_nothing(client):
    body = {
        "language": "python3",
        "code": "print(1)",
        "preload": "",
        "enable_network": True,
        "dependencies": [{"name": "left-pad", "version": "1.0"}],
    }
    envelope = client.post("/v1/sandbox/run", json=body).json()
    assert envelope["data"]["stdout"] == "1\n"
    names = [d["name"] for d in client.get("/v1/sandbox/dependencies").json()["data"]["dependencies"]]
    assert "left-pad" not in names


def test_dependencies_list_real_versions(client):
    envelope = client.get("/v1/sandbox/dependencies", params={"language": "python3"}).json()
    assert envelope["code"] == 0
    listed = {d["name"].lower(): d["version"] for d in envelope["data"]["dependencies"]}
    code = "import requests, httpx, jinja2\nprint(requests.__version__, httpx.__version__, jinja2.__version__)"
    reported = dify_request(client, code)["data"]["stdout"].split()
    assert reported == [listed["requests"], listed["httpx"], listed["jinja2"]]


def test_dependency_update_and_refresh_answer(client):
    assert client.post("/v1/sandbox/dependencies/update", json={"language": "python3"}).json() == {
        "code": 0,
        "message": "success",
        "data": {},
    }
    refreshed = client.get("/v1/sandbox/dependencies/refresh", params={"language": "python3"}).json()
    assert refreshed["code"] == 0 and refreshed["data"]["dependencies"]
    assert client.get("/v1/sandbox/dependencies", params={"language": "cobol"}).status_code == 400


def test_health_detail_names_protections_and_limits(service):
    detail = service.detail()
    python = detail["runtimes"]["python3"]
    assert python["ready"] is True
    assert python["protections"]["seccomp"] is True
    platform = python["platform"]  # the probed record, one field per mechanism
    assert platform["seccomp"] is True and platform["rlimits"] is True
    assert platform["setuid"] == platform["chroot"] == (os.geteuid() == 0)
    assert python["zygote"] == "running"
    assert {"requests", "httpx", "jinja2", "certifi", "idna"} <= set(python["preloaded"])  # the whole layer
    assert python["preload_failed"] == {}
    assert detail["limits"]["output_limit_bytes"] == 4 * 1024 * 1024
    assert python["layer"].startswith("/") and detail["runtimes"]["nodejs"]["layer"].startswith("/")
