"""Makes docs/admin-page.png: the /admin page of a real service after packages were added to both languages.

    .venv/bin/python docs/screenshot_admin.py [--port 18110] [--out docs/admin-page.png]

As root, on a machine that reaches the package indexes, with Debian's `chromium` and `chromium-driver` and the
test extra (selenium). It starts `sandlot serve` on the port given, with small base layers of its own under
/var/tmp, adds pyjokes and tabulate (pip) and is-number (npm) through the package routes, waits for each build,
signs in to /admin in headless Chromium and saves the whole page. Everything it made is removed when it ends.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
ADMIN_KEY = "admin-" + os.urandom(8).hex()
ADDS = [("python3", "pyjokes>=0.8"), ("nodejs", "is-number@^7.0.0"), ("python3", "tabulate")]
WIDTH = 827


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            answer = predicate()
        except httpx.HTTPError:
            answer = None
        if answer:
            return answer
        time.sleep(0.3)
    raise SystemExit(f"screenshot_admin: no {what} within {timeout:.0f} s")


def build_ended(client: httpx.Client, build_id: int) -> bool:
    build = client.get(f"/v1/sandlot/builds/{build_id}").json()["data"]
    if build["state"] == "failed":
        raise SystemExit(f"screenshot_admin: build {build_id} failed: {build.get('error')}")
    return build["state"] == "succeeded"


def screenshot(url: str, out: Path) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service as Driver
    from selenium.webdriver.common.by import By

    profile = tempfile.mkdtemp(prefix="sandlot-shot-profile-")
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "chromium"
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", f"--window-size={WIDTH},1000"):
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    driver = webdriver.Chrome(service=Driver(shutil.which("chromedriver")), options=options)
    try:
        driver.get(url + "/admin")
        driver.find_element(By.ID, "key").send_keys(ADMIN_KEY)
        driver.find_element(By.ID, "sign-in").click()
        wait_for(lambda: driver.find_elements(By.ID, "packages"), 30, "signed-in page")
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(WIDTH, height + 120)
        time.sleep(0.5)
        driver.save_screenshot(str(out))
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="make the admin page's screenshot for the docs")
    parser.add_argument("--port", type=int, default=18110)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "admin-page.png")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="sandlot-shot-", dir="/var/tmp"))
    root.chmod(0o755)  # layer builds run as an unprivileged uid: the base files must be readable to it
    (root / "requirements.txt").write_text("requests\n")
    package = {"name": "layer", "version": "1.0.0", "private": True, "dependencies": {"dayjs": "^1.11.0"}}
    (root / "package.json").write_text(json.dumps(package) + "\n")
    for name in ("requirements.txt", "package.json"):
        (root / name).chmod(0o644)
    url = f"http://127.0.0.1:{args.port}"
    env = {
        **os.environ,
        "API_KEY": "api-" + os.urandom(8).hex(),
        "SANDLOT_ADMIN_KEY": ADMIN_KEY,
        "SANDLOT_HOST": "127.0.0.1",
        "SANDBOX_PORT": str(args.port),
        "SANDLOT_CONFIG": "/nonexistent/config.yaml",
        "SANDLOT_DATA_DIR": str(root / "data"),
        "SANDLOT_PYTHON_REQUIREMENTS": str(root / "requirements.txt"),
        "SANDLOT_NODEJS_PACKAGE": str(root / "package.json"),
        "MAX_WORKERS": "2",
        "SANDLOT_LOG_LEVEL": "warning",
    }
    service = subprocess.Popen([sys.executable, "-m", "handler.cli", "serve"], env=env, cwd=ROOT)
    try:
        wait_for(lambda: httpx.get(url + "/health", timeout=2).status_code == 200, 600, "ready service")
        with httpx.Client(base_url=url, headers={"X-Api-Key": ADMIN_KEY}, timeout=60) as client:
            for language, spec in ADDS:
                answer = client.post("/v1/sandlot/packages", json={"language": language, "spec": spec}).json()
                build_id = answer["data"]["build"]["id"]
                wait_for(lambda b=build_id: build_ended(client, b), 600, f"end of build {build_id}")
        screenshot(url, args.out)
    finally:
        service.send_signal(signal.SIGTERM)
        try:
            service.wait(30)
        except subprocess.TimeoutExpired:
            service.kill()
            service.wait()
        shutil.rmtree(root, ignore_errors=True)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
