"""template.yaml, the Dockerfiles and infra/: lint-clean, every reference resolves, least privilege, one contract."""

import json
import os
import re
import subprocess
import sys

import pytest
import yaml
from functions import HANDLERS, REPO

from runtimes.function.early import ENTRYPOINT_PREFIX

sys.path.insert(0, os.path.join(REPO, "infra"))

import events  # noqa: E402

TEMPLATE = os.path.join(REPO, "template.yaml")
DOCKERFILES = {"python3": "runtimes/python/Dockerfile", "nodejs": "runtimes/nodejs/Dockerfile"}


class Tagged:
    def __init__(self, tag: str, value):
        self.tag, self.value = tag, value


def _tagged(loader, suffix, node):
    if isinstance(node, yaml.ScalarNode):
        value = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)
    return Tagged(suffix, value)


class CfnLoader(yaml.SafeLoader):
    pass


CfnLoader.add_multi_constructor("!", _tagged)


@pytest.fixture(scope="module")
def template():
    with open(TEMPLATE) as f:
        return yaml.load(f, Loader=CfnLoader)  # noqa: S506 - SafeLoader plus the intrinsic tags


def walk(node):
    yield node
    if isinstance(node, Tagged):
        yield from walk(node.value)
    elif isinstance(node, dict):
        for value in node.values():
            yield from walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from walk(value)


