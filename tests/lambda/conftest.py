"""Fixtures for the Lambda layers of tests (see functions.py and emulation.py)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from functions import start_function  # noqa: E402


@pytest.fixture(scope="session")
def python_function():
    instance = start_function("python3")
    assert instance.ready, instance.output()
    yield instance
    instance.stop()


@pytest.fixture(scope="session")
def node_function():
    instance = start_function("nodejs")
    assert instance.ready, instance.output()
    yield instance
    instance.stop()


@pytest.fixture
def functions(python_function, node_function):
    return {"python3": python_function, "nodejs": node_function}
