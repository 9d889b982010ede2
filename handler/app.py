"""The Starlette app: dify-sandbox's routes, envelope and errors, in front of an Invoker."""

from __future__ import annotations

import asyncio
import hmac
import logging
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from handler import envelope, run_path
from handler.admission import Admission, ClientWentAway, Refused
from handler.bodies import BodyTooLarge, MalformedJSON, parse_json, read_body, until_disconnected
from handler.invoker import Invoker, LayerAdmin, LayerBuildError, Unavailable
from handler.metrics import Metrics, metered, metrics_routes
from handler.middleware import ObservabilityMiddleware
from handler.settings import Settings
from runtimes.languages import DEFAULT, is_known
from runtimes.linux.procfs import since_exec
from runtimes.payload import RunRequest, RunResult

log = logging.getLogger("sandlot.api")
READY_POLL, READY_POLL_MAX = 0.01, 0.1  # seconds between looks at a starting runtime, to log it once ready
READY_WAIT = 120.0  # a runtime still starting after this long is logged as not ready (an ERROR)


class SandboxAPI:
    """Route handlers; state lives here, not in globals."""

    def __init__(self, settings: Settings, invoker: Invoker, started_early: asyncio.Task | None = None):
        self.settings = settings
        self.invoker = invoker
        self.admission = Admission(settings.MAX_REQUESTS, settings.MAX_WORKERS, settings.SANDLOT_QUEUE_TIMEOUT)
        self._key = settings.API_KEY.encode()
        self._starting: asyncio.Task | None = None
        self._started_early = started_early  # the invoker's start, begun before the app was built (cli.serve)
        self.stopped = False  # the invoker was stopped by the lifespan's end
        self.start_marks: dict[str, float] = {}  # seconds after exec: what cli.serve had done by then
        tenancy = settings.lambda_tenancy  # the header naming a request's tenant, if the lambda backend reads one
        self._tenant_header = tenancy.header if settings.SANDLOT_BACKEND == "lambda" else ""

    # ---- plumbing -------------------------------------------------------------

    def authorized(self, request: Request) -> bool:
        given = request.headers.get("x-api-key", "").encode()
        return bool(self._key) and hmac.compare_digest(given, self._key)

    @asynccontextmanager
    async def lifespan(self, app: Starlette):
        if self.start_marks:
            self.start_marks["app"] = since_exec()
        self._starting = asyncio.create_task(self._start())
        try:
            yield
        finally:
            starts = [task for task in (self._starting, self._started_early) if task is not None and not task.done()]
            for task in starts:
                task.cancel()
            if starts:  # their end first: a zygote being started is killed before its tree's mount is taken down
                await asyncio.wait(starts)
            await self.invoker.stop()
            self.stopped = True

    async def _start(self) -> None:
        try:
            if self._started_early is not None:
                await self._started_early
            else:
                await self.invoker.start()
        except Exception:  # noqa: BLE001 - health stays 503 and the log says why
            log.exception("the sandbox failed to start")
            return
        marks = self.start_marks
        if marks:
            marks["runtimes started"] = since_exec()
        waiting = set(self.invoker.status())
        waited, poll = 0.0, READY_POLL
        while waiting:  # each runtime logged once: ready (INFO), or failed (ERROR); starting is no failure
            for language, status in self.invoker.status().items():
                if language not in waiting:
                    continue
                record = {
                    "language": language,
                    "protections": status.get("protections"),
                    "platform": status.get("platform"),
                }
                if status.get("ready"):
                    waiting.discard(language)
                    if marks:
                        marks[f"{language} ready"] = since_exec()
                    log.info(
                        "%s runtime ready; protections in force: %s; platform: %s",
                        language,
                        status.get("protections"),
                        status.get("platform"),
                        extra=record,
                    )
                elif not status.get("starting") or waited >= READY_WAIT:
                    waiting.discard(language)
                    log.error("%s runtime not ready: %s", language, status.get("error"), extra=record)
            if waiting:
                await asyncio.sleep(poll)
                waited += poll
                poll = min(poll * 1.2, READY_POLL_MAX)  # a slow start is not asked about every 10 ms
        if marks:  # the start's timeline (bench/bench.py reads it)
            shown = ", ".join(f"{name} {at:.3f}" for name, at in sorted(marks.items(), key=lambda kv: kv[1]))
            log.info("started (seconds after exec): %s", shown, extra={"start_marks": marks})

    # ---- routes ---------------------------------------------------------------

    async def health(self, request: Request) -> JSONResponse:
        if self.invoker.ready():
            return JSONResponse("ok")
        return JSONResponse("not ready", status_code=503)

    async def health_detail(self, request: Request) -> JSONResponse:
        if not self.authorized(request):
            return envelope.unauthorized()
        s = self.settings
        return envelope.success(
            {
                "ready": self.invoker.ready(),
                "backend": s.SANDLOT_BACKEND,
                "runtimes": self.invoker.status(),
                "limits": {
                    "max_requests": s.MAX_REQUESTS,
                    "max_workers": s.MAX_WORKERS,
                    "default_timeout": s.WORKER_TIMEOUT,
                    "max_timeout": max(s.SANDLOT_MAX_TIMEOUT, s.WORKER_TIMEOUT),
                    "default_memory_mb": s.SANDLOT_MEMORY_LIMIT_MB,
                    "max_memory_mb": s.SANDLOT_MAX_MEMORY_LIMIT_MB,
                    "output_limit_bytes": s.SANDLOT_OUTPUT_LIMIT_BYTES,
                    "enable_network": s.ENABLE_NETWORK,
                    "enable_preload": s.ENABLE_PRELOAD,
                },
                "allowed_syscalls": s.allowed_syscalls_in_force(),
                "admission": self.admission.status(),
            }
        )

    async def run(self, request: Request):
        if not self.authorized(request):
            return envelope.unauthorized()
        try:
            async with self.admission.request():
                return await self._run(request)
        except Refused:
            return envelope.too_many_requests()

    async def _run(self, request: Request):
        try:
            raw = await read_body(request, self.settings.SANDLOT_MAX_BODY_BYTES)
        except BodyTooLarge as exc:
            return envelope.bad_request(str(exc))
        except ClientDisconnect:
            return envelope.bad_request("client disconnected")
        try:
            data = parse_json(raw)
        except MalformedJSON as exc:
            return envelope.bad_request(str(exc))

        async def invoke(run_request: RunRequest) -> RunResult:
            async with self.admission.worker(lambda: until_disconnected(request)):
                return await self.invoker.invoke(run_request)

        try:
            tenant = request.headers.get(self._tenant_header) if self._tenant_header else None
            reply = await run_path.run(data, self.settings.ENABLE_NETWORK, invoke, tenant)
        except ClientWentAway:
            return envelope.failure(-499, "client went away while waiting", 499)
        return reply.response()

    def _language(self, value: object) -> str | None:
        return value if is_known(value) else None

    async def dependencies(self, request: Request):
        if not self.authorized(request):
            return envelope.unauthorized()
        language = self._language(request.query_params.get("language", DEFAULT.wire_name))
        if language is None:
            return envelope.bad_request(envelope.UNSUPPORTED_LANGUAGE)
        if not isinstance(self.invoker, LayerAdmin):
            return envelope.unavailable("this service has no dependency layers to list")
        try:
            return envelope.success({"dependencies": await self.invoker.dependencies(language)})
        except Unavailable as exc:
            return envelope.unavailable(str(exc))

    async def update_dependencies(self, request: Request):
        if not self.authorized(request):
            return envelope.unauthorized()
        try:
            data = parse_json(await request.body() or b"{}")
        except MalformedJSON as exc:
            return envelope.bad_request(str(exc))
        language = self._language(data.get("language", DEFAULT.wire_name)) if isinstance(data, dict) else None
        return await self._rebuild(language, self._nothing)

    async def refresh_dependencies(self, request: Request):
        if not self.authorized(request):
            return envelope.unauthorized()
        language = self._language(request.query_params.get("language", DEFAULT.wire_name))
        return await self._rebuild(language, lambda: self.dependencies_of(language))

    async def _rebuild(self, language: str | None, answer):
        """Rebuild a layer and switch to it; a failure leaves the old one serving and says why."""
        if language is None:
            return envelope.bad_request(envelope.UNSUPPORTED_LANGUAGE)
        if not isinstance(self.invoker, LayerAdmin):
            return envelope.unavailable("this service has no dependency layers to rebuild")
        try:
            await self.invoker.update_dependencies(language)
            return envelope.success(await answer())
        except (LayerBuildError, Unavailable) as exc:
            return envelope.unavailable(str(exc))

    async def _nothing(self) -> dict:
        return {}

    async def dependencies_of(self, language: str) -> dict:
        return {"dependencies": await self.invoker.dependencies(language)}

    def routes(self) -> list[Route]:
        return [
            Route("/health", self.health, methods=["GET"]),
            Route("/v1/sandbox/health", self.health_detail, methods=["GET"]),
            Route("/v1/sandbox/run", self.run, methods=["POST"]),
            Route("/v1/sandbox/dependencies", self.dependencies, methods=["GET"]),
            Route("/v1/sandbox/dependencies/update", self.update_dependencies, methods=["POST"]),
            Route("/v1/sandbox/dependencies/refresh", self.refresh_dependencies, methods=["GET"]),
        ]


