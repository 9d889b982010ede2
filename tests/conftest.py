import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from service import IS_ROOT, Service  # noqa: E402

needs_root = pytest.mark.skipif(not IS_ROOT, reason="needs root: chroot, setuid and mounts")


@pytest.fixture(scope="session")
def service():
    """The service as a Dify installation would run it: defaults, a key, network allowed."""
    svc = Service().start()
    yield svc
    svc.stop()


@pytest.fixture
def client(service):
    with service.client() as c:
        yield c
