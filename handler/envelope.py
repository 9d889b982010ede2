"""dify-sandbox's response envelope: {"code", "message", "data"}.

Envelopes are plain (HTTP status, body) pairs until the edge: the Starlette route
turns one into a response, a direct invoke of the API function returns the body.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlette.responses import JSONResponse, Response

from runtimes.payload import NETWORK_DISABLED, UNSUPPORTED_LANGUAGE

__all__ = ["NETWORK_DISABLED", "UNSUPPORTED_LANGUAGE", "Reply"]


@dataclass(frozen=True)
class Reply:
    status: int
    body: dict

    def response(self) -> JSONResponse:
        return JSONResponse(self.body, status_code=self.status)


def success_reply(data: Any) -> Reply:
    return Reply(200, {"code": 0, "message": "success", "data": data})


def failure_reply(code: int, message: str, http_status: int = 200) -> Reply:
    return Reply(http_status, {"code": code, "message": message, "data": None})


def bad_request_reply(message: str, http_status: int = 400) -> Reply:
    return failure_reply(-400, message, http_status)


def too_many_requests_reply() -> Reply:
    return failure_reply(-503, "Too many requests", 503)


def unavailable_reply(message: str) -> Reply:
    return failure_reply(-500, message, 200)


def success(data: Any) -> JSONResponse:
    return success_reply(data).response()


def failure(code: int, message: str, http_status: int = 200) -> JSONResponse:
    return failure_reply(code, message, http_status).response()


def bad_request(message: str) -> JSONResponse:
    return bad_request_reply(message).response()


def too_many_requests() -> JSONResponse:
    return too_many_requests_reply().response()


def unavailable(message: str) -> JSONResponse:
    return unavailable_reply(message).response()


def unauthorized() -> Response:
    return Response(status_code=401)  # dify-sandbox answers with an empty body
