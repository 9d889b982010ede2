"""Configuration: dify-sandbox's names, env over conf/config.yaml over defaults, bad values stop start-up."""

import ast
import importlib
import os
import subprocess
import sys

import pytest
from service import Service

from handler.settings import SettingsError, load_settings
from runtimes.linux.seccomp import syscall_number

# ALLOWED_SYSCALLS takes the running architecture's numbers: one harmless call, one forbidden ones, by name
GETCPU = syscall_number("getcpu")
CLONE, EXECVE, PTRACE = (syscall_number(name) for name in ("clone", "execve", "ptrace"))

DIFY_YAML = f"""
app:
  port: 8200
  key: from-file
max_workers: 2
max_requests: 7
worker_timeout: 9
enable_network: false
allowed_syscalls: [{GETCPU}]
proxy:
  http: http://proxy.example:3128
"""


def test_file_in_dify_shape_and_env_wins(tmp_path, monkeypatch):
    config = tmp_path / "config.yaml"
    config.write_text(DIFY_YAML)
    monkeypatch.setenv("SANDLOT_CONFIG", str(config))
    monkeypatch.delenv("API_KEY", raising=False)
    monkeypatch.setenv("MAX_REQUESTS", "11")
    settings = load_settings()
    assert settings.SANDBOX_PORT == 8200 and settings.API_KEY == "from-file"
    assert settings.MAX_WORKERS == 2 and settings.WORKER_TIMEOUT == 9
    assert settings.MAX_REQUESTS == 11  # environment over file
    assert settings.ENABLE_NETWORK is False and settings.ALLOWED_SYSCALLS == [GETCPU]
    assert settings.runtime_config().run_env["HTTP_PROXY"] == "http://proxy.example:3128"


def test_defaults(monkeypatch):
    monkeypatch.setenv("SANDLOT_CONFIG", "/nonexistent.yaml")
    for name in ("API_KEY", "ENABLE_NETWORK", "MAX_WORKERS", "SANDBOX_PORT"):
        monkeypatch.delenv(name, raising=False)
    settings = load_settings()
    assert settings.ENABLE_NETWORK is True and settings.SANDBOX_PORT == 8194 and settings.API_KEY == ""


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("MAX_WORKERS", "many"),
        ("SANDBOX_PORT", "70000"),
        ("ALLOWED_SYSCALLS", str(EXECVE)),
        ("ALLOWED_SYSCALLS", str(PTRACE)),
        ("ENABLE_NETWORK", "perhaps"),
        ("SANDLOT_JAIL", "paper"),
        ("SANDLOT_UNFILTERED_EGRESS", "open"),
    ],
)
def test_bad_value_names_the_setting(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError) as info:
        load_settings()
    assert name in str(info.value)


@pytest.mark.parametrize("value", ["no-network", "allow", "refuse"])
def test_unfiltered_egress_reaches_the_runtimes(monkeypatch, value):
    monkeypatch.setenv("SANDLOT_CONFIG", "/nonexistent.yaml")
    monkeypatch.setenv("SANDLOT_UNFILTERED_EGRESS", value)
    assert load_settings().runtime_config().unfiltered_egress == value


def test_runs_never_get_unfiltered_egress_unless_asked(monkeypatch):
    monkeypatch.setenv("SANDLOT_CONFIG", "/nonexistent.yaml")
    monkeypatch.delenv("SANDLOT_UNFILTERED_EGRESS", raising=False)
    assert load_settings().runtime_config().unfiltered_egress == "no-network"


