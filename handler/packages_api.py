"""The package routes: list, add and remove the packages of a language's layer, and follow its builds.

    GET    /v1/sandlot/packages?language=python3          every package of the layer, where it comes from
    POST   /v1/sandlot/packages  {"language", "spec"|"specs"}   queue adding; answers with the build
    DELETE /v1/sandlot/packages?language=python3&name=six  queue removing (name may repeat)
    GET    /v1/sandlot/builds?language=python3            recent builds, newest first
    GET    /v1/sandlot/builds/latest?language=python3     the running, else next, else last build, log tail
    GET    /v1/sandlot/builds/{id}?offset=N&tail=N        one build; its log from line N (to follow it)

They take the admin key (SANDLOT_ADMIN_KEY) as `X-Api-Key` or `Authorization:
Bearer`; where none is set, the API key, as dify-sandbox's update route does.
A separate key matters because whoever holds the run key (Dify, and anyone who
reads Dify's configuration) could otherwise change what every tenant's code
imports. Answers use dify-sandbox's envelope: a refused spec is HTTP 400 with
`-400` and a message naming what is wrong; an unknown package or build 404 with
`-404`; a change that cannot be made here (a package of the base file, a layer
baked into a Lambda image) 409 with `-409`.

On the lambda backend the layers are baked into the runtime functions' images:
the list is the baked one, and adding or removing is refused with what to do
instead (rebuild the image and deploy).
"""

from __future__ import annotations

import hmac
import logging
from typing import TYPE_CHECKING

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from handler import envelope
from handler.bodies import MALFORMED, BodyTooLarge, MalformedJSON, parse_json, read_body
from handler.invoker import LayerAdmin
from layers.builds import Build
from layers.specs import PackageRefused, SpecError
from runtimes.languages import DEFAULT, is_known

if TYPE_CHECKING:  # not imported at run time: the API function on Lambda has no layer manager (and no jail)
    from layers.packages import PackageManager

log = logging.getLogger("sandlot.packages")

BAKED = (
    "the {language} layer is baked into the runtime function's image on the lambda backend: to add or remove a "
    "package, change the requirements file (or package.json), rebuild the image and deploy it "
    "(sam build && sam deploy)"
)
MAX_BODY = 64 * 1024
MAX_SPECS = 50  # in one request
MAX_DIGITS = 18  # a build id, offset or tail: below 2**63


class PackageError(Exception):
    """An answer other than success: HTTP status, envelope code, message."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status

    def response(self) -> JSONResponse:
        return envelope.failure(-self.status, str(self), self.status)


def _within_limits(items: list, when_empty: str, what: str) -> None:
    """One request changes at least one package and at most MAX_SPECS."""
    if not items:
        raise PackageError(400, when_empty)
    if len(items) > MAX_SPECS:
        raise PackageError(400, f"at most {MAX_SPECS} {what} in one request")


def _started(build, changes: list) -> dict:
    """The answer to a change: the build it joined (without its log) and what changed."""
    return {"build": build.to_dict(log=False), "changes": changes}


def admin_key(settings) -> str:
    """The key of the package routes: the admin key, or the API key where none is set."""
    return settings.SANDLOT_ADMIN_KEY or settings.API_KEY


def key_matches(given: str, key: str) -> bool:
    return bool(key) and hmac.compare_digest(given.encode(), key.encode())


class Packages:
    """What the routes, the CLI and the admin page ask about packages, whichever backend serves."""

    def __init__(self, settings, invoker, manager: PackageManager | None):
        self.settings = settings
        self.invoker = invoker
        self.manager = manager

    @property
    def backend(self) -> str:
        return self.settings.SANDLOT_BACKEND

    def language(self, value: object) -> str:
        if not is_known(value):
            raise PackageError(400, envelope.UNSUPPORTED_LANGUAGE)
        return str(value)

    def editable(self, language: str) -> bool:
        return self.manager is not None and self.manager.editable(language)

    async def listing(self, language: str) -> dict:
        if self.manager is not None and self.manager.editable(language):
            return self.manager.listing(language)
        if self.manager is None and isinstance(self.invoker, LayerAdmin):  # the lambda backend: baked
            try:
                baked = await self.invoker.dependencies(language)
                error = ""
            except Exception as exc:  # noqa: BLE001 - unavailable, throttled: the page and the route say so
                baked, error = [], str(exc) or type(exc).__name__
            rows = [
                {
                    "name": item.get("name", ""),
                    "version": item.get("version"),
                    "requested": None,
                    "base": True,
                    "kind": "baked",
                    "pending": None,
                }
                for item in baked
            ]
            return {
                "language": language,
                "editable": False,
                "message": BAKED.format(language=language),
                "error": error,
                "packages": rows,
                "build": None,
            }
        return {
            "language": language,
            "editable": False,
            "message": f"no {language} layer on this service",
            "error": "",
            "packages": [],
            "build": None,
        }

    def _refuse_unless_editable(self, language: str) -> PackageManager:
        if self.manager is None:
            if isinstance(self.invoker, LayerAdmin):
                raise PackageError(409, BAKED.format(language=language))
            raise PackageError(409, "this service has no dependency layers")
        if not self.manager.editable(language):
            raise PackageError(404, f"no {language} layer on this service")
        return self.manager

    def add(self, language: str, specs: list[object]) -> tuple[Build, list[dict]]:
        return self._change(self._refuse_unless_editable(language).add, language, specs)

    def remove(self, language: str, names: list[object]) -> tuple[Build, list[dict]]:
        return self._change(self._refuse_unless_editable(language).remove, language, names)

    @staticmethod
    def _change(change, language: str, items: list[object]) -> tuple[Build, list[dict]]:
        """A change of the manager's, its refusals as answers."""
        try:
            return change(language, items)
        except SpecError as exc:
            raise PackageError(400, str(exc)) from None
        except PackageRefused as exc:
            raise PackageError(exc.status, str(exc)) from None

    def build(self, build_id: int) -> Build:
        found = self.manager.build(build_id) if self.manager is not None else None
        if found is None:
            raise PackageError(404, f"no build {build_id}")
        return found

    def latest(self, language: str) -> Build | None:
        return self.manager.latest(language) if self.manager is not None else None

    def history(self, language: str | None = None) -> list[Build]:
        return self.manager.history(language) if self.manager is not None else []


