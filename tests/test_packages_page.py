"""The /admin page: sign-in, its cookie and CSRF protection (over HTTP), then in headless Chromium what an operator
does: add a package through the form, watch the build finish, import it in the try box, remove it, and see a bad
spec's error and a failed build's error on the page.

Chromium and its driver are Debian's `chromium` and `chromium-driver` (dev.sh installs them for the tests, as root);
selenium is in the test extra. Without them the browser tests skip, saying why. Screenshots are kept as test
artefacts, under $SANDLOT_TEST_ARTIFACTS or tests/artifacts/ (not committed).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time

import httpx
import pytest
from service import API_KEY, Service

ADMIN_KEY = "admin-" + os.urandom(8).hex()
MISSING = "sandlot-no-such-package-" + os.urandom(3).hex()
ARTIFACTS = os.environ.get("SANDLOT_TEST_ARTIFACTS") or os.path.join(os.path.dirname(__file__), "artifacts")
CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,1800",
]


@pytest.fixture(scope="module")
def svc():
    root = tempfile.mkdtemp(prefix="sandlot-page-", dir="/var/tmp")
    os.chmod(root, 0o755)
    requirements = os.path.join(root, "requirements.txt")
    with open(requirements, "w") as f:
        f.write("six\n")
    package = os.path.join(root, "package.json")
    with open(package, "w") as f:
        f.write('{"name": "layer", "version": "1.0.0", "private": true}\n')
    for path in (requirements, package):
        os.chmod(path, 0o644)
    service = Service(
        SANDLOT_PYTHON_REQUIREMENTS=requirements,
        SANDLOT_NODEJS_PACKAGE=package,
        SANDLOT_DATA_DIR=os.path.join(root, "data"),
        SANDLOT_ADMIN_KEY=ADMIN_KEY,
        MAX_WORKERS="2",
    ).start()
    yield service
    service.stop()
    shutil.rmtree(root, ignore_errors=True)


def signed_in(svc: Service) -> tuple[httpx.Client, str]:
    """An HTTP client with a session cookie, and the page's CSRF token."""
    client = httpx.Client(base_url=svc.url, timeout=60)
    response = client.post("/admin/login", data={"key": ADMIN_KEY})
    assert response.status_code == 303 and response.headers["location"] == "/admin"
    page = client.get("/admin")
    assert page.status_code == 200
    token = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text).group(1)
    return client, token


def builds(svc: Service) -> list[dict]:
    with httpx.Client(base_url=svc.url, headers={"X-Api-Key": ADMIN_KEY}) as client:
        return client.get("/v1/sandlot/builds").json()["data"]["builds"]


# ---- over HTTP: sign-in, cookie, CSRF -------------------------------------------------------------------------------


def test_the_page_wants_the_admin_key_not_the_api_key(svc):
    page = httpx.get(svc.url + "/admin")
    assert page.status_code == 401 and 'name="key"' in page.text
    for key in (API_KEY, ADMIN_KEY + "x", ""):
        refused = httpx.post(svc.url + "/admin/login", data={"key": key})
        assert refused.status_code == 401 and "wrong key" in refused.text and "set-cookie" not in refused.headers
    forged = httpx.get(svc.url + "/admin", cookies={"sandlot_admin": f"x.{int(time.time()) + 999}.{'0' * 64}"})
    assert forged.status_code == 401


def test_the_session_cookie_is_not_the_key_and_is_httponly_and_strict(svc):
    response = httpx.post(svc.url + "/admin/login", data={"key": ADMIN_KEY})
    cookie = response.headers["set-cookie"]
    assert cookie.startswith("sandlot_admin=") and ADMIN_KEY not in cookie
    attributes = {part.strip().split("=")[0].lower() for part in cookie.split(";")}
    assert {"httponly", "samesite", "path", "max-age"} <= attributes
    assert "samesite=strict" in cookie.lower() and "path=/admin" in cookie.lower()
    page = httpx.get(svc.url + "/admin", cookies={"sandlot_admin": response.cookies["sandlot_admin"]})
    assert page.status_code == 200
    assert (
        page.headers["x-frame-options"] == "DENY"
        and "frame-ancestors 'none'" in page.headers["content-security-policy"]
    )
    assert "script-src 'self'" in page.headers["content-security-policy"] and "<script>" not in page.text


