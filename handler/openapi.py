"""The API description: OpenAPI 3.1 built from the pydantic models of request, result and envelope.

Served without auth at `GET /openapi.json`, with a plain HTML summary at
`GET /docs` (no scripts, nothing fetched from elsewhere). Each route lists its
auth and every answer DESIGN.md gives it, the envelope codes included.
"""

from __future__ import annotations

import html
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import models_json_schema
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse
from starlette.routing import Route

from handler.models import RunBody
from runtimes.languages import DEFAULT, WIRE_NAMES
from runtimes.run_models import RunResult

# ---- the bodies, as pydantic models (the run request is handler.models.RunBody, the result the contract's own) -----


class Package(BaseModel):
    name: str
    version: str


class DependencyList(BaseModel):
    dependencies: list[Package]


class HealthDetail(BaseModel):
    model_config = ConfigDict(extra="allow")

    ready: bool
    backend: str
    runtimes: dict[str, Any] = Field(description="per language: state, protections in force, platform record, layer")
    limits: dict[str, Any]
    allowed_syscalls: dict[str, Any] = Field(
        description="ALLOWED_SYSCALLS as this machine reads them: its architecture, and each number's call there"
    )
    admission: dict[str, Any]


class LanguageBody(BaseModel):
    language: Literal[WIRE_NAMES] = DEFAULT.wire_name  # type: ignore[valid-type]


class PackageRow(BaseModel):
    name: str
    version: str | None = Field(description="installed in the serving layer; null when not (yet) installed")
    requested: str | None = Field(description="the spec it was added with (`POST /v1/sandlot/packages`), if any")
    base: bool = Field(description="named in the base file (requirements file or package.json)")
    kind: Literal["requested", "pending", "base", "dependency", "baked"]
    pending: dict[str, Any] | None = Field(description="a change waiting for a build: op, spec, build")


class PackageList(BaseModel):
    model_config = ConfigDict(extra="allow")

    language: Literal[WIRE_NAMES]  # type: ignore[valid-type]
    editable: bool = Field(description="false on the lambda backend: the layer is baked into the function's image")
    packages: list[PackageRow]
    build: dict[str, Any] | None = Field(description="the latest build of the language, without its log")


class BuildLog(BaseModel):
    first_line: int = Field(description="number of the first line returned")
    next_offset: int = Field(description="ask for `offset` = this to get the lines that come next")
    lines: list[str]


