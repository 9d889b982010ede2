"""The edge of every request: its id, its trace, its log line and its response count.

`X-Request-Id` is taken from the request (or made) and echoed in the response;
a W3C `traceparent` sets the trace id. Each run request gets exactly one log
line (`event: run`) with its language, outcome, exit code, duration, queue wait
and output sizes, never its code, stdin or output unless SANDLOT_LOG_DEBUG is
set; other requests get a `request` line (health and metrics scrapes at debug
level only). Responses are counted by route and status, and a run refused
before it reached a runtime (HTTP 503) is counted as a run with outcome
`refused`.
"""

from __future__ import annotations

import logging
import time

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from handler.bodies import MalformedJSON, parse_json
from handler.logs import RequestContext, current_request, request_id_from, trace_id_from
from handler.metrics import Metrics
from runtimes.languages import is_known

log = logging.getLogger("sandlot.access")

RUN_PATH = "/v1/sandbox/run"
_QUIET_PATHS = {"/health", "/metrics"}
_NOT_RUN = {400: "invalid", 401: "unauthorized", 499: "client_gone", 503: "refused"}


def _language_of(body: list[bytes]) -> str:
    """The language a refused run asked for, when its body was read before the refusal."""
    try:
        data = parse_json(b"".join(body))
    except MalformedJSON:  # a body nested too deeply was refused for that very reason
        return "unknown"
    language = data.get("language") if isinstance(data, dict) else None
    return language if is_known(language) else "unknown"


class ObservabilityMiddleware:
    def __init__(self, app: ASGIApp, metrics: Metrics, routes: set[str]):
        self.app = app
        self.metrics = metrics
        self.routes = routes  # known paths: anything else is counted as "other", to bound the label's values

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        context = RequestContext(
            request_id=request_id_from(headers.get("x-request-id")),
            trace_id=trace_id_from(headers.get("traceparent")),
        )
        token = current_request.set(context)
        path = scope.get("path", "")
        is_run = path == RUN_PATH
        body: list[bytes] = []
        status = 500
        started = time.monotonic()

        async def receive_and_keep() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                body.append(message.get("body", b""))
            return message

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                MutableHeaders(scope=message)["X-Request-Id"] = context.request_id
            await send(message)

        try:
            await self.app(scope, receive_and_keep if is_run else receive, send_with_id)
        finally:
            route = path if path in self.routes else "other"
            self.metrics.inc("http_responses", route, str(status))
            fields = {
                "event": "run" if is_run else "request",
                "method": scope.get("method", ""),
                "path": route,
                "status": status,
                "elapsed": round(time.monotonic() - started, 6),
            }
            if is_run:
                run = dict(context.run)
                if "outcome" not in run:  # it never reached a runtime
                    run = {"language": _language_of(body), "outcome": _NOT_RUN.get(status, "rejected")}
                    if status == 503:
                        self.metrics.inc("runs", run["language"], "refused")
                fields.update(run)
            level = logging.DEBUG if path in _QUIET_PATHS else logging.INFO
            log.log(level, fields["event"], extra=fields)
            current_request.reset(token)
