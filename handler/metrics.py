"""Prometheus metrics (prometheus-client): runs, waits, refusals, runtimes and layers.

Runs are counted by language and outcome, the result's own `outcome` (decided
where the result is built), by a wrapper around whatever Invoker serves the API;
a run that got no result (Unavailable, Throttled) counts as `refused`. Admission (in flight, waiting), the runtimes'
zygote starts and the layer in use are read at scrape time from their status,
so nothing below the invoker seam knows about metrics. Process metrics come
from the library's own collectors.

`SANDLOT_METRICS` says where /metrics is served: `key` (on the API's port,
behind the API key), `off`, or `HOST:PORT` (a separate listener, no key).
"""

from __future__ import annotations

import hmac
import threading
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from handler.admission import queue_wait
from handler.logs import current_request
from handler.settings import parse_metrics_setting
from runtimes.languages import WIRE_NAMES
from runtimes.payload import RunOutcome, RunResult, Throttled, Unavailable

OUTCOMES = tuple(outcome.value for outcome in RunOutcome)
_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30)
# what load() makes: prometheus-client's registry and metrics (asking for one loads them)
_MADE = frozenset({"registry", "runs", "run_duration", "queue_wait", "http_responses", "layer_builds"})


class Metrics:
    """One registry per app, so that several apps in one process never share counts.

    prometheus-client is imported, and the registry made, at load(): at the first scrape or look at a metric,
    or once the service has started (the app's lifespan), not before the service's first run. What is counted
    before (inc, observe) waits in a list and is counted then.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loaded = False
        self._pending: list[tuple[str, str, tuple[str, ...], float]] = []  # (how, metric, labels, value)
        self._watched: list[tuple[Any, Any]] = []
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def __getattr__(self, name: str) -> Any:
        if name in _MADE:  # (found as an attribute once loaded: this is not called again)
            self.load()
            return self.__dict__[name]
        raise AttributeError(name)

    def load(self) -> None:
        """Import prometheus-client, make the registry and its metrics, and count what waited meanwhile."""
        if self._loaded:
            return
        from prometheus_client import (
            CollectorRegistry,
            Counter,
            GCCollector,
            Histogram,
            PlatformCollector,
            ProcessCollector,
            disable_created_metrics,
        )

        disable_created_metrics()  # no *_created series: counters' start times are noise to a dashboard
        registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
        made = {
            "registry": registry,
            "runs": Counter("sandlot_runs", "Runs by language and outcome", ["language", "outcome"], registry=registry),
            "run_duration": Histogram(
                "sandlot_run_duration_seconds",
                "Time a run took in the invoker (jail and code), by language",
                ["language"],
                buckets=_DURATION_BUCKETS,
                registry=registry,
            ),
            "queue_wait": Histogram(
                "sandlot_queue_wait_seconds",
                "Time a run waited for a worker before it started",
                buckets=_WAIT_BUCKETS,
                registry=registry,
            ),
            "http_responses": Counter(
                "sandlot_http_responses",
                "HTTP responses by route and status (401: wrong key, 503: overloaded or not ready)",
                ["route", "status"],
                registry=registry,
            ),
            "layer_builds": Counter(
                "sandlot_layer_builds",
                "Dependency layer rebuilds asked for through the API, by result",
                ["language", "result"],
                registry=registry,
            ),
        }
        with self._lock:
            if self._loaded:
                return  # (another thread made them first)
            self.__dict__.update(made)
            for outcome in OUTCOMES:  # every outcome shows from the first scrape, at 0
                for language in WIRE_NAMES:
                    self.child(made["runs"], language, outcome)
            for admission, invoker in self._watched:
                registry.register(_StateCollector(admission, invoker))
            for how, metric, labels, value in self._pending:
                self._count(how, metric, labels, value)
            self._pending = []
            self._watched = []
            self._loaded = True

    def inc(self, metric: str, *labels: str) -> None:
        """Count one in that metric (by its attribute's name), under those label values."""
        self._record("inc", metric, labels, 1)

    def observe(self, metric: str, value: float, *labels: str) -> None:
        """One observation of that histogram (by its attribute's name), under those label values."""
        self._record("observe", metric, labels, value)

    def _record(self, how: str, metric: str, labels: tuple[str, ...], value: float) -> None:
        if not self._loaded:
            with self._lock:
                if not self._loaded:
                    self._pending.append((how, metric, labels, value))
                    return
        self._count(how, metric, labels, value)

    def _count(self, how: str, metric: str, labels: tuple[str, ...], value: float) -> None:
        found = self.__dict__[metric]
        if labels:
            found = self.child(found, *labels)
        if how == "inc":
            found.inc(value)
        else:
            found.observe(value)

    def child(self, metric: Any, *values: str) -> Any:
        """metric.labels(*values), looked up once: prometheus-client's labels() takes a lock and builds its key on
        every call, and every request counts three. The values are few (routes, statuses, languages, outcomes)."""
        key = (id(metric), values)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*values)
        return found

    def watch(self, admission: Any, invoker: Any) -> None:
        """Read admission's and the runtimes' state at every scrape."""
        with self._lock:
            if not self._loaded:
                self._watched.append((admission, invoker))
                return
        self.registry.register(_StateCollector(admission, invoker))

    def exposition(self) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)