# The pages the run path does not need (the package routes, the admin page, the OpenAPI document): routed from
# the start, their code (jinja2, pydantic's JSON schema) imported at their first request. Path and methods as
# PackagesAPI.routes(), AdminPage.routes() and openapi_routes() give them, in their order (tests/test_app.py).
PAGE_ROUTES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("/v1/sandlot/packages", ("GET",)),
    ("/v1/sandlot/packages", ("POST",)),
    ("/v1/sandlot/packages", ("DELETE",)),
    ("/v1/sandlot/builds", ("GET",)),
    ("/v1/sandlot/builds/latest", ("GET",)),
    ("/v1/sandlot/builds/{id}", ("GET",)),
    ("/admin", ("GET",)),
    ("/admin/login", ("POST",)),
    ("/admin/logout", ("POST",)),
    ("/admin/packages", ("POST",)),
    ("/admin/packages/remove", ("POST",)),
    ("/admin/try", ("POST",)),
    ("/admin/builds/{id}.json", ("GET",)),
    ("/admin/builds/{id}", ("GET",)),
    ("/admin/static/{name}", ("GET",)),
    ("/openapi.json", ("GET",)),
    ("/docs", ("GET",)),
)


class Pages:
    """PAGE_ROUTES, each answered by its real route, made (with its module's imports) at the first request."""

    def __init__(self, settings: Settings, api: SandboxAPI, packages, metrics: Metrics):
        self._made = (settings, api, packages, metrics)
        self._routes: list[Route] | None = None

    def real_routes(self) -> list[Route]:
        if self._routes is None:
            from handler.admin import AdminPage
            from handler.openapi import openapi_routes
            from handler.packages_api import Packages, PackagesAPI

            settings, api, packages, metrics = self._made
            shown = Packages(settings, api.invoker, packages)
            admin = AdminPage(settings, api, shown, metrics)
            self._routes = PackagesAPI(shown).routes() + admin.routes() + openapi_routes()
        return self._routes

    def routes(self) -> list[Route]:
        return [Route(path, self._endpoint(i), methods=list(methods)) for i, (path, methods) in enumerate(PAGE_ROUTES)]

    def _endpoint(self, index: int):
        async def endpoint(request: Request):
            return await self.real_routes()[index].endpoint(request)

        return endpoint


