"""infra/arm64/lambda_platform.py: the arm64 machine starts each runtime image as SAM local starts it (the RIE, then
the image's ENTRYPOINT and CMD), with template.yaml's variables at its defaults and the simulated Lambda's refusals.
The machine itself is infra/arm64_test.sh --lambda's (by hand, docs/lambda.md); this checks the contract on the host."""

import json
import os
import re
import sys

import pytest
import yaml
from functions import HANDLERS, REPO
from simulated import REFUSED
from test_lambda_template import DOCKERFILES, CfnLoader

sys.path.insert(0, os.path.join(REPO, "infra", "arm64"))

import lambda_platform  # noqa: E402


def image_config(language: str) -> dict:
    """The Config podman gives the built image, as far as the Dockerfile says it (and its base's PATH)."""
    with open(os.path.join(REPO, DOCKERFILES[language])) as f:
        dockerfile = f.read()
    env = ["PATH=/usr/local/bin:/usr/bin:/bin"]
    for block in re.findall(r"^ENV ((?:.*\\\n)*.*)$", dockerfile, re.M):
        env += block.replace("\\\n", " ").split()
    return {
        "Env": env,
        "Entrypoint": json.loads(re.search(r"^ENTRYPOINT (.+)$", dockerfile, re.M).group(1)),
        "Cmd": json.loads(re.search(r"^CMD (.+)$", dockerfile, re.M).group(1)),
        "WorkingDir": re.search(r"^WORKDIR (\S+)$", dockerfile, re.M).group(1),
    }


@pytest.fixture(scope="module")
def template():
    with open(os.path.join(REPO, "template.yaml")) as f:
        return yaml.load(f, Loader=CfnLoader)  # noqa: S506 - SafeLoader plus the intrinsic tags


def test_the_machine_refuses_what_the_simulated_lambda_refuses():
    assert lambda_platform.REFUSED == REFUSED


@pytest.mark.parametrize("language", sorted(DOCKERFILES))
def test_the_image_starts_behind_the_rie_as_sam_starts_it(language):
    config = image_config(language)
    rie = lambda_platform.rie_command(8080, 9001)
    assert rie[0] == "/var/rapid/aws-lambda-rie" and rie[1:3] == ["--log-level", "error"]
    assert "0.0.0.0:8080" in rie and "127.0.0.1:9001" in rie
    command = lambda_platform.bootstrap(config)
    assert command == [*config["Entrypoint"], HANDLERS[language]]
    # then, as the function: not root, Lambda's refusals, that command
    args = lambda_platform.restrictions("lambda", 993, command)
    assert args[args.index("--uid") + 1] == "993"
    assert args[args.index("--eperm") + 1] == REFUSED and args[args.index("--") + 1 :] == command
    # or as SAM local's container runs it: root (the image's USER), Docker's default capabilities and profile
    args = lambda_platform.restrictions("sam", 0, command)
    assert "--uid" not in args and "--eperm" not in args and args[args.index("--") + 1 :] == command
    assert args[args.index("--caps") + 1] == args[args.index("--profile") + 1] == "docker-default"


@pytest.mark.parametrize("language", sorted(DOCKERFILES))
def test_the_function_gets_the_images_env_and_the_templates_variables(language, template):
    config = image_config(language)
    env = lambda_platform.function_env(config, language)
    for item in config["Env"]:
        name, value = item.split("=", 1)
        assert env[name] == value, name
    assert env["AWS_LAMBDA_FUNCTION_HANDLER"] == HANDLERS[language]
    assert env["AWS_ACCESS_KEY_ID"] and env["AWS_SECRET_ACCESS_KEY"]  # as SAM gives them: the ENTRYPOINT drops them
    function = {"python3": "PythonFunction", "nodejs": "NodeFunction"}[language]
    properties = template["Resources"][function]["Properties"]
    parameters = template["Parameters"]
    for name, value in properties["Environment"]["Variables"].items():
        assert value.tag == "Ref"
        assert env[name] == parameters[value.value]["Default"], name
    memory = template["Mappings"]["RunMemory"][parameters["MaxRunMemoryMb"]["Default"]]["FunctionMemory"]
    assert env["AWS_LAMBDA_FUNCTION_MEMORY_SIZE"] == str(memory)