class LayerBuild(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: int
    language: Literal[WIRE_NAMES]  # type: ignore[valid-type]
    trigger: str = Field(description="packages, retry, resume, update, refresh, periodic refresh")
    state: Literal["queued", "building", "switching", "succeeded", "failed"]
    changes: list[dict[str, Any]] = Field(description="{op: add|remove, name, spec, id}")
    error: str = Field(description="why it failed; the old layer keeps serving")
    layer: str
    retried_in: list[int] = Field(description="a failed build of several changes: each retried alone in these")
    dropped: list[dict[str, Any]] = Field(description="changes given up because this build failed")
    log: BuildLog | None = None


class AddPackagesBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    language: Literal[WIRE_NAMES] = DEFAULT.wire_name  # type: ignore[valid-type]
    spec: str | None = Field(None, description="`six==1.16.0`, `requests>=2.31,<3`, `is-number@^7.0.0`")
    specs: list[str] | None = Field(None, description="several at once (one build); give `spec` or `specs`")


class BuildQueued(BaseModel):
    build: LayerBuild
    changes: list[dict[str, Any]] = Field(description="the changes this request made (their ids)")


class BuildList(BaseModel):
    builds: list[LayerBuild]


class PackagesEnvelope(BaseModel):
    code: Literal[0]
    message: Literal["success"]
    data: PackageList


class BuildQueuedEnvelope(BaseModel):
    code: Literal[0]
    message: Literal["success"]
    data: BuildQueued


class BuildEnvelope(BaseModel):
    code: Literal[0]
    message: Literal["success"]
    data: LayerBuild


class BuildsEnvelope(BaseModel):
    code: Literal[0]
    message: Literal["success"]
    data: BuildList


class PackageRefusal(BaseModel):
    """HTTP 404 (-404: no such package, build or layer) or 409 (-409: from the base file; baked on lambda)."""

    code: Literal[-404, -409]
    message: str
    data: None


class RunEnvelope(BaseModel):
    code: Literal[0]
    message: Literal["success"]
    data: RunResult


class DependenciesEnvelope(BaseModel):
    code: Literal[0]
    message: Literal["success"]
    data: DependencyList


class HealthEnvelope(BaseModel):
    code: Literal[0]
    message: Literal["success"]
    data: HealthDetail


class EmptyEnvelope(BaseModel):
    code: Literal[0]
    message: Literal["success"]
    data: dict[str, Any]


class BadRequest(BaseModel):
    """HTTP 400: malformed JSON, missing or empty code, wrong types, unsupported language."""

    code: Literal[-400]
    message: str
    data: None


class Refusal(BaseModel):
    """HTTP 200 without a result: network asked for while disabled (-400), sandbox unavailable (-500)."""

    code: Literal[-400, -500]
    message: str
    data: None


class TooManyRequests(BaseModel):
    """HTTP 503: more than MAX_REQUESTS in flight, or no worker within the queue timeout."""

    code: Literal[-503]
    message: Literal["Too many requests"]
    data: None


class ClientGone(BaseModel):
    """HTTP 499: the client went away while its run waited (nobody reads it)."""

    code: Literal[-499]
    message: str
    data: None


MODELS: list[type[BaseModel]] = [
    RunBody,
    LanguageBody,
    RunEnvelope,
    DependenciesEnvelope,
    HealthEnvelope,
    EmptyEnvelope,
    BadRequest,
    Refusal,
    TooManyRequests,
    ClientGone,
    AddPackagesBody,
    PackagesEnvelope,
    BuildQueuedEnvelope,
    BuildEnvelope,
    BuildsEnvelope,
    PackageRefusal,
]

# ---- the document -------------------------------------------------------------------------------------------------


def _json(model: str | list[str], description: str) -> dict:
    names = [model] if isinstance(model, str) else model
    refs = [{"$ref": f"#/components/schemas/{name}"} for name in names]
    schema = refs[0] if len(refs) == 1 else {"oneOf": refs}
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_UNAUTHORIZED = {"description": "missing or wrong X-Api-Key (empty body, as dify-sandbox answers)"}
_LANGUAGE_QUERY = {
    "name": "language",
    "in": "query",
    "required": False,
    "schema": {"type": "string", "enum": list(WIRE_NAMES), "default": DEFAULT.wire_name},
}
_TAIL = {
    "name": "tail",
    "in": "query",
    "required": False,
    "schema": {"type": "integer", "minimum": 0, "default": 200},
    "description": "how many of the last log lines (without `offset`)",
}
_KEY = [{"ApiKey": []}]
_ADMIN = [{"AdminKey": []}, {"AdminBearer": []}]
_ADMIN_UNAUTHORIZED = {"description": "missing or wrong admin key (SANDLOT_ADMIN_KEY; API_KEY where none is set)"}


def _operation(summary: str, responses: dict, *, auth: bool = True, **more: Any) -> dict:
    operation = {"summary": summary, "responses": responses, "security": _KEY if auth else [], **more}
    if auth:
        operation["responses"] = {**responses, "401": _UNAUTHORIZED}
    return operation


def _admin(summary: str, responses: dict, **more: Any) -> dict:
    return {"summary": summary, "security": _ADMIN, "responses": {**responses, "401": _ADMIN_UNAUTHORIZED}, **more}


def _package_paths() -> dict:
    """The package routes (handler/packages_api.py), behind the admin key."""
    bad = _json("BadRequest", "a refused spec or body: the message names what is wrong")
    refused = _json("PackageRefusal", "no such package or build (-404)")
    conflict = _json("PackageRefusal", "cannot be changed here: from the base file, or baked (lambda) (-409)")
    return {
        "/v1/sandlot/packages": {
            "get": _admin(
                "The packages of a language's layer: installed version, requested spec, base file or not",
                {"200": _json("PackagesEnvelope", "the list"), "400": _json("BadRequest", "unsupported language")},
                parameters=[_LANGUAGE_QUERY],
            ),
            "post": _admin(
                "Add packages: queues a build that installs them on top of the base file and switches to it live",
                {"200": _json("BuildQueuedEnvelope", "the build that will carry them"), "400": bad, "409": conflict},
                requestBody={
                    "required": True,
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/AddPackagesBody"}}},
                },
            ),
            "delete": _admin(
                "Remove added packages: queues a build without them",
                {
                    "200": _json("BuildQueuedEnvelope", "the build that will carry the removal"),
                    "400": bad,
                    "404": refused,
                    "409": conflict,
                },
                parameters=[
                    _LANGUAGE_QUERY,
                    {
                        "name": "name",
                        "in": "query",
                        "required": True,
                        "schema": {"type": "array", "items": {"type": "string"}},
                        "style": "form",
                        "explode": True,
                        "description": "a package to remove (repeat for several)",
                    },
                ],
            ),
        },
        "/v1/sandlot/builds": {
            "get": _admin(
                "Recent builds, newest first (without logs)",
                {"200": _json("BuildsEnvelope", "the builds"), "400": _json("BadRequest", "unsupported language")},
                parameters=[{**_LANGUAGE_QUERY, "schema": {"type": "string", "enum": list(WIRE_NAMES)}}],
            )
        },
        "/v1/sandlot/builds/latest": {
            "get": _admin(
                "The running, else the next queued, else the last build of a language, with its log's tail",
                {
                    "200": _json("BuildEnvelope", "the build"),
                    "400": _json("BadRequest", "unsupported language"),
                    "404": _json("PackageRefusal", "no build yet"),
                },
                parameters=[_LANGUAGE_QUERY, _TAIL],
            )
        },
        "/v1/sandlot/builds/{id}": {
            "get": _admin(
                "One build; its log from line `offset` on (to follow it), or its tail",
                {
                    "200": _json("BuildEnvelope", "the build"),
                    "400": _json("BadRequest", "a malformed number"),
                    "404": _json("PackageRefusal", "no such build"),
                },
                parameters=[
                    {"name": "id", "in": "path", "required": True, "schema": {"type": "integer", "minimum": 0}},
                    {
                        "name": "offset",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "integer", "minimum": 0},
                        "description": "the first log line wanted (a previous answer's `log.next_offset`)",
                    },
                    _TAIL,
                ],
            )
        },
    }