def _int(value: str | None, name: str, default: int | None) -> int | None:
    """A query or path number: ASCII digits only, at most MAX_DIGITS of them (int() takes other scripts' digits,
    `_`, signs and spaces, and raises past 4,300 digits)."""
    if value is None or value == "":
        return default
    if value.startswith("-") and value[1:].isascii() and value[1:].isdigit():
        raise PackageError(400, f"{name} must not be negative")
    if not (value.isascii() and value.isdigit()):
        raise PackageError(400, f"{name} must be an integer")
    if len(value) > MAX_DIGITS:
        raise PackageError(400, f"{name} is out of range (at most {MAX_DIGITS} digits)")
    return int(value)


class PackagesAPI:
    """The JSON routes, behind the admin key."""

    def __init__(self, packages: Packages):
        self.packages = packages
        self.key = admin_key(packages.settings)
        settings = packages.settings
        if not settings.SANDLOT_ADMIN_KEY:
            log.warning(
                "SANDLOT_ADMIN_KEY is not set: the package routes take the API key (whoever holds the run key can "
                "change what every tenant imports) and /admin is off"
            )
        elif settings.SANDLOT_ADMIN_KEY == settings.API_KEY:
            log.warning("SANDLOT_ADMIN_KEY is the API key: the run key can change what every tenant imports")

    def authorized(self, request: Request) -> bool:
        given = request.headers.get("x-api-key", "")
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if not given and scheme.lower() == "bearer":
            given = token.strip()
        return key_matches(given, self.key)

    async def _answer(self, request: Request, handle) -> Response:
        if not self.authorized(request):
            return envelope.unauthorized()
        try:
            return envelope.success(await handle())
        except PackageError as exc:
            return exc.response()

    async def _body(self, request: Request) -> dict:
        try:
            raw = await read_body(request, MAX_BODY)
        except BodyTooLarge as exc:
            raise PackageError(400, str(exc)) from None
        except ClientDisconnect:
            raise PackageError(400, "client disconnected") from None
        try:
            data = parse_json(raw or b"{}")
        except MalformedJSON:
            raise PackageError(400, MALFORMED) from None  # nested too deeply too: this route says no more
        if not isinstance(data, dict):
            raise PackageError(400, "the body must be a JSON object")
        return data

    async def list_packages(self, request: Request) -> Response:
        async def handle():
            language = self.packages.language(request.query_params.get("language", DEFAULT.wire_name))
            return await self.packages.listing(language)

        return await self._answer(request, handle)

    async def add_packages(self, request: Request) -> Response:
        async def handle():
            data = await self._body(request)
            unknown = set(data) - {"language", "spec", "specs"}
            if unknown:
                raise PackageError(400, f"unknown field: {sorted(unknown)[0]}")
            language = self.packages.language(data.get("language", DEFAULT.wire_name))
            if ("spec" in data) == ("specs" in data):
                raise PackageError(400, "give `spec` (a string) or `specs` (a list of strings)")
            specs = [data["spec"]] if "spec" in data else data["specs"]
            if not isinstance(specs, list):
                raise PackageError(400, "`specs` must be a non-empty list of strings")
            _within_limits(specs, "`specs` must be a non-empty list of strings", "specs")
            return _started(*self.packages.add(language, specs))

        return await self._answer(request, handle)

    async def remove_packages(self, request: Request) -> Response:
        async def handle():
            language = self.packages.language(request.query_params.get("language", DEFAULT.wire_name))
            names = request.query_params.getlist("name")
            _within_limits(names, "give the package to remove as `name` (it may repeat)", "names")
            return _started(*self.packages.remove(language, names))

        return await self._answer(request, handle)

    async def builds(self, request: Request) -> Response:
        async def handle():
            language = request.query_params.get("language")
            if language is not None:
                self.packages.language(language)
            return {"builds": [b.to_dict(log=False) for b in self.packages.history(language)]}

        return await self._answer(request, handle)

    async def latest_build(self, request: Request) -> Response:
        async def handle():
            language = self.packages.language(request.query_params.get("language", DEFAULT.wire_name))
            build = self.packages.latest(language)
            if build is None:
                raise PackageError(404, f"no {language} build yet")
            return build.to_dict(tail=_int(request.query_params.get("tail"), "tail", 200))

        return await self._answer(request, handle)

    async def one_build(self, request: Request) -> Response:
        async def handle():
            build = self.packages.build(_int(request.path_params["id"], "id", 0))
            offset = _int(request.query_params.get("offset"), "offset", None)
            return build.to_dict(offset=offset, tail=_int(request.query_params.get("tail"), "tail", 200))

        return await self._answer(request, handle)

    def routes(self) -> list[Route]:
        return [
            Route("/v1/sandlot/packages", self.list_packages, methods=["GET"]),
            Route("/v1/sandlot/packages", self.add_packages, methods=["POST"]),
            Route("/v1/sandlot/packages", self.remove_packages, methods=["DELETE"]),
            Route("/v1/sandlot/builds", self.builds, methods=["GET"]),
            Route("/v1/sandlot/builds/latest", self.latest_build, methods=["GET"]),
            Route("/v1/sandlot/builds/{id}", self.one_build, methods=["GET"]),
        ]
