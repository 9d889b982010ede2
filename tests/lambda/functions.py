"""Runtime function instances for tests: real awslambdaric processes on an emulated Runtime API."""

import os
import tempfile
import uuid

from emulation import FunctionInstance

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HANDLERS = {
    "python3": "runtimes.python.lambda_function.handler",
    "nodejs": "runtimes.nodejs.lambda_function.handler",
}
# What Lambda puts in the runtime client's environment; no run may ever print these.
FAKE_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "ASIAFAKE" + uuid.uuid4().hex[:12].upper(),
    "AWS_SECRET_ACCESS_KEY": "fakesecret" + uuid.uuid4().hex,
    "AWS_SESSION_TOKEN": "faketoken" + uuid.uuid4().hex,
}


def built_layers() -> dict[str, str]:
    """The layers `sandlot layers build` made (dev.sh builds them before the tests)."""
    from handler.cli import layer_manager
    from handler.settings import load_settings

    manager = layer_manager(load_settings())
    return {language: manager.ensure(language) for language in manager.layers}


def function_env(language: str, **extra: str) -> dict[str, str]:
    layers = built_layers()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        "PYTHONPATH": REPO,
        "SANDLOT_PYTHON_LAYER": layers.get("python3", ""),
        "SANDLOT_NODEJS_LAYER": layers.get("nodejs", ""),
        "SANDLOT_DATA_DIR": os.path.join(os.environ.get("SANDLOT_DATA_DIR", "/var/lib/sandlot"), "functions", language),
        **FAKE_CREDENTIALS,
    }
    if "NODEJS_PATH" in os.environ:
        env["NODEJS_PATH"] = os.environ["NODEJS_PATH"]
    env.update(extra)
    return env


# A runtime function owns its uid, as on Lambda: after each run it kills that uid's other processes and
# removes that uid's new files from /tmp. Started without root it would take the test runner's own.
OWN_UID = "a runtime function takes its uid as its own (its strays killed, its /tmp files removed): needs root"


def start_function(language: str, timeout: float = 30, **extra: str) -> FunctionInstance:
    os.makedirs(function_env(language)["SANDLOT_DATA_DIR"], exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="sandlot-fn-")
    env = function_env(language, TMPDIR=tmp, **extra)
    instance = FunctionInstance(HANDLERS[language], env, name=f"sandlot-{language}", timeout=timeout, cwd=REPO)
    instance.tmp = tmp
    return instance.start()


def boto_client(invoke_api, **config):
    """A boto3 Lambda client pointed at the emulation (config: botocore Config options)."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "lambda",
        endpoint_url=invoke_api.url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(**config),
    )


def boto_environment(invoke_api) -> dict[str, str]:
    """What points boto3 (and so the LambdaInvoker) at the emulation."""
    return {
        "AWS_ENDPOINT_URL_LAMBDA": invoke_api.url,
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "SANDLOT_LAMBDA_PYTHON3_FUNCTION": "sandlot-python3",
        "SANDLOT_LAMBDA_NODEJS_FUNCTION": "arn:aws:lambda:us-east-1:000000000000:function:sandlot-nodejs",
    }
