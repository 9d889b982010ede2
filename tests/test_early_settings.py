"""`sandlot serve` starts its runtimes from a light reading of the environment (handler/early_settings.py) and loads
the settings model while their zygotes start: the reading and the model agree, the reading hands anything it cannot
vouch for to the model, and a setting only the model refuses still stops the start with its message, leaving no
process behind."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys

import pytest
from service import API_KEY, Service

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE = {"SANDLOT_CONFIG": "/nonexistent/config.yaml", "API_KEY": API_KEY}
SPELLINGS = importlib.import_module("test_settings").SPELLINGS


def test_the_reading_declares_what_the_model_declares():
    from field_tables import assert_declares_what_the_model_declares

    from handler.early_settings import FIELDS
    from handler.settings import Settings

    assert set(FIELDS) <= set(Settings.model_fields)
    assert_declares_what_the_model_declares(FIELDS, Settings.model_fields, plain_kinds=False)


@pytest.mark.parametrize("name", sorted(importlib.import_module("handler.early_settings").FIELDS))
def test_each_value_is_read_as_the_model_reads_it_or_left_to_the_model(name):
    from handler.early_settings import early_settings
    from handler.settings import SettingsError, load_settings

    for spelling in SPELLINGS:
        env = {**BASE, name: spelling}
        got = early_settings(env)
        if got is None:
            continue  # the model decides, before anything starts
        saved = dict(os.environ)
        os.environ.clear()
        os.environ.update(env)
        try:
            model = load_settings()
        except SettingsError:
            # vouched for, and refused by the model: only where the model checks what the reading cannot (none)
            pytest.fail(f"{name}={spelling!r}: read early, refused by the model")
        finally:
            os.environ.clear()
            os.environ.update(saved)
        value = getattr(got, name)
        expected = getattr(model, name)
        assert value == expected and type(value) is type(expected), (name, spelling, value, expected)
        assert got.runtime_config() == model.runtime_config(), (name, spelling)


@pytest.mark.parametrize(
    "env",
    [
        {"ALLOWED_SYSCALLS": "39"},  # the seccomp policy's check
        {"SANDLOT_EGRESS_ALLOW": "10.0.0.0/8"},
        {"PYTHON_DEPS_UPDATE_INTERVAL": "1h"},
        {"MAX_WORKERS": "1e3"},
        {"SANDLOT_DATA_DIR": "/tmp/sandlot-data"},  # refused by the model: no layer may be built there first
        {"API_KEY": "dify-sandbox"},  # refused by the model's key check, before anything starts
        {"API_KEY": ""},
        {"SANDLOT_ADMIN_KEY": "short"},
    ],
)
def test_what_the_reading_cannot_vouch_for_goes_to_the_model_first(env):
    from handler.early_settings import early_settings

    assert early_settings({**BASE, **env}) is None


def test_a_config_file_goes_to_the_model_first(tmp_path):
    from handler.early_settings import early_settings

    config = tmp_path / "config.yaml"
    config.write_text("max_workers: 2\n")
    assert early_settings({**BASE, "SANDLOT_CONFIG": str(config)}) is None
    assert early_settings(BASE) is not None


def test_the_reading_loads_no_pydantic():
    script = (
        "import sys\nfrom handler.early_settings import early_settings\n"
        f"s = early_settings({BASE!r})\nc = s.runtime_config()\n"
        "assert s.MAX_WORKERS == 4 and c.workers == 4\n"
        "print(sorted(m for m in sys.modules if m.startswith(('pydantic', 'yaml'))))"
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# in a subreaper, once its service ended: reap what came back (it had ended), then list what is still alive below
LEFT_BELOW = """
left = []
while True:
    try:
        if os.waitpid(-1, os.WNOHANG)[0] == 0:
            break
    except ChildProcessError:
        break
for entry in os.listdir("/proc"):
    try:
        with open(f"/proc/{entry}/stat") as f:
            if entry.isdigit() and int(f.read().rsplit(")", 1)[1].split()[1]) == os.getpid():
                left.append(entry)
    except (OSError, ValueError):
        pass
"""

# `sandlot serve` with a setting only the model refuses, as a subreaper: whatever of it outlives it comes back here
UNDER_A_SUBREAPER = (
    """
import ctypes, json, os, subprocess, sys
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
result = subprocess.run([sys.executable, "-m", "handler.cli", "serve"], capture_output=True, text=True, timeout=60)
"""
    + LEFT_BELOW
    + """
print(json.dumps({"code": result.returncode, "stderr": result.stderr, "left": left}))
"""
)


@pytest.mark.parametrize("setting", [{"SANDLOT_METRICS": "nonsense"}, {"SANDLOT_QUEUE_TIMEOUT": "0"}])
def test_a_setting_only_the_model_refuses_stops_the_start_and_leaves_no_process(setting):
    """The runtimes started from the light reading; the model's refusal stops them (their zygotes, a zygote half
    started too) before the start ends with the model's one-line message."""
    from handler.early_settings import early_settings

    svc = Service(**setting)
    assert early_settings(svc.env) is not None  # the zygotes do start before the model says no
    out = subprocess.run(
        [sys.executable, "-c", UNDER_A_SUBREAPER],
        cwd=ROOT,
        env={**svc.env, "PYTHONPATH": ROOT},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)
    assert found["code"] == 2, found["stderr"]
    assert "Traceback" not in found["stderr"], found["stderr"]
    [line] = [line for line in found["stderr"].splitlines() if line.startswith("sandlot:")]
    assert line.startswith("sandlot: invalid setting: ") and next(iter(setting)) in line
    assert found["left"] == [], found


# `sandlot serve` ended by SIGTERM as soon as its app answers (the runtimes most likely still starting), as a
# subreaper: whatever of it outlives it comes back here
TERMINATED_WHILE_STARTING = (
    """
import ctypes, json, os, signal, subprocess, sys, time, urllib.error, urllib.request
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
service = subprocess.Popen([sys.executable, "-m", "handler.cli", "serve"], stderr=subprocess.PIPE, text=True)
answered = None
deadline = time.monotonic() + 60
while answered is None and time.monotonic() < deadline:
    try:
        answered = urllib.request.urlopen(sys.argv[1] + "/health", timeout=5).status
    except urllib.error.HTTPError as exc:
        answered = exc.code
    except OSError:
        time.sleep(0.005)
service.send_signal(signal.SIGTERM)
stderr = service.communicate(timeout=60)[1]
time.sleep(0.5)  # what the service's end left (a zygote's last words) comes back to this subreaper
"""
    + LEFT_BELOW
    + """
print(json.dumps({"code": service.returncode, "answered": answered, "stderr": stderr, "left": left}))
"""
)


def test_a_service_stopped_while_its_runtimes_start_ends_them_first_and_leaves_no_process():
    """SIGTERM at the app's first answer: the lifespan's end waits for the runtimes' start it cancels, so a zygote
    being started is ended before what it starts on is taken down (no zygote traceback), and nothing is left."""
    svc = Service()
    out = subprocess.run(
        [sys.executable, "-c", TERMINATED_WHILE_STARTING, svc.url],
        cwd=ROOT,
        env={**svc.env, "PYTHONPATH": ROOT},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)
    assert found["answered"] in (200, 503), found
    assert found["code"] in (0, -15), found["stderr"]  # uvicorn ends by the signal it caught, once shut down
    assert "Traceback" not in found["stderr"], found["stderr"]
    assert found["left"] == [], found