RUNTIME_ENVIRONMENT = {
    "WORKER_TIMEOUT": "7",
    "SANDLOT_MAX_TIMEOUT": "30",
    "SANDLOT_MEMORY_LIMIT_MB": "256",
    "SANDLOT_MAX_MEMORY_LIMIT_MB": "1024",
    "SANDLOT_OUTPUT_LIMIT_BYTES": "65536",
    "ENABLE_PRELOAD": "true",
    "ALLOWED_SYSCALLS": str(GETCPU),
    "HTTP_PROXY": "http://proxy.example:3128",
    "SOCKS5_PROXY": "socks5://proxy.example:1080",
    "SANDLOT_JAIL": "userns",
    "SANDLOT_REQUIRE_SECCOMP": "false",
    "SANDLOT_EGRESS_ALLOW": "203.0.113.0/24, 2001:db8::/32",
    "SANDLOT_PASTA": "/usr/bin/pasta",
    "SANDLOT_UNFILTERED_EGRESS": "refuse",
    "SANDLOT_UID_BASE": "2000000000",
    "SANDLOT_TMP_SIZE_MB": "32",
    "SANDLOT_TMP_FILES": "100",
    "SANDLOT_ZYGOTE_MAX_FORKS": "50",
    "SANDLOT_ZYGOTE_MAX_AGE": "60",
    "SANDLOT_ZYGOTE_START_TIMEOUT": "240",
    "SANDLOT_PYTHON_PRELOAD": "json, re",
    "SANDLOT_DATA_DIR": "/var/lib/sandlot-elsewhere",
}


def test_the_service_and_a_runtime_function_tell_the_runtimes_the_same(monkeypatch):
    """One declaration of the runtimes' settings, one mapping: nothing drifts between the two places."""
    from dataclasses import asdict

    from runtimes.function.environment import function_environment

    monkeypatch.setenv("SANDLOT_CONFIG", "/nonexistent.yaml")
    for name, value in RUNTIME_ENVIRONMENT.items():
        monkeypatch.setenv(name, value)
    service = asdict(load_settings().runtime_config())
    function = asdict(function_environment(dict(RUNTIME_ENVIRONMENT)).runtime_config())
    # what is each side's own: the layers it runs on, children kept ready, one run at a time
    for own in ("python_layer", "nodejs_layer", "workers", "one_run_at_a_time"):
        service.pop(own)
        function.pop(own)
    assert service == function
    assert function["egress_allow"] == ("203.0.113.0/24", "2001:db8::/32") and function["jail"] == "userns"
    assert function["run_env"]["ALL_PROXY"] == "socks5://proxy.example:1080"


@pytest.mark.parametrize("value", ["auto", "full", "userns", "reduced", "chroot", "single", "paper"])
def test_both_accept_the_same_jail_modes(monkeypatch, value):
    from runtimes.function.environment import ConfigError, function_environment

    monkeypatch.setenv("SANDLOT_CONFIG", "/nonexistent.yaml")
    monkeypatch.setenv("SANDLOT_JAIL", value)
    if value == "paper":
        with pytest.raises(SettingsError, match="SANDLOT_JAIL"):
            load_settings()
        with pytest.raises(ConfigError, match="SANDLOT_JAIL"):
            function_environment({"SANDLOT_JAIL": value})
    else:
        assert load_settings().SANDLOT_JAIL == function_environment({"SANDLOT_JAIL": value}).SANDLOT_JAIL == value


def test_the_jail_modes_the_settings_accept_are_the_ones_the_jail_knows():
    """Declared apart (the API function loads the settings without any jail module), kept equal here."""
    from runtimes.jail import modes
    from runtimes.runtime_settings import JAIL_MODES

    assert set(JAIL_MODES) == set(modes.CHOICES)


def test_layers_may_not_live_under_tmp_but_a_functions_scratch_does(monkeypatch):
    from runtimes.function.environment import function_environment

    monkeypatch.setenv("SANDLOT_CONFIG", "/nonexistent.yaml")
    monkeypatch.setenv("SANDLOT_DATA_DIR", "/tmp/layers-here")
    with pytest.raises(SettingsError, match="SANDLOT_DATA_DIR must not be under /tmp"):
        load_settings()
    assert load_settings(SANDLOT_BACKEND="lambda").SANDLOT_DATA_DIR == "/tmp/layers-here"  # no layers there
    assert function_environment({"SANDLOT_DATA_DIR": "/tmp/x"}).runtime_config().data_dir == "/tmp/x"


def test_a_functions_bad_syscall_list_is_refused_as_the_services_is():
    from runtimes.function.environment import ConfigError, function_environment

    with pytest.raises(ConfigError, match="ALLOWED_SYSCALLS"):
        function_environment({"ALLOWED_SYSCALLS": str(CLONE)})