METRICS_LOAD_DELAY = 5.0  # seconds after the runtimes' start before prometheus-client is imported


async def _load_metrics_after(starting: asyncio.Task, metrics: Metrics) -> None:
    """prometheus-client, loaded a few seconds after the runtimes have started: their start and the runs that
    come first go before its import (a scrape before loads it itself; counts wait for it meanwhile)."""
    await asyncio.wait({starting})
    await asyncio.sleep(METRICS_LOAD_DELAY)
    await asyncio.to_thread(metrics.load)


def create_app(
    settings: Settings,
    invoker: Invoker,
    metrics: Metrics | None = None,
    packages=None,
    starting: asyncio.Task | None = None,
) -> Starlette:
    """The app; `packages` (layers.packages.PackageManager) manages the local backend's requested packages: without
    one the package routes show the invoker's layers read-only (the lambda backend's are baked into images).
    starting: the invoker's start where the caller began it before building the app (cli.serve)."""
    metrics = metrics or Metrics()
    api = SandboxAPI(settings, metered(invoker, metrics, log_payloads=settings.SANDLOT_LOG_DEBUG), starting)
    metrics.watch(api.admission, api.invoker)
    if packages is not None:
        packages.finished_hooks.append(
            lambda build: metrics.inc("layer_builds", build.language, "ok" if build.error == "" else "failed")
        )
    routes = api.routes() + Pages(settings, api, packages, metrics).routes() + metrics_routes(settings, metrics)
    edge = Middleware(ObservabilityMiddleware, metrics=metrics, routes={route.path for route in routes})

    @asynccontextmanager
    async def lifespan(app: Starlette):
        async with api.lifespan(app):
            if packages is not None:
                await packages.start(after=api._starting)  # changes left pending build once the runtimes are up
            loading = asyncio.create_task(_load_metrics_after(api._starting, metrics))
            try:
                yield
            finally:
                loading.cancel()
                if packages is not None:
                    await packages.stop()

    app = Starlette(routes=routes, lifespan=lifespan, middleware=[edge])
    app.state.api = api
    app.state.metrics = metrics
    app.state.packages = packages
    return app
