import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from service import IS_ROOT, NAMESPACES_ONLY, STANDIN, Service, free_port  # noqa: E402

needs_root = pytest.mark.skipif(not IS_ROOT, reason="needs root: chroot, setuid and mounts")


def pytest_collection_modifyitems(config, items):
    """Under the stand-in switch (SANDLOT_TEST_CONTAINER) a test marked `namespaces` skips, saying why."""
    if not STANDIN:
        return
    for item in items:
        if item.get_closest_marker("namespaces"):
            item.add_marker(pytest.mark.skip(reason=NAMESPACES_ONLY))


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


@pytest.fixture(scope="session")
def narrow():
    """One run at a time, no node, metrics on their own address, plain-text logs with payloads."""
    metrics_port = free_port()
    svc = Service(
        MAX_REQUESTS="1",
        MAX_WORKERS="1",
        NODEJS_PATH="/nonexistent/node",
        SANDLOT_METRICS=f"127.0.0.1:{metrics_port}",
        SANDLOT_LOG_FORMAT="text",
        SANDLOT_LOG_DEBUG="true",
    )
    svc.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
    svc.start()
    yield svc
    svc.stop()


@pytest.fixture(scope="session", autouse=True)
def shared_temp_places_stay_as_they_were():
    """No test may change who can use /tmp or /var/tmp: services and builds of other uids need them as they are."""
    before = {place: os.stat(place).st_mode for place in ("/tmp", "/var/tmp")}
    yield
    assert {place: os.stat(place).st_mode for place in before} == before
