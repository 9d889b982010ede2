"""MAX_REQUESTS in flight and MAX_WORKERS at once, as a client sees them."""

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from service import Service


@pytest.fixture(scope="module")
def narrow():
    svc = Service(MAX_WORKERS="1", MAX_REQUESTS="3", SANDLOT_QUEUE_TIMEOUT="3").start()
    yield svc
    svc.stop()


def sleeper(seconds: float) -> str:
    return f"import time\ntime.sleep({seconds})\nprint('slept')"


def test_over_max_requests_gets_503_envelope(narrow):
    with ThreadPoolExecutor(3) as pool:
        slow = [pool.submit(narrow.run, sleeper(1.0), timeout=5) for _ in range(3)]
        time.sleep(0.4)  # all three are in flight: one running, two waiting
        with narrow.client() as client:
            response = client.post("/v1/sandbox/run", json={"language": "python3", "code": "print(1)"})
        assert response.status_code == 503
        assert response.json() == {"code": -503, "message": "Too many requests", "data": None}
        results = [f.result() for f in slow]
    assert all(r["data"]["stdout"] == "slept\n" for r in results)


def test_waiting_does_not_count_against_the_run_timeout(narrow):
    started = time.monotonic()
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda _: narrow.run(sleeper(0.7), timeout=1), range(2)))
    assert time.monotonic() - started >= 1.4  # one at a time
    for result in results:
        assert result["data"]["stdout"] == "slept\n", result
        assert result["data"]["error"] == ""


def test_wait_has_an_upper_bound(narrow):
    with ThreadPoolExecutor(2) as pool:
        long_run = pool.submit(narrow.run, sleeper(4.5), timeout=6)
        time.sleep(0.3)
        started = time.monotonic()
        with narrow.client() as client:
            response = client.post("/v1/sandbox/run", json={"language": "python3", "code": "print(1)"})
        waited = time.monotonic() - started
        assert response.status_code == 503 and response.json()["code"] == -503
        assert 2.5 < waited < 4.4
        assert long_run.result()["data"]["stdout"] == "slept\n"


def test_a_waiter_whose_client_left_is_dropped(narrow):
    with ThreadPoolExecutor(2) as pool:
        blocker = pool.submit(narrow.run, sleeper(1.5), timeout=5)
        time.sleep(0.3)
        marker = "/tmp/should-never-run"
        with pytest.raises(httpx.ReadTimeout), narrow.client() as client:
            client.post("/v1/sandbox/run", json={"language": "python3", "code": f"print('{marker}')"}, timeout=0.5)
        time.sleep(0.3)
        admission = narrow.detail()["admission"]
        assert admission["waiting"] == 0
        assert admission["in_flight"] == 1  # only the blocker
        assert blocker.result()["data"]["stdout"] == "slept\n"