def test_bad_value_stops_start_up_with_a_message():
    svc = Service(ALLOWED_SYSCALLS=str(CLONE))
    result = subprocess.run(
        [sys.executable, "-m", "handler.cli", "serve"], env=svc.env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "ALLOWED_SYSCALLS" in result.stderr and "clone" in result.stderr


def test_without_api_key_a_random_one_is_generated_and_printed_once():
    svc = Service(API_KEY="")
    svc.env.pop("API_KEY")
    svc.start()
    try:
        lines = [line for line in svc.output().splitlines() if "API_KEY" in line]
        assert len(lines) == 1
        key = lines[0].rsplit(" ", 1)[1]
        assert len(key) >= 32
        import httpx

        assert httpx.get(svc.url + "/v1/sandbox/health", headers={"X-Api-Key": key}).status_code == 200
        assert httpx.get(svc.url + "/v1/sandbox/health", headers={"X-Api-Key": "dify-sandbox"}).status_code == 401
    finally:
        svc.stop()


@pytest.fixture(scope="module")
def no_network():
    svc = Service(ENABLE_NETWORK="false", ENABLE_PRELOAD="true").start()
    yield svc
    svc.stop()


def test_network_request_while_disabled(no_network):
    envelope = no_network.run("print(1)", enable_network=True)
    assert envelope == {
        "code": -400,
        "message": "network is disabled, please enable it in the configuration",
        "data": None,
    }
    assert no_network.run("print(1)", enable_network=False)["data"]["stdout"] == "1\n"


def test_preload_runs_inside_the_jail_when_enabled(no_network):
    preload = "import os\nPRELOADED_UID = os.getuid()\n"
    data = no_network.run("import os\nprint(PRELOADED_UID == os.getuid())\nos.fork()", preload=preload)["data"]
    assert data["stdout"] == "True\n"
    assert "operation not permitted" in data["error"].lower()


def test_preload_is_ignored_when_disabled(service):
    data = service.run("print(globals().get('MARK', 'absent'))", preload="MARK = 'present'")["data"]
    assert data["stdout"] == "absent\n"


@pytest.mark.namespaces  # network for runs: nft rules or a namespace of their own
def test_network_calls_only_with_network(service):
    code = "import socket\ns = socket.socket()\ns.close()\nprint('socket ok')"
    assert service.run(code, enable_network=True)["data"]["stdout"] == "socket ok\n"
    denied = service.run(code, enable_network=False)["data"]
    assert "operation not permitted" in denied["error"].lower()
    pair = "import socket\na, b = socket.socketpair()\na.send(b'x')\nprint(b.recv(1))"
    assert service.run(pair, enable_network=False)["data"]["stdout"] == "b'x'\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: egress rules match the runs' own uids")
@pytest.mark.namespaces  # nft egress rules need NET_ADMIN
def test_egress_allow_names_reachable_ranges(service):
    allowed = Service(SANDLOT_EGRESS_ALLOW="127.0.0.1/32").start()
    try:
        code = f"import socket\nsocket.create_connection(('127.0.0.1', {service.port}), timeout=2).close()\nprint('ok')"
        assert allowed.run(code, enable_network=True)["data"]["stdout"] == "ok\n"
    finally:
        allowed.stop()
    assert "connected" not in service.run(code, enable_network=True)["data"]["stdout"]
    assert service.run(code, enable_network=True)["data"]["stdout"] == ""


def test_proxies_are_handed_to_user_code():
    svc = Service(
        HTTP_PROXY="http://10.9.9.9:3128", HTTPS_PROXY="http://10.9.9.9:3129", SOCKS5_PROXY="socks5://10.9.9.9:1080"
    ).start()
    try:
        code = "import os\nprint(os.environ['HTTP_PROXY'], os.environ['https_proxy'], os.environ['ALL_PROXY'])"
        data = svc.run(code)["data"]
        assert data["stdout"] == "http://10.9.9.9:3128 http://10.9.9.9:3129 socks5://10.9.9.9:1080\n"
        js = "console.log(process.env.HTTPS_PROXY)"
        assert svc.run(js, language="nodejs")["data"]["stdout"] == "http://10.9.9.9:3129\n"
    finally:
        svc.stop()


