"""The service image and the compose file, checked without Docker: entry point, copied paths, Dify's contract."""

from __future__ import annotations

import fnmatch
import glob
import json
import os
import re
import subprocess
import tomllib

import pytest
import yaml
from dockerfile_parse import DockerfileParser

from handler import cli
from handler.settings import Settings
from runtimes.python import layer as python_layer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def dockerfile() -> DockerfileParser:
    parser = DockerfileParser(path=os.path.join(ROOT, "Dockerfile"))
    return parser


def instructions(parser: DockerfileParser, name: str) -> list[str]:
    return [i["value"] for i in parser.structure if i["instruction"] == name]


def final_stage(parser: DockerfileParser) -> list[dict]:
    starts = [n for n, i in enumerate(parser.structure) if i["instruction"] == "FROM"]
    return parser.structure[starts[-1] :]


def test_the_entry_point_is_the_sandlot_command_serving(dockerfile):
    entrypoint = json.loads(instructions(dockerfile, "ENTRYPOINT")[-1])
    command = json.loads(instructions(dockerfile, "CMD")[-1])
    assert entrypoint == ["sandlot"] and command == ["serve"]
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        assert tomllib.load(f)["project"]["scripts"]["sandlot"] == "handler.cli:main"
    with pytest.raises(SystemExit) as exit_:
        cli.main([*command, "--help"])
    assert exit_.value.code == 0
    health = [i["value"] for i in final_stage(dockerfile) if i["instruction"] == "HEALTHCHECK"][0]
    assert health.split("CMD", 1)[1].strip() == '["sandlot", "health"]'


def test_every_copied_path_exists_and_holds_every_package(dockerfile):
    copied = []
    for value in instructions(dockerfile, "COPY"):
        if value.startswith("--from="):
            continue
        *sources, _ = value.split()
        for source in sources:
            assert os.path.exists(os.path.join(ROOT, source)), source
            copied.append(source)
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)
    found = project["tool"]["setuptools"]["packages"]["find"]["include"]  # each top-level package, with its own
    assert sorted(pattern.removesuffix("*") for pattern in found) == sorted(_top_level_packages())
    for package in found:
        assert package.removesuffix("*") in copied, package  # pip install in the image gets all of it
    for package, files in project["tool"]["setuptools"]["package-data"].items():
        for name in files:  # a name or a glob (handler's templates)
            assert glob.glob(os.path.join(ROOT, *package.split("."), name)), (package, name)
    assert {"pyproject.toml", "README.md"} <= set(copied)  # the build reads both


def test_nothing_copied_is_left_out_of_the_build_context(dockerfile):
    with open(os.path.join(ROOT, ".dockerignore")) as f:
        ignored = [line.strip() for line in f if line.strip() and not line.startswith("#")]
    for value in instructions(dockerfile, "COPY"):
        if not value.startswith("--from="):
            for source in value.split()[:-1]:
                assert not any(fnmatch.fnmatch(source, pattern) for pattern in ignored), source


def test_port_data_dir_and_dify_places_agree_with_the_settings(dockerfile):
    env = dockerfile.envs
    assert instructions(dockerfile, "EXPOSE") == [str(Settings.model_fields["SANDBOX_PORT"].default)]
    assert env["SANDBOX_PORT"] == "8194"
    assert env["SANDLOT_DATA_DIR"] in instructions(dockerfile, "VOLUME")[0]
    workdir = [i["value"] for i in final_stage(dockerfile) if i["instruction"] == "WORKDIR"][-1]
    assert workdir == "/"  # conf/config.yaml and dependencies/ resolve to dify-sandbox's /conf and /dependencies
    assert str(python_layer.DIFY_REQUIREMENTS).startswith("dependencies/")
    node = env["NODEJS_PATH"]
    npm = os.path.join(os.path.dirname(os.path.dirname(node)), "lib", "node_modules", "npm")  # where layers look
    assert any(
        value.startswith("--from=node") and value.split()[-1] == npm for value in instructions(dockerfile, "COPY")
    )
    assert any(
        value.startswith("--from=node") and value.split()[-1] == node for value in instructions(dockerfile, "COPY")
    )


def test_compose_replaces_difys_sandbox_service_unchanged():
    with open(os.path.join(ROOT, "docker-compose.yaml")) as f:
        compose = yaml.safe_load(f)
    sandbox = compose["services"]["sandbox"]
    environment = sandbox["environment"]
    # the names Dify's own compose file sets for its sandbox service
    assert {"API_KEY", "WORKER_TIMEOUT", "ENABLE_NETWORK", "HTTP_PROXY", "HTTPS_PROXY", "SANDBOX_PORT"} <= set(
        environment
    )
    # Dify's SANDBOX_API_KEY, with no default: compose stops with the message where it is unset (no dify-sandbox)
    assert environment["API_KEY"].startswith("${SANDBOX_API_KEY:?set SANDBOX_API_KEY ")
    assert environment["SANDBOX_PORT"] == "${SANDBOX_PORT:-8194}"
    for name in environment:
        assert name in Settings.model_fields or name == "GIN_MODE", name
    targets = {volume.split(":")[1] for volume in sandbox["volumes"]}
    assert {"/conf", "/dependencies", "/var/lib/sandlot"} <= targets
    assert "ssrf_proxy_network" in sandbox["networks"]
    assert sandbox["healthcheck"]["test"] == ["CMD", "sandlot", "health"]
    assert {"SYS_ADMIN", "NET_ADMIN"} <= set(sandbox["cap_add"])


