"""Odd input to the admin page and the package routes: always a 4xx, never a 500, nothing logged as an error; and
signing out ends the session on the server side (a copy of the cookie is worth nothing afterwards).

The page's cookie, CSRF token, build ids and forms go through a table of hostile values (the red team's cases among
them: a made-up cookie whose signature is not ASCII, on the page and on a build's .json, a build id of 5,000 digits,
a CSRF token that is not ASCII); the JSON routes through schemathesis, with the data its schema allows and with
data it does not.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from urllib.parse import urlencode

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode, checks
from service import Service

from handler.openapi import openapi_document

ADMIN_KEY = "admin-" + os.urandom(8).hex()
LONG = "9" * 5000  # int() refuses strings of more than 4,300 digits
FUTURE = str(int(time.time()) + 3600)


@pytest.fixture(scope="module")
def svc():
    root = tempfile.mkdtemp(prefix="sandlot-admin-input-", dir="/var/tmp")
    os.chmod(root, 0o755)
    requirements = os.path.join(root, "requirements.txt")
    with open(requirements, "w") as f:
        f.write("six\n")
    os.chmod(requirements, 0o644)
    service = Service(
        SANDLOT_PYTHON_REQUIREMENTS=requirements,
        SANDLOT_DATA_DIR=os.path.join(root, "data"),
        SANDLOT_ADMIN_KEY=ADMIN_KEY,
        MAX_WORKERS="2",
    ).start()
    yield service
    service.stop()
    shutil.rmtree(root, ignore_errors=True)


def errors_logged(svc: Service, since: int) -> list[str]:
    """Lines of the service's log, from offset since, that report an internal error."""
    lines = svc.output()[since:].splitlines()
    return [line for line in lines if '"level":"ERROR"' in line.replace(" ", "") or "Traceback" in line]


def sign_in(svc: Service) -> tuple[httpx.Client, str, str]:
    """A client with a session cookie, the cookie, and the page's CSRF token."""
    client = httpx.Client(base_url=svc.url, timeout=60)
    assert client.post("/admin/login", data={"key": ADMIN_KEY}).status_code == 303
    page = client.get("/admin")
    assert page.status_code == 200
    token = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text).group(1)
    return client, client.cookies["sandlot_admin"], token


def raw_cookie(value: str) -> dict:
    """A Cookie header as the bytes a browser or a script may send (UTF-8, not only ASCII)."""
    return {"Cookie": b"sandlot_admin=" + value.encode()}


# ---- signing out --------------------------------------------------------------------------------------------------


def test_a_session_ends_on_the_server_when_signing_out(svc):
    client, cookie, token = sign_in(svc)
    kept = httpx.Client(base_url=svc.url, timeout=60, cookies={"sandlot_admin": cookie})  # a copy of the cookie
    assert kept.get("/admin").status_code == 200
    other, other_cookie, _ = sign_in(svc)  # another session, which signing out of the first leaves alone
    out = client.post("/admin/logout", data={"csrf": token})
    assert out.status_code == 303
    assert kept.get("/admin").status_code == 401
    assert kept.get("/admin/builds/1.json").status_code == 401
    assert kept.post("/admin/packages", data={"csrf": token, "language": "python3", "spec": "x"}).status_code == 303
    assert other.get("/admin").status_code == 200
    for c in (client, kept, other):
        c.close()


# ---- the page: a table of hostile input -----------------------------------------------------------------------------

NOT_ASCII = "é" * 64
# (method, path, cookie: None for none, "session" for a valid one, else the raw value; form or None; statuses)
PAGE_CASES = [
    ("GET", "/admin", f"x.{FUTURE}.{NOT_ASCII}", None, {401}),
    ("GET", "/admin/builds/1.json", f"x.{FUTURE}.{NOT_ASCII}", None, {401}),
    ("GET", "/admin/builds/1", f"x.{FUTURE}.{NOT_ASCII}", None, {303}),
    ("GET", "/admin", f"x.{LONG}.{'0' * 64}", None, {401}),
    ("GET", "/admin", "x.\u00b2\u00b3.sig", None, {401}),  # superscript digits: isdigit() says yes, int() no
    ("GET", "/admin", "x.\u0663\u0663.sig", None, {401}),  # Arabic-Indic digits
    ("GET", "/admin", "....", None, {401}),
    ("GET", "/admin", "\x7f\x01;=,", None, {400, 401}),  # control characters: the HTTP server refuses
    ("GET", "/admin/builds/" + LONG, "session", None, {404}),
    ("GET", "/admin/builds/" + LONG + ".json", "session", None, {404}),
    ("GET", "/admin/builds/" + LONG, None, None, {303}),
    ("GET", "/admin/builds/" + LONG + ".json", None, None, {401}),
    ("GET", "/admin/builds/\u00b2", "session", None, {404}),
    ("GET", "/admin/builds/\u00b2.json", "session", None, {404}),
    ("GET", "/admin/builds/-1.json", "session", None, {404}),
    ("GET", "/admin/builds/1e9.json", "session", None, {404}),
    ("GET", "/admin/builds/%00.json", "session", None, {404}),
    ("GET", "/admin/builds/1.json?offset=" + LONG, "session", None, {200, 404}),
    ("GET", "/admin/builds/1.json?offset=\u00b2", "session", None, {200, 404}),
    ("GET", "/admin?notice=" + "\u202e" * 1000, "session", None, {200}),
    ("GET", "/admin/static/..%2fadmin.py", None, None, {404}),
    ("POST", "/admin/packages", "session", {"csrf": NOT_ASCII, "language": "python3", "spec": "six"}, {403}),
    ("POST", "/admin/logout", "session", {"csrf": NOT_ASCII}, {403}),
    ("POST", "/admin/try", "session", {"csrf": "\udcff"}, {403}),
    ("POST", "/admin/login", None, {"key": NOT_ASCII}, {401}),
    ("POST", "/admin/login", None, {"key": "\x00" * 100}, {401}),
    ("POST", "/admin/login", None, b"key=%ff%fe", {400, 401}),
    ("POST", "/admin/login", None, b"\xff\xfe\xfd", {400}),
    ("POST", "/admin/login", None, b"&".join(b"k%d=1" % i for i in range(50)), {400}),
    ("POST", "/admin/packages", "session", {"language": "python3", "spec": "six", "csrf": LONG}, {403}),
    ("POST", "/admin/packages", "session", "csrf", {"language": "cobol", "spec": "six"}, {400}),
    ("POST", "/admin/packages", "session", "csrf", {"language": "python3", "spec": NOT_ASCII * 100}, {400}),
    ("POST", "/admin/packages", "session", "csrf", {"language": "python3", "spec": "a" * 200_000}, {400}),
    ("POST", "/admin/packages", "session", "csrf", {"language": "python3", "spec": "../../etc/passwd"}, {400}),
    ("POST", "/admin/packages", "session", "csrf", {"language": "python3", "spec": "x @ file:///etc"}, {400}),
    ("POST", "/admin/packages/remove", "session", "csrf", {"language": "nodejs", "name": NOT_ASCII}, {400, 404}),
    ("POST", "/admin/packages/remove", "session", "csrf", {"language": "python3", "name": ""}, {400}),
    ("POST", "/admin/try", "session", "csrf", {"language": "cobol", "code": "x"}, {200}),
    ("POST", "/admin/try", "session", "csrf", {"language": "python3", "code": "\udcff\x00"}, {200}),
]