def _paths() -> dict:
    return {
        "/health": {
            "get": _operation(
                "Readiness: runs can be served",
                {
                    "200": {
                        "description": "ready",
                        "content": {"application/json": {"schema": {"type": "string", "const": "ok"}}},
                    },
                    "503": {
                        "description": "not ready: a runtime is down or a layer is missing",
                        "content": {"application/json": {"schema": {"type": "string"}}},
                    },
                },
                auth=False,
            )
        },
        "/v1/sandbox/health": {
            "get": _operation(
                "Protections in force, runtimes, layer in use, limits", {"200": _json("HealthEnvelope", "detail")}
            )
        },
        "/v1/sandbox/run": {
            "post": _operation(
                "Run code in the jail",
                {
                    "200": _json(
                        ["RunEnvelope", "Refusal"],
                        "the run's result (also when the code failed), or a refusal: network disabled (-400), "
                        "sandbox unavailable (-500)",
                    ),
                    "400": _json("BadRequest", "the request is not a valid run request"),
                    "499": _json("ClientGone", "the client went away while waiting for a worker"),
                    "503": _json("TooManyRequests", "overloaded"),
                },
                requestBody={
                    "required": True,
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/RunBody"}}},
                },
            )
        },
        "/v1/sandbox/dependencies": {
            "get": _operation(
                "Packages in the dependency layer",
                {
                    "200": _json("DependenciesEnvelope", "name and version of each package"),
                    "400": _json("BadRequest", "unsupported language"),
                },
                parameters=[_LANGUAGE_QUERY],
            )
        },
        "/v1/sandbox/dependencies/update": {
            "post": _operation(
                "Rebuild the layer and switch to it",
                {
                    "200": _json(["EmptyEnvelope", "Refusal"], "rebuilt, or -500 with pip's or npm's error"),
                    "400": _json("BadRequest", "malformed body or unsupported language"),
                },
                requestBody={
                    "required": False,
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/LanguageBody"}}},
                },
            )
        },
        "/v1/sandbox/dependencies/refresh": {
            "get": _operation(
                "Rebuild the layer, then list it",
                {
                    "200": _json(["DependenciesEnvelope", "Refusal"], "the new list, or -500 with the build's error"),
                    "400": _json("BadRequest", "unsupported language"),
                },
                parameters=[_LANGUAGE_QUERY],
            )
        },
        **_package_paths(),
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics (only with SANDLOT_METRICS=key; otherwise on their own address)",
                "security": [{"ApiKey": []}, {"Bearer": []}],
                "responses": {
                    "200": {
                        "description": "Prometheus text format",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    },
                    "401": _UNAUTHORIZED,
                },
            }
        },
        "/openapi.json": {
            "get": {
                "summary": "This document",
                "security": [],
                "responses": {
                    "200": {
                        "description": "OpenAPI 3.1",
                        "content": {"application/json": {"schema": {"type": "object"}}},
                    }
                },
            }
        },
        "/docs": {
            "get": {
                "summary": "A readable summary of this document",
                "security": [],
                "responses": {"200": {"description": "HTML", "content": {"text/html": {"schema": {"type": "string"}}}}},
            }
        },
    }


