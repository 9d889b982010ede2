"""Fixtures for the Lambda layers of tests (see functions.py and emulation.py)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from functions import OWN_UID, boto_environment, start_function  # noqa: E402
from service import IS_ROOT  # noqa: E402


@pytest.fixture(scope="session")
def python_function():
    if not IS_ROOT:
        pytest.skip(OWN_UID)
    instance = start_function("python3")
    assert instance.ready, instance.output()
    yield instance
    instance.stop()


@pytest.fixture(scope="session")
def node_function():
    if not IS_ROOT:
        pytest.skip(OWN_UID)
    instance = start_function("nodejs")
    assert instance.ready, instance.output()
    yield instance
    instance.stop()


@pytest.fixture
def functions(python_function, node_function):
    return {"python3": python_function, "nodejs": node_function}


@pytest.fixture(scope="session")
def invoke_api():
    """Lambda's Invoke API on loopback, in front of the two runtime functions as template.yaml deploys them:
    PER_TENANT, each tenant id's environments started on demand, one busy at a time (reserved concurrency 1)."""
    if not IS_ROOT:
        pytest.skip(OWN_UID)
    from emulation import InvokeAPI

    api = InvokeAPI()
    api.add_per_tenant("sandlot-python3", lambda tenant: start_function("python3"))
    api.add_per_tenant("sandlot-nodejs", lambda tenant: start_function("nodejs"))
    yield api
    api.close()


@pytest.fixture(scope="session")
def api_function(invoke_api):
    """handler.lambda_function, imported as Lambda would import it, pointed at the emulation."""
    import importlib

    from service import API_KEY

    saved = dict(os.environ)
    os.environ.update(boto_environment(invoke_api), API_KEY=API_KEY, SANDLOT_CONFIG="/nonexistent/config.yaml")
    for name in ("AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        os.environ.pop(name, None)
    try:
        sys.modules.pop("handler.lambda_function", None)
        module = importlib.import_module("handler.lambda_function")
    finally:
        os.environ.clear()
        os.environ.update(saved)
    yield module