def test_cfn_lint_is_clean():
    lint = "import sys; from cfnlint.runner import main; sys.argv = ['cfn-lint', sys.argv[1]]; sys.exit(main())"
    out = subprocess.run([sys.executable, "-c", lint, TEMPLATE], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_ref_getatt_and_sub_target_exists(template):
    names = set(template["Parameters"]) | set(template["Resources"])
    mappings = template["Mappings"]
    seen = 0
    for node in walk(template):
        if not isinstance(node, Tagged):
            continue
        if node.tag == "Ref":
            assert node.value in names or node.value.startswith("AWS::"), node.value
        elif node.tag == "GetAtt":
            target = node.value[0] if isinstance(node.value, list) else node.value.split(".")[0]
            assert target in template["Resources"], target
        elif node.tag == "Sub":
            text = node.value if isinstance(node.value, str) else node.value[0]
            for name in re.findall(r"\$\{([^}!]+)\}", text):
                assert name.split(".")[0] in names or name.startswith("AWS::"), name
        elif node.tag == "FindInMap":
            assert node.value[0] in mappings, node.value
        else:
            continue
        seen += 1
    assert seen >= 10


def test_the_api_function_may_invoke_only_the_runtime_functions(template):
    api = template["Resources"]["ApiFunction"]["Properties"]
    assert api["Handler"] == "handler.lambda_function.handler"
    statements = [s for p in api["Policies"] for s in p["Statement"]]
    assert [s["Action"] for s in statements] == ["lambda:InvokeFunction"]
    targets = statements[0]["Resource"]
    assert all(isinstance(t, Tagged) and t.tag == "GetAtt" for t in targets)
    assert sorted(t.value for t in targets) == ["NodeFunction.Arn", "PythonFunction.Arn"]


def test_runtime_functions_are_images_whose_role_has_nothing_but_logs(template):
    for name, language in (("PythonFunction", "python3"), ("NodeFunction", "nodejs")):
        resource = template["Resources"][name]
        assert resource["Properties"]["PackageType"] == "Image"
        assert "Policies" not in resource["Properties"] and "Role" not in resource["Properties"]
        assert resource["Metadata"]["Dockerfile"] == DOCKERFILES[language]
        assert resource["Metadata"]["DockerContext"] == "."


def test_function_timeouts_leave_room_above_the_longest_run(template):
    for run_seconds, limits in template["Mappings"]["RunLimits"].items():
        assert limits["FunctionTimeout"] > int(run_seconds)
    for run_mb, memory in template["Mappings"]["RunMemory"].items():
        assert memory["FunctionMemory"] > int(run_mb)
    assert template["Parameters"]["ApiKey"]["NoEcho"] is True
    assert template["Parameters"]["RequireSeccomp"]["Default"] == "true"


def test_runtime_functions_are_deployed_per_tenant(template):
    """Lambda's tenant isolation: each tenant id's invocations only in environments of that id's own. It cannot be
    combined with provisioned concurrency, SnapStart or function URLs, and of event sources only API Gateway's."""
    for name in ("PythonFunction", "NodeFunction"):
        properties = template["Resources"][name]["Properties"]
        assert properties["TenancyConfig"] == {"TenantIsolationMode": "PER_TENANT"}
        for incompatible in ("ProvisionedConcurrencyConfig", "SnapStart", "FunctionUrlConfig", "AutoPublishAlias"):
            assert incompatible not in properties, (name, incompatible)
        assert "Events" not in properties  # invoked by the API function only
    assert "TenancyConfig" not in template["Resources"]["ApiFunction"]["Properties"]  # API Gateway's target


@pytest.mark.parametrize(
    "value", ["auto", "per-run", "header:X-Tenant-Id", "header:x_tenant", "shared", "header:", "header:a b", "per run"]
)
def test_the_api_tenancy_parameter_takes_what_the_service_accepts(template, value):
    from handler.tenancy import TenancyPolicy

    parameter = template["Parameters"]["ApiTenancy"]
    assert parameter["Default"] == "auto"
    setting = template["Resources"]["ApiFunction"]["Properties"]["Environment"]["Variables"]["SANDLOT_LAMBDA_TENANCY"]
    assert setting.tag == "Ref" and setting.value == "ApiTenancy"
    try:
        TenancyPolicy.parse(value)
        accepted = True
    except ValueError:
        accepted = False
    assert bool(re.fullmatch(parameter["AllowedPattern"], value)) == accepted


@pytest.mark.parametrize("language", sorted(DOCKERFILES))
def test_dockerfiles_lay_out_the_image_with_the_tested_script(language):
    with open(os.path.join(REPO, DOCKERFILES[language])) as f:
        dockerfile = f.read()
    assert "infra/layout.sh /opt/sandlot" in dockerfile
    assert "libseccomp2" in dockerfile
    # root in the image: SAM local's emulator image is built on it by a step that needs root; Lambda runs the
    # function as its own least-privileged user whatever this says; elsewhere the jail gives runs uids of their own
    users = re.findall(r"^USER (\S+)", dockerfile, re.M)
    assert users and users[-1] == "root"
    entrypoint = json.loads(re.search(r"^ENTRYPOINT (.+)$", dockerfile, re.M).group(1))
    command = json.loads(re.search(r"^CMD (.+)$", dockerfile, re.M).group(1))
    # env(1) drops the role's credentials before the interpreter starts (no re-exec)
    assert entrypoint == [*ENTRYPOINT_PREFIX, "/opt/sandlot/venv/bin/python", "-m", "awslambdaric"]
    assert command == [HANDLERS[language]]
    if language == "nodejs":
        assert "FROM node:20" in dockerfile


def test_example_events_are_the_tested_shapes():
    directory = os.path.join(REPO, "infra", "events")
    for name, event in events.examples().items():
        with open(os.path.join(directory, name)) as f:
            assert json.load(f) == event, f"{name} is stale: run python infra/events.py"


def test_the_api_function_can_be_pointed_at_another_invoke_api(template, monkeypatch):
    # `sam local start-api --env-vars` overrides only variables the template declares: declared, empty by default
    variables = template["Resources"]["ApiFunction"]["Properties"]["Environment"]["Variables"]
    assert variables["SANDLOT_LAMBDA_ENDPOINT_URL"] == ""
    from handler.lambda_invoker import LambdaInvoker

    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_ENDPOINT_URL_LAMBDA", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("SANDLOT_LAMBDA_ENDPOINT_URL", "")
    assert LambdaInvoker({}, 10).client.meta.endpoint_url == "https://lambda.us-east-1.amazonaws.com"
    monkeypatch.setenv("SANDLOT_LAMBDA_ENDPOINT_URL", "http://127.0.0.1:18299")
    assert LambdaInvoker({}, 10).client.meta.endpoint_url == "http://127.0.0.1:18299"


def test_the_api_zip_is_built_for_the_declared_runtime(template):
    # infra/build-api.sh reads the version from the template and asks pip for that CPython's binary wheels,
    # whatever python3 runs it (sam build runs it from SAM's own venv)
    runtime = template["Resources"]["ApiFunction"]["Properties"]["Runtime"]
    with open(os.path.join(REPO, "infra", "build-api.sh")) as f:
        script = f.read()
    version = subprocess.run(
        ["sed", "-n", r"s/^ *Runtime: *python\([0-9][0-9.]*\) *\(#.*\)\{0,1\}$/\1/p", TEMPLATE],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert version == [runtime.removeprefix("python")]
    for flag in ('--python-version "$version"', "--only-binary=:all:", "--implementation cp", '--platform "$platform"'):
        assert flag in script