def openapi_document() -> dict:
    _, schemas = models_json_schema(
        [(model, "validation") for model in MODELS], ref_template="#/components/schemas/{model}"
    )
    _describe_run_body(schemas["$defs"]["RunBody"]["properties"])
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Sandlot",
            "version": _version(),
            "description": "Runs untrusted Python and Node.js code; wire-compatible with dify-sandbox.",
        },
        "paths": _paths(),
        "components": {
            "schemas": schemas.get("$defs", {}),
            "securitySchemes": {
                "ApiKey": {"type": "apiKey", "in": "header", "name": "X-Api-Key"},
                "Bearer": {"type": "http", "scheme": "bearer", "description": "the API key (for /metrics)"},
                "AdminKey": {
                    "type": "apiKey",
                    "in": "header",
                    "name": "X-Api-Key",
                    "description": "the admin key, SANDLOT_ADMIN_KEY (API_KEY where none is set): package routes",
                },
                "AdminBearer": {"type": "http", "scheme": "bearer", "description": "the admin key, as a bearer token"},
            },
        },
    }


def _describe_run_body(properties: dict) -> None:
    """What pydantic cannot say from RunRequest's types alone: the languages, and timeout's bound as JSON Schema."""
    properties["language"].update(enum=list(WIRE_NAMES), description="other values get HTTP 400")
    properties["timeout"] = {
        "anyOf": [{"type": "number", "exclusiveMinimum": 0}, {"type": "null"}],
        "default": None,
        "description": "seconds; capped by the server's maximum",
    }
    properties["memory_limit_mb"]["description"] = "capped by the server's maximum"
    properties["enable_network"]["description"] = "true while the server's ENABLE_NETWORK is false gets -400"
    properties["preload"]["description"] = "run in the jail before the code, only when ENABLE_PRELOAD is true"
    properties["dependencies"]["description"] = "accepted and ignored: a request never installs anything"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sandlot")
    except PackageNotFoundError:
        return "0"


def docs_page(document: dict) -> str:
    rows = []
    for path, operations in document["paths"].items():
        for method, op in operations.items():
            security = op.get("security") or []
            auth = "admin key" if {"AdminKey": []} in security else "key" if security else "none"
            answers = ", ".join(sorted(op["responses"]))
            rows.append(
                f"<tr><td>{method.upper()}</td><td><code>{html.escape(path)}</code></td><td>{auth}</td>"
                f"<td>{html.escape(op['summary'])}</td><td>{answers}</td></tr>"
            )
    return (
        "<!doctype html><html><head><meta charset=utf-8><title>Sandlot API</title></head><body>"
        "<h1>Sandlot API</h1><p>The full description is <a href=/openapi.json>/openapi.json</a> (OpenAPI 3.1).</p>"
        "<table border=1 cellpadding=4><tr><th>method</th><th>route</th><th>auth</th><th>what</th><th>HTTP</th></tr>"
        + "".join(rows)
        + "</table></body></html>"
    )


def openapi_routes() -> list[Route]:
    document = openapi_document()
    page = docs_page(document)

    async def spec(request: Request) -> JSONResponse:
        return JSONResponse(document)

    async def docs(request: Request) -> HTMLResponse:
        return HTMLResponse(page)

    return [Route("/openapi.json", spec, methods=["GET"]), Route("/docs", docs, methods=["GET"])]