def test_a_functions_light_reading_declares_what_the_model_declares():
    """runtimes/function/environment.py reads a function's settings without pydantic (its cold path): the same names,
    defaults, bounds and choices as the model, FunctionEnvironment."""
    from field_tables import assert_declares_what_the_model_declares

    from runtimes.function.environment import FIELDS
    from runtimes.function.environment_model import FunctionEnvironment

    assert set(FIELDS) == set(FunctionEnvironment.model_fields)
    assert_declares_what_the_model_declares(FIELDS, FunctionEnvironment.model_fields)


SPELLINGS = [
    "", " ", "0", "1", "2", "15", "016", "1.5", ".5", "5.", "-1", "+3", " 7", "7 ", "1_000", "1e3", "nan", "inf",
    "true", "True", "TRUE", "false", "yes", "No", "on", "OFF", "t", "f", "y", "n", "maybe", "auto", "full",
    "userns", "Auto", "paper", "allow", "refuse", "no-network", "off", "json, re", "39", "57", "39,40",
    "10.0.0.0/8", "10.0.0.1/8", "65535", "65536", "4000000000", "4000000001", "1024", "1023", "999999999999999999999",
    "/opt/x", "socks5://proxy.example:1080",
]  # fmt: skip


@pytest.mark.parametrize("name", sorted(importlib.import_module("runtimes.function.environment").FIELDS))
def test_a_functions_light_reading_reads_each_value_as_the_model_does(name):
    """Every value is either read as the model reads it, or handed to the model: same value, same error."""
    from pydantic import ValidationError

    from runtimes.function.environment import ConfigError, FunctionSettings, function_environment
    from runtimes.function.environment_model import FunctionEnvironment

    for spelling in SPELLINGS:
        try:
            expected = getattr(FunctionEnvironment(**{name: spelling}), name)
        except ValidationError:
            expected = ConfigError
        try:
            got = function_environment({name: spelling})
        except ConfigError as exc:
            assert expected is ConfigError, (name, spelling, exc)
            assert name in str(exc)
            continue
        assert expected is not ConfigError, (name, spelling)
        value = getattr(got, name)
        assert value == expected and type(value) is type(expected), (name, spelling, value, expected)
        if isinstance(got, FunctionSettings):  # read lightly: the same value in the same type
            assert not isinstance(got, FunctionEnvironment)


def test_a_functions_init_reads_its_settings_without_pydantic():
    """The template's settings are read on a fresh environment's cold path without importing pydantic (it cost
    that path about 40 ms); a bad value is still the model's error."""
    script = (
        "import sys\n"
        "from runtimes.function.environment import function_environment\n"
        "s = function_environment({'SANDLOT_REQUIRE_SECCOMP': 'true', 'SANDLOT_MAX_TIMEOUT': '60',"
        " 'SANDLOT_MAX_MEMORY_LIMIT_MB': '2048', 'ENABLE_NETWORK': 'false', 'SANDLOT_DATA_DIR': '/var/tmp/x'})\n"
        "c = s.runtime_config()\n"
        "assert c.require_seccomp is True and c.max_timeout == 60.0 and c.max_memory_mb == 2048, c\n"
        "assert s.ENABLE_NETWORK is False and c.data_dir == '/var/tmp/x' and c.one_run_at_a_time, c\n"
    )
    assert pydantic_imported_by(script) == []


def pydantic_imported_by(script: str) -> list[str]:
    """The pydantic modules a fresh interpreter has imported once script ran (which must succeed)."""
    script += "\nimport sys\nprint(sorted(m for m in sys.modules if m.split('.')[0].startswith('pydantic')))\n"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60)
    return ast.literal_eval(out.stdout.strip().splitlines()[-1])


def test_a_functions_bad_value_is_the_models_clear_error():
    from runtimes.function.environment import ConfigError, function_environment

    with pytest.raises(ConfigError, match=r"^invalid setting: SANDLOT_MAX_TIMEOUT: Input should be greater than 0"):
        function_environment({"SANDLOT_MAX_TIMEOUT": "0"})
    with pytest.raises(ConfigError, match=r"^invalid setting: SANDLOT_TMP_FILES: Input should be a valid integer"):
        function_environment({"SANDLOT_TMP_FILES": "many"})
    assert function_environment({"SANDLOT_EGRESS_ALLOW": "203.0.113.0/24"}).runtime_config().egress_allow == (
        "203.0.113.0/24",
    )