def test_forms_need_the_csrf_token_and_a_same_origin_request(svc):
    client, token = signed_in(svc)
    before = len(builds(svc))
    form = {"language": "python3", "spec": "pyjokes"}
    assert client.post("/admin/packages", data=form).status_code == 403  # no token
    assert client.post("/admin/packages", data={**form, "csrf": "0" * 64}).status_code == 403
    cross = client.post("/admin/packages", data={**form, "csrf": token}, headers={"Origin": "https://evil.example"})
    assert cross.status_code == 403
    fetched = client.post("/admin/packages", data={**form, "csrf": token}, headers={"Sec-Fetch-Site": "cross-site"})
    assert fetched.status_code == 403
    tried = client.post("/admin/try", data={"language": "python3", "code": "print(1)"})
    assert tried.status_code == 403
    assert len(builds(svc)) == before  # nothing was queued
    signed_out = httpx.post(svc.url + "/admin/packages", data={**form, "csrf": token})
    assert signed_out.status_code == 303 and signed_out.headers["location"] == "/admin"
    assert httpx.get(svc.url + "/admin/builds/1.json").status_code == 401
    client.close()


def test_the_page_shows_runtimes_protections_and_run_counts(svc):
    svc.run("print('counted')")
    client, _token = signed_in(svc)
    page = client.get("/admin").text
    client.close()
    for section in ("runtimes", "protections", "packages", "builds", "runs", "try"):
        assert f'id="{section}"' in page
    mode = svc.detail()["runtimes"]["python3"]["protections"]["mode"]
    assert f"<td>{mode}</td>" in page
    assert svc.detail()["runtimes"]["python3"]["layer"] in page  # the layer in use
    assert re.search(r"<td>python3</td>\s*<td class=\"num\">[1-9]", page)  # ok runs counted
    assert re.search(r'<tr data-name="six">\s*<td>six</td>', page)


# ---- in Chromium ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service as Driver
    except ImportError:
        pytest.skip("selenium is not installed (pip install -e '.[test]')")
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip("needs Debian's chromium and chromium-driver (./dev.sh test installs them as root)")
    profile = tempfile.mkdtemp(prefix="sandlot-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in [*CHROMIUM_FLAGS, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Driver(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    os.makedirs(ARTIFACTS, exist_ok=True)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def shot(driver, name: str) -> None:
    driver.save_screenshot(os.path.join(ARTIFACTS, f"admin-{name}.png"))


def wait(driver, condition, timeout: float = 300):
    """condition's answer once truthy; elements of a page being replaced meanwhile are looked for again (a poll
    that lands mid-navigation may also meet the driver's "cannot find context" inspector error: polled again)."""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    waiting = WebDriverWait(driver, timeout, poll_frequency=0.2, ignored_exceptions=[WebDriverException])
    return waiting.until(condition)


def by_id(driver, element_id: str):
    from selenium.webdriver.common.by import By

    return driver.find_element(By.ID, element_id)


def present(driver, css: str):
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, css)


def submit(driver, form: str, field: str, text: str, language: str) -> None:
    """Fill one of the page's forms (ids `<form>-language`, `<form>-<field>`, `<form>-button`) and press it."""
    from selenium.webdriver.support.ui import Select

    Select(by_id(driver, f"{form}-language")).select_by_value(language)
    box = by_id(driver, f"{form}-{field}")
    box.clear()
    box.send_keys(text)
    by_id(driver, f"{form}-button").click()


def add_through_form(driver, spec: str, language: str = "python3") -> None:
    submit(driver, "add", "spec", spec, language)


def try_code(driver, code: str, language: str = "python3") -> None:
    submit(driver, "try", "code", code, language)
    wait(driver, lambda d: present(d, "#try-result"), 60)


def followed_to_the_end(driver, outcome: str) -> None:
    """The script followed the build's log and, once it ended, loaded the page again saying how it ended."""
    wait(driver, lambda d: f"{outcome}" in d.current_url and present(d, "#packages"))