class _StateCollector:
    """Gauges and counters read from status() at scrape time."""

    def __init__(self, admission: Any, invoker: Any):
        self.admission = admission
        self.invoker = invoker

    def describe(self):
        return []  # values only exist at scrape time

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

        admission = self.admission.status()
        yield GaugeMetricFamily("sandlot_requests_in_flight", "Run requests being handled", admission["in_flight"])
        yield GaugeMetricFamily("sandlot_runs_in_flight", "Runs executing now", admission["running"])
        yield GaugeMetricFamily("sandlot_runs_waiting", "Runs waiting for a worker", admission["waiting"])
        ready = GaugeMetricFamily("sandlot_runtime_ready", "1 when the language's runtime serves", labels=["language"])
        starts = CounterMetricFamily(
            "sandlot_zygote_starts",
            "Zygotes started per runtime (the first ones, two for Python: lean and preloaded; then replacements "
            "after max forks, restarts after a crash, new layers)",
            labels=["language"],
        )
        children = GaugeMetricFamily("sandlot_ready_children", "Jailed children waiting for a run", labels=["language"])
        layer = InfoMetricFamily("sandlot_layer", "The dependency layer in use", labels=["language"])
        try:
            status = self.invoker.status()
        except Exception:  # noqa: BLE001 - a scrape must not fail because a runtime is down
            status = {}
        for language, state in sorted(status.items()):
            if not isinstance(state, dict):
                continue
            ready.add_metric([language], 1 if state.get("ready") else 0)
            if "zygote_generation" in state:
                starts.add_metric([language], state["zygote_generation"] or 0)
            if "ready_children" in state:
                children.add_metric([language], state["ready_children"] or 0)
            layer.add_metric([language], {"path": str(state.get("layer") or "")})
        yield from (ready, starts, children, layer)


class MeteredInvoker:
    """An Invoker that times and classifies each run and counts layer builds; everything else passes through."""

    def __init__(self, invoker: Any, metrics: Metrics, log_payloads: bool = False):
        self.inner = invoker
        self.metrics = metrics
        self.log_payloads = log_payloads

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def start(self) -> None:
        await self.inner.start()

    async def stop(self) -> None:
        await self.inner.stop()

    def ready(self) -> bool:
        return self.inner.ready()

    def status(self) -> dict:
        return self.inner.status()

    async def invoke(self, request) -> RunResult:
        waited = queue_wait.get()
        if waited is not None:
            self.metrics.observe("queue_wait", waited)
        facts: dict[str, Any] = {"language": request.language, "queue_wait": round(waited or 0.0, 6)}
        context = current_request.get()
        if context is not None:
            context.run = facts
        if self.log_payloads:
            facts.update(code=request.code, stdin=request.stdin)
        started = time.monotonic()
        try:
            result = await self.inner.invoke(request)
        except (Unavailable, Throttled) as exc:
            facts.update(outcome=RunOutcome.REFUSED.value, reason=str(exc))
            self.metrics.inc("runs", request.language, RunOutcome.REFUSED.value)
            raise
        duration = time.monotonic() - started
        self.metrics.inc("runs", request.language, result.outcome.value)
        self.metrics.observe("run_duration", duration, request.language)
        facts.update(
            outcome=result.outcome.value,
            duration=round(duration, 6),
            exit_code=result.exit_code,
            stdout_bytes=len(result.stdout.encode()),
            stderr_bytes=len(result.stderr.encode()),
            truncated=result.truncated,
        )
        if self.log_payloads:
            facts.update(stdout=result.stdout, stderr=result.stderr, error=result.error)
        return result


class MeteredLayerInvoker(MeteredInvoker):
    """The same, for an invoker that administers dependency layers: builds are counted too."""

    async def dependencies(self, language: str) -> list[dict[str, str]]:
        return await self.inner.dependencies(language)

    async def update_dependencies(self, language: str) -> None:
        try:
            await self.inner.update_dependencies(language)
        except Exception:
            self.metrics.inc("layer_builds", language, "failed")
            raise
        self.metrics.inc("layer_builds", language, "ok")


def metered(invoker: Any, metrics: Metrics, log_payloads: bool = False) -> MeteredInvoker:
    """invoker behind the meters, still a LayerAdmin exactly when it was one."""
    from handler.invoker import LayerAdmin

    cls = MeteredLayerInvoker if isinstance(invoker, LayerAdmin) else MeteredInvoker
    return cls(invoker, metrics, log_payloads)


def scrape_authorized(request: Request, key: bytes) -> bool:
    """The API key as X-Api-Key or as a bearer token (what Prometheus' `authorization` sends)."""
    given = request.headers.get("x-api-key", "")
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token:
        given = token.strip()
    return bool(key) and hmac.compare_digest(given.encode(), key)


def start_separate_listener(metrics: Metrics, host: str, port: int):
    """Serve /metrics without a key on its own address (prometheus-client's own server, in a thread)."""
    from prometheus_client import start_http_server

    return start_http_server(port, addr=host, registry=metrics.registry)


def metrics_routes(settings: Any, metrics: Metrics) -> list:
    """GET /metrics on the API's port when SANDLOT_METRICS is `key` (behind the API key); none otherwise."""
    from starlette.routing import Route

    if parse_metrics_setting(settings.SANDLOT_METRICS)[0] != "key":
        return []
    key = settings.API_KEY.encode()

    async def scrape(request: Request) -> Response:
        if not scrape_authorized(request, key):
            return Response(status_code=401, headers={"WWW-Authenticate": 'Bearer realm="sandlot"'})
        return metrics.exposition()

    return [Route("/metrics", scrape, methods=["GET"])]