@pytest.mark.parametrize("case", PAGE_CASES, ids=[f"{i}-{c[0]} {c[1][:40]}" for i, c in enumerate(PAGE_CASES)])
def test_the_page_answers_odd_input_with_a_4xx(svc, case):
    if len(case) == 6:  # a form that gets the session's own CSRF token added
        method, path, cookie, _, form, statuses = case
        with_token = True
    else:
        method, path, cookie, form, statuses = case
        with_token = False
    since = len(svc.output())
    headers = {}
    if cookie == "session":
        _, value, token = sign_in(svc)
        headers.update(raw_cookie(value))
        if with_token:
            form = {**form, "csrf": token}
    elif cookie is not None:
        headers.update(raw_cookie(cookie))
    with httpx.Client(base_url=svc.url, timeout=60) as client:
        if method == "GET":
            response = client.get(path, headers=headers)
        else:
            body = urlencode(form, errors="surrogatepass").encode() if isinstance(form, dict) else form
            headers["Content-Type"] = "application/x-www-form-urlencoded"
            response = client.post(path, content=body, headers=headers)
    assert response.status_code in statuses, (response.status_code, response.text[:300])
    assert response.status_code < 500
    assert errors_logged(svc, since) == []


# ---- the JSON routes: schemathesis, with valid data and with invalid data -------------------------------------------

# The package routes only; adding packages is left out of the valid data (each call would run pip: tests/test_packages
# covers it), but not out of the invalid data, which must be refused before any build is queued.
JSON_ROUTES = schemathesis.openapi.from_dict(openapi_document()).include(path_regex="^/v1/sandlot/")


def builds(svc: Service) -> int:
    return len(httpx.get(svc.url + "/v1/sandlot/builds", headers={"X-Api-Key": ADMIN_KEY}).json()["data"]["builds"])


def _call(case, svc: Service, since: int):
    headers = {"X-Api-Key": ADMIN_KEY}
    response = case.call(base_url=svc.url, headers=headers, timeout=60)
    assert response.status_code < 500, (case.method, case.path, case.body, response.text[:300])
    case.validate_response(response, checks=[checks.not_a_server_error], headers=headers)
    assert errors_logged(svc, since) == []
    return response


@JSON_ROUTES.exclude(method="POST").parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True, database=None)
def test_the_package_routes_never_answer_500(case, svc):
    _call(case, svc, len(svc.output()))


NEGATIVE = schemathesis.openapi.from_dict(openapi_document()).include(path_regex="^/v1/sandlot/")
NEGATIVE.config.generation.update(modes=[GenerationMode.NEGATIVE])


@NEGATIVE.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True, database=None)
def test_the_package_routes_refuse_what_their_description_does_not_allow(case, svc):
    before = builds(svc)
    response = _call(case, svc, len(svc.output()))
    if case.method == "POST" and response.status_code >= 400:
        assert builds(svc) == before  # refused before any build was queued


def test_huge_and_foreign_numbers_on_the_json_routes(svc):
    since = len(svc.output())
    headers = {"X-Api-Key": ADMIN_KEY}
    with httpx.Client(base_url=svc.url, timeout=60, headers=headers) as client:
        for path in (
            f"/v1/sandlot/builds/{LONG}",
            "/v1/sandlot/builds/\u00b2",
            "/v1/sandlot/builds/\u0663",
            "/v1/sandlot/builds/1_0",
            f"/v1/sandlot/builds/1?offset={LONG}",
            f"/v1/sandlot/builds/1?tail={'9' * 4000}",
            f"/v1/sandlot/builds/latest?tail={LONG}",
            "/v1/sandlot/builds/latest?tail=-5",
        ):
            response = client.get(path)
            assert response.status_code in (400, 404), (path[:60], response.status_code, response.text[:200])
        odd_key = client.get("/v1/sandlot/builds", headers={"X-Api-Key": NOT_ASCII.encode()})
        assert odd_key.status_code == 401
    assert errors_logged(svc, since) == []