def test_sign_in_in_the_browser(svc, browser):
    browser.get(svc.url + "/admin")
    by_id(browser, "key").send_keys("not-the-key")
    by_id(browser, "sign-in").click()
    assert "wrong key" in wait(browser, lambda d: present(d, "#login-error"), 30)[0].text
    by_id(browser, "key").send_keys(ADMIN_KEY)
    by_id(browser, "sign-in").click()
    wait(browser, lambda d: present(d, "#runtimes"), 30)
    shot(browser, "1-signed-in")


def test_add_a_package_through_the_form_and_watch_the_build(svc, browser):
    add_through_form(browser, "pyjokes")
    wait(browser, lambda d: present(d, "[data-follow]") or "succeeded" in d.current_url, 30)
    shot(browser, "2-building")
    followed_to_the_end(browser, "succeeded")
    box = by_id(browser, "build-python3")
    assert "succeeded" in box.find_element("css selector", "[data-role=state]").text
    assert "Successfully installed" in box.find_element("css selector", "[data-role=log]").text
    row = present(browser, '#packages-python3 tr[data-name="pyjokes"]')
    assert row and "requested" in row[0].text
    shot(browser, "3-added")


def test_import_it_in_the_try_box(svc, browser):
    try_code(browser, "import pyjokes\nprint('joke ok', pyjokes.__name__)")
    assert by_id(browser, "try-stdout").text == "joke ok pyjokes"
    assert by_id(browser, "try-exit").text == "0"
    shot(browser, "4-try")


def test_remove_it_and_the_next_run_cannot_import_it(svc, browser):
    browser.get(svc.url + "/admin")
    present(browser, 'button.remove[data-name="pyjokes"]')[0].click()
    followed_to_the_end(browser, "succeeded")
    assert not present(browser, '#packages-python3 tr[data-name="pyjokes"]')
    try_code(browser, "import pyjokes")
    assert "No module named 'pyjokes'" in by_id(browser, "try-error").text
    shot(browser, "5-removed")


def test_a_bad_spec_is_refused_on_the_page(svc, browser):
    browser.get(svc.url + "/admin")
    add_through_form(browser, "git+https://example.com/evil.git")
    error = wait(browser, lambda d: present(d, "#add-error"), 30)[0]
    assert "not a valid requirement" in error.text
    add_through_form(browser, "is-number@file:../evil", language="nodejs")
    wait(browser, lambda d: any("not a semver range" in e.text for e in present(d, "#add-error")), 30)
    shot(browser, "6-bad-spec")


def test_a_failed_build_shows_its_error_and_the_old_layer_serves(svc, browser):
    browser.get(svc.url + "/admin")
    layer = svc.detail()["runtimes"]["python3"]["layer"]
    add_through_form(browser, MISSING)
    followed_to_the_end(browser, "failed")
    box = by_id(browser, "build-python3")
    error = box.find_element("css selector", "[data-role=error]").text
    assert "pip failed" in error and MISSING in error
    assert "keeps serving" in box.text
    assert svc.detail()["runtimes"]["python3"]["layer"] == layer
    shot(browser, "7-failed-build")
    browser.get(svc.url + f"/admin/builds/{builds(svc)[0]['id']}")  # its own page, without script
    assert "No matching distribution" in browser.page_source


def test_without_script_a_build_page_refreshes_itself_until_the_build_ends(svc):
    client, token = signed_in(svc)
    queued = client.post("/admin/packages", data={"csrf": token, "language": "python3", "spec": "termcolor"})
    assert queued.status_code == 303 and "build" in queued.headers["location"]
    build_id = builds(svc)[0]["id"]
    page = client.get(f"/admin/builds/{build_id}").text
    state = re.search(r'data-role="state">(\w+)<', page).group(1)
    assert ('http-equiv="refresh"' in page) == (state not in ("succeeded", "failed"))
    deadline = time.monotonic() + 300
    while state not in ("succeeded", "failed") and time.monotonic() < deadline:
        time.sleep(0.3)
        page = client.get(f"/admin/builds/{build_id}").text
        state = re.search(r'data-role="state">(\w+)<', page).group(1)
    client.close()
    assert state == "succeeded" and 'http-equiv="refresh"' not in page and "Successfully installed" in page
