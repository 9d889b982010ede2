"""dify-sandbox's response envelope: {"code", "message", "data"}."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse, Response


def success(data: Any) -> JSONResponse:
    return JSONResponse({"code": 0, "message": "success", "data": data})


def failure(code: int, message: str, http_status: int = 200) -> JSONResponse:
    return JSONResponse({"code": code, "message": message, "data": None}, status_code=http_status)


def bad_request(message: str) -> JSONResponse:
    return failure(-400, message, 400)


def too_many_requests() -> JSONResponse:
    return failure(-503, "Too many requests", 503)


def unavailable(message: str) -> JSONResponse:
    return failure(-500, message, 200)


def unauthorized() -> Response:
    return Response(status_code=401)  # dify-sandbox answers with an empty body


NETWORK_DISABLED = "network is disabled, please enable it in the configuration"
UNSUPPORTED_LANGUAGE = "unsupported language"
