"""/metrics: counters move by the right amounts per outcome; scraping needs the key or its own address."""

from __future__ import annotations

import signal
import threading

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from service import API_KEY


def scrape(url: str, **headers: str) -> dict[tuple, float]:
    """Every sample as {(name, sorted labels): value}."""
    response = httpx.get(url, headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def runs(samples: dict, language: str, outcome: str) -> float:
    return samples.get(("sandlot_runs_total", (("language", language), ("outcome", outcome))), 0.0)


def responses(samples: dict, route: str, status: int) -> float:
    return samples.get(("sandlot_http_responses_total", (("route", route), ("status", str(status)))), 0.0)


OUTCOMES = {
    "ok": ("print('fine')", {}),
    "error": ("import sys; sys.exit(3)", {}),
    "timeout": ("while True: pass", {"timeout": 0.5}),
    "forbidden_syscall": ("import os; os.fork()", {}),
    "output_limit": ("import sys\nwhile True: sys.stdout.write('x' * 65536)", {}),
    "memory_limit": ("x = bytearray(400 * 1024 * 1024)", {"memory_limit_mb": 64}),
}


def test_each_outcome_moves_its_own_counter_by_one(service):
    key = {"X-Api-Key": API_KEY}
    for outcome, (code, fields) in OUTCOMES.items():
        before = scrape(service.url + "/metrics", **key)
        envelope = service.run(code, **fields)
        assert envelope["code"] == 0, envelope
        assert envelope["data"]["outcome"] == outcome, envelope["data"]
        after = scrape(service.url + "/metrics", **key)
        for other in (*OUTCOMES, "refused"):
            expected = 1 if other == outcome else 0
            moved = runs(after, "python3", other) - runs(before, "python3", other)
            assert moved == expected, (outcome, other, envelope["data"])
        assert responses(after, "/v1/sandbox/run", 200) - responses(before, "/v1/sandbox/run", 200) == 1
        count = ("sandlot_run_duration_seconds_count", (("language", "python3"),))
        assert after[count] - before.get(count, 0) == 1
        assert (
            after[("sandlot_queue_wait_seconds_count", ())] - before.get(("sandlot_queue_wait_seconds_count", ()), 0)
            == 1
        )


def test_a_nodejs_run_is_counted_under_its_language(service):
    before = scrape(service.url + "/metrics", **{"X-Api-Key": API_KEY})
    assert service.run("process.exit(2)", language="nodejs")["data"]["exit_code"] == 2
    after = scrape(service.url + "/metrics", **{"X-Api-Key": API_KEY})
    assert runs(after, "nodejs", "error") - runs(before, "nodejs", "error") == 1


def test_runtimes_admission_and_layers_are_exported(service):
    samples = scrape(service.url + "/metrics", Authorization=f"Bearer {API_KEY}")
    names = {name for name, _ in samples}
    for name in (
        "sandlot_runs_in_flight",
        "sandlot_runs_waiting",
        "sandlot_requests_in_flight",
        "sandlot_zygote_starts_total",
        "sandlot_runtime_ready",
        "sandlot_layer_info",
        "process_resident_memory_bytes",
        "python_info",
    ):
        assert name in names, name
    assert samples[("sandlot_runtime_ready", (("language", "python3"),))] == 1
    assert samples[("sandlot_zygote_starts_total", (("language", "python3"),))] >= 1
    layer = [labels for name, labels in samples if name == "sandlot_layer_info" and ("language", "python3") in labels]
    assert layer and dict(layer[0])["path"] == service.detail()["runtimes"]["python3"]["layer"]


def test_scraping_without_the_key_is_refused_and_counted(service):
    before = scrape(service.url + "/metrics", **{"X-Api-Key": API_KEY})
    assert httpx.get(service.url + "/metrics").status_code == 401
    assert httpx.get(service.url + "/metrics", headers={"X-Api-Key": "wrong"}).status_code == 401
    assert httpx.get(service.url + "/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert httpx.post(service.url + "/v1/sandbox/run", json={"language": "python3", "code": "1"}).status_code == 401
    after = scrape(service.url + "/metrics", **{"X-Api-Key": API_KEY})
    assert responses(after, "/metrics", 401) - responses(before, "/metrics", 401) == 3
    assert responses(after, "/v1/sandbox/run", 401) - responses(before, "/v1/sandbox/run", 401) == 1
    assert sum(runs(after, "python3", o) - runs(before, "python3", o) for o in (*OUTCOMES, "refused")) == 0


def test_refused_runs_are_counted_as_refused(narrow):
    before = scrape(narrow.metrics_url)
    # no runtime for the language: the -500 envelope
    assert narrow.run("console.log(1)", language="nodejs")["code"] == -500
    # over MAX_REQUESTS: HTTP 503 while one run holds the only slot
    holder = threading.Thread(target=narrow.run, args=("import time; time.sleep(3)",))
    holder.start()
    try:
        with narrow.client() as client:
            for _ in range(100):
                detail = client.get("/v1/sandbox/health").json()["data"]
                if detail["admission"]["in_flight"] == 1:
                    break
            refused = client.post("/v1/sandbox/run", json={"language": "python3", "code": "print(1)"})
    finally:
        holder.join()
    assert refused.status_code == 503
    after = scrape(narrow.metrics_url)
    assert runs(after, "nodejs", "refused") - runs(before, "nodejs", "refused") == 1
    assert runs(after, "python3", "ok") - runs(before, "python3", "ok") == 1  # the holder
    assert responses(after, "/v1/sandbox/run", 503) - responses(before, "/v1/sandbox/run", 503) == 1
    refused_at_door = sum(
        runs(after, lang, "refused") - runs(before, lang, "refused") for lang in ("python3", "unknown")
    )
    assert refused_at_door == 1


def test_a_separate_metrics_address_serves_without_key_and_the_api_port_does_not(narrow):
    assert scrape(narrow.metrics_url)  # no key needed there
    assert httpx.get(narrow.url + "/metrics", headers={"X-Api-Key": API_KEY}).status_code == 404


def test_a_failed_layer_build_is_counted(narrow):
    before = scrape(narrow.metrics_url)
    with narrow.client() as client:
        answer = client.post("/v1/sandbox/dependencies/update", json={"language": "nodejs"}).json()
    assert answer["code"] == -500  # no node here, so no layer to build
    after = scrape(narrow.metrics_url)
    key = ("sandlot_layer_builds_total", (("language", "nodejs"), ("result", "failed")))
    assert after[key] - before.get(key, 0) == 1


@pytest.mark.parametrize(
    ("ended", "outcome"),
    [
        ({"status": 0, "stderr": b"a warning on stderr"}, "ok"),
        ({"status": 2, "stderr": b"ValueError: x"}, "error"),
        ({"status": 0, "timed_out": True}, "timeout"),
        ({"status": 0, "truncated": True}, "output_limit"),
        ({"status": 1, "stderr": b"Traceback ...\nMemoryError"}, "memory_limit"),
        ({"status": 6, "stderr": b"FATAL ERROR: Reached heap limit - JavaScript heap out of memory"}, "memory_limit"),
        ({"status": 1, "stderr": b"PermissionError: [Errno 1] Operation not permitted"}, "forbidden_syscall"),
        ({"status": int(signal.SIGSYS), "signaled": True}, "forbidden_syscall"),  # the filter's kill
        ({"status": 9, "signaled": True}, "error"),
    ],
)
def test_the_outcome_is_decided_where_the_result_is_built(ended, outcome):
    """The jail's own accounting first (timeout, cap, SIGSYS), then what only the interpreter can say."""
    from runtimes.jail.service.outcome import Outcome

    fields = {"stdout": b"", "stderr": b"", "signaled": False, "timed_out": False, "truncated": False, **ended}
    result = Outcome(duration=0.01, **fields).to_result()
    assert result.outcome == outcome
    assert result.to_wire()["outcome"] == outcome
    assert (result.error == "") == (outcome == "ok")


@pytest.mark.parametrize(
    ("value", "parsed"),
    [("key", ("key", "", 0)), ("off", ("off", "", 0)), ("127.0.0.1:9464", ("address", "127.0.0.1", 9464))],
)
def test_the_metrics_setting_takes_key_off_or_an_address(value, parsed):
    from handler.settings import load_settings, parse_metrics_setting

    assert parse_metrics_setting(value) == parsed
    assert value == load_settings(SANDLOT_METRICS=value).SANDLOT_METRICS


@pytest.mark.parametrize("value", ["public", "host:", "host:99999", ":x"])
def test_a_bad_metrics_setting_stops_start_up_naming_it(value):
    from handler.settings import SettingsError, load_settings

    with pytest.raises(SettingsError, match="SANDLOT_METRICS"):
        load_settings(SANDLOT_METRICS=value)