def test_the_real_container_script_stands_in_for_the_dockerfiles_base_images(dockerfile):
    """infra/container_test.sh builds the image with podman from local stand-ins of its base images
    (infra/standins.sh), tagged as the Dockerfile names them: a renamed base image must be renamed there too."""
    script = os.path.join(ROOT, "infra", "container_test.sh")
    with open(script) as f:
        text = f.read()
    with open(os.path.join(ROOT, "infra", "standins.sh")) as f:
        standins = f.read()
    assert "infra/standins.sh" in text and "standin_python_base" in text and "standin_node_base" in text
    for value in instructions(dockerfile, "FROM"):
        image = value.split()[0]
        assert f"docker.io/library/{image}" in standins, image
    for path in (script, os.path.join(ROOT, "infra", "standins.sh")):
        assert subprocess.run(["bash", "-n", path], capture_output=True).returncode == 0
    assert os.access(script, os.X_OK)


def test_the_container_script_installs_every_tool_it_runs_and_sets_each_variable_of_its_stand_in():
    """On a fresh machine the script installs what it then calls (slirp4netns was missing: `could not find
    slirp4netns`), and its stand-in's `podman import --change "ENV ..."` sets one variable each: podman reads
    `ENV A=1 B=2` as A set to "1 B=2", which left the CA variables unset inside."""
    with open(os.path.join(ROOT, "infra", "container_test.sh")) as f:
        text = f.read()
    with open(os.path.join(ROOT, "infra", "standins.sh")) as f:
        standins = f.read()
    installed = re.search(r"for tool in ([^;]+); do command -v", text).group(1).split()
    called = {"podman", "runc", "debootstrap", "catatonit"}
    if "slirp4netns" in text:
        called.add("slirp4netns")
    assert called <= set(installed), called - set(installed)
    changes = re.findall(r"""--change\s+["']ENV ([^"']*)["']""", standins)
    assert changes, "the stand-in's variables are set with --change"
    for change in changes:
        assert len(re.findall(r"\b[A-Z_][A-Z0-9_]*=", change)) == 1, change
    named = {change.split("=", 1)[0] for change in changes}
    assert named >= {"LANG", "PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE"}


def _top_level_packages() -> list[str]:
    """The project's top-level packages: directories of the root holding an __init__.py (tests/ aside)."""
    return [
        name for name in os.listdir(ROOT) if name != "tests" and os.path.isfile(os.path.join(ROOT, name, "__init__.py"))
    ]


def test_the_image_builds_the_default_layers_where_the_service_looks_for_them(dockerfile):
    """A new volume serves the defaults without a package index: the image builds them into the store the service
    reads (layers/store.py: IMAGE_LAYERS), after the ENV that the layers' keys hash (node's path), so that the key
    the service computes at start is the one the image's layer was built under."""
    from layers.store import IMAGE_LAYERS

    stage = final_stage(dockerfile)
    builds = [n for n, i in enumerate(stage) if i["instruction"] == "RUN" and "sandlot layers build" in i["value"]]
    assert len(builds) == 1, "one RUN builds the default layers"
    command = stage[builds[0]]["value"]
    assert IMAGE_LAYERS in command and "compileall" in command
    envs = [n for n, i in enumerate(stage) if i["instruction"] == "ENV" and "NODEJS_PATH" in i["value"]]
    assert envs and envs[0] < builds[0]


def test_the_image_builds_the_chroot_trees_on_its_finished_layers_and_compiled_standard_library(dockerfile):
    """A container on default privileges starts on the image's trees (runtimes/jail/trees/image_trees.py), found by
    a key over their sources' stats: they are built after everything they hold is final (the layers' bytecode and
    modes, the standard library's bytecode), or no container would find them."""
    stage = final_stage(dockerfile)
    layers = [n for n, i in enumerate(stage) if i["instruction"] == "RUN" and "sandlot layers build" in i["value"]]
    trees = [n for n, i in enumerate(stage) if i["instruction"] == "RUN" and "sandlot layers trees" in i["value"]]
    assert len(trees) == 1 and layers[0] < trees[0]
    command = stage[trees[0]]["value"]
    assert command.index("compileall") < command.index("sandlot layers trees")
    later = [i for i in stage[trees[0] + 1 :] if i["instruction"] in ("RUN", "COPY", "ADD")]
    assert not any("/opt/sandlot" in i["value"] or "/usr" in i["value"] for i in later), later
