"""The operators' page, `/admin`: runtimes, protections, layers, packages, builds, run counts and a try box.

Off unless SANDLOT_ADMIN_KEY is set (the API key never opens it: Dify holds that
one). Server-rendered with Jinja2 (handler/templates/), no front-end build: it
works without JavaScript (forms, and a build page that refreshes itself while
the build runs); a little script (handler/static/admin.js) follows a build's
log live on the main page.

Sign-in: a form takes the admin key and sets a session cookie: not the key
itself but `nonce.expiry.HMAC(key, nonce|expiry)`, HttpOnly, SameSite=Strict,
Path=/admin, Secure over HTTPS, 12 hours. The key never sits in the browser,
and changing the key ends every session. The service also keeps the list of
the sessions it opened (in memory, at most MAX_SESSIONS): signing out takes the
session off it, so a copy of the cookie is worth nothing afterwards, and a
restart of the service ends every session. Every form carries a CSRF token
(HMAC(key, csrf|nonce)): a page behind a key must not be drivable from another
site; a POST whose Origin or Sec-Fetch-Site says it came from elsewhere is
refused too. Responses forbid framing, caching and inline script (CSP).

Whatever a request carries (a cookie, token or build id that is not ASCII, or
thousands of digits long) is answered 4xx, never 500.

The try box runs code through the same path as `POST /v1/sandbox/run` (admission,
the invoker, the metrics), so what it shows is what a client gets.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
import time
from pathlib import Path
from urllib.parse import parse_qs, quote, urlsplit

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from handler import run_path
from handler.admission import ClientWentAway, Refused
from handler.bodies import BodyTooLarge, read_body, until_disconnected
from handler.packages_api import PackageError, Packages
from runtimes.languages import DEFAULT, LANGUAGES, WIRE_NAMES
from runtimes.payload import RunRequest

HERE = Path(__file__).parent
COOKIE = "sandlot_admin"
SESSION_SECONDS = 12 * 3600
MAX_SESSIONS = 64  # live sessions kept; signing in past it ends the oldest
MAX_NUMBER = 18  # digits: a build id, an offset or an expiry longer than this is not one of ours
MAX_FORM = 256 * 1024  # a try box's code fits; anything bigger is refused
LOG_TAIL = 200
STATIC = {"admin.css": "text/css; charset=utf-8", "admin.js": "text/javascript; charset=utf-8"}
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",  # not no-referrer: that makes browsers send `Origin: null` on our own forms
    "Cache-Control": "no-store",
}
TRY_EXAMPLES = {language.wire_name: language.example for language in LANGUAGES}


class FormError(Exception):
    pass


def number(value: str) -> int | None:
    """A non-negative number written in ASCII digits, not too long to be one we gave out; None otherwise.
    (str.isdigit() takes other scripts' digits, which int() may then refuse; int() refuses 4,300 digits.)"""
    if not (value and len(value) <= MAX_NUMBER and value.isascii() and value.isdigit()):
        return None
    return int(value)


def same(given: str, expected: str) -> bool:
    """Constant-time comparison of what a request carries against what we made. compare_digest() refuses str with
    non-ASCII characters (TypeError): compare their UTF-8 bytes."""
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), expected.encode())


def run_counts(metrics) -> dict:
    """Runs by language and outcome, and the mean duration per language, from the metrics registry."""
    counts: dict[str, dict[str, int]] = {}
    for metric in metrics.runs.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total"):
                language, outcome = sample.labels["language"], sample.labels["outcome"]
                counts.setdefault(language, {})[outcome] = int(sample.value)
    totals: dict[str, dict[str, float]] = {}
    for metric in metrics.run_duration.collect():
        for sample in metric.samples:
            if sample.name.endswith(("_count", "_sum")):
                totals.setdefault(sample.labels["language"], {})[sample.name.rsplit("_", 1)[1]] = sample.value
    means = {
        language: (values["sum"] / values["count"] * 1000 if values.get("count") else None)
        for language, values in totals.items()
    }
    return {"counts": counts, "mean_ms": means}


class AdminPage:
    def __init__(self, settings, api, packages: Packages, metrics):
        self.settings = settings
        self.api = api  # handler.app.SandboxAPI: its admission and invoker serve the try box
        self.packages = packages
        self.metrics = metrics
        self.key = settings.SANDLOT_ADMIN_KEY.encode()
        self.templates = Environment(
            loader=FileSystemLoader(str(HERE / "templates")),
            autoescape=select_autoescape(["html"]),
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self._sessions: dict[str, int] = {}  # nonce: expiry, oldest first
        self.templates.filters["when"] = lambda t: time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else ""

    @property
    def on(self) -> bool:
        return bool(self.key)

    # ---- sessions and forms -----------------------------------------------------------------------------------------

    def _sign(self, purpose: str, *parts: str) -> str:
        return hmac.new(self.key, "|".join((purpose, *parts)).encode(), hashlib.sha256).hexdigest()

    def _new_session(self) -> str:
        now = int(time.time())
        for old, expiry in list(self._sessions.items()):
            if expiry < now or len(self._sessions) >= MAX_SESSIONS:
                del self._sessions[old]
        nonce, expires = secrets.token_urlsafe(18), now + SESSION_SECONDS
        self._sessions[nonce] = expires
        return f"{nonce}.{expires}.{self._sign('session', nonce, str(expires))}"

    def session(self, request: Request) -> str | None:
        """The session's nonce when the cookie is one we made, for this key, not expired and not signed out."""
        nonce, _, rest = request.cookies.get(COOKIE, "").partition(".")
        text, _, signature = rest.partition(".")
        expires = number(text)
        if not (nonce and expires is not None and signature):
            return None
        if not same(signature, self._sign("session", nonce, text)) or expires < time.time():
            return None
        if self._sessions.get(nonce) != expires:  # signed out, ended by a restart, or pushed out by newer ones
            return None
        return nonce

    def end_session(self, nonce: str) -> None:
        self._sessions.pop(nonce, None)

    def csrf(self, nonce: str) -> str:
        return self._sign("csrf", nonce)

    @staticmethod
    def same_origin(request: Request) -> bool:
        """What the browser says about where a POST comes from (both headers are set by the browser, not pages)."""
        site = request.headers.get("sec-fetch-site")
        if site is not None and site not in ("same-origin", "none"):
            return False
        origin = request.headers.get("origin")
        if origin is not None and origin != "null":
            hosts = {request.headers.get("host", ""), request.headers.get("x-forwarded-host", "")}
            return urlsplit(origin).netloc in hosts - {""}
        return origin != "null"

    async def form(self, request: Request) -> dict[str, str]:
        if "application/x-www-form-urlencoded" not in request.headers.get("content-type", ""):
            raise FormError("expected a form (application/x-www-form-urlencoded)")
        try:
            body = await read_body(request, MAX_FORM)
        except BodyTooLarge:
            raise FormError(f"form too large (limit {MAX_FORM} bytes)") from None
        except ClientDisconnect:
            raise FormError("client disconnected") from None
        try:
            fields = parse_qs(body.decode(), keep_blank_values=True, strict_parsing=False, max_num_fields=20)
        except (UnicodeDecodeError, ValueError) as exc:
            raise FormError(f"malformed form: {exc}") from None
        return {name: values[-1] for name, values in fields.items()}

    def respond(self, response: Response) -> Response:
        response.headers.update(HEADERS)
        return response

    def page(self, template: str, status: int = 200, **context) -> Response:
        html = self.templates.get_template(template).render(**context)
        return self.respond(HTMLResponse(html, status_code=status))

    def off(self) -> Response:
        return self.respond(
            HTMLResponse(
                "<!doctype html><title>Sandlot admin</title><p>The admin page is off: set SANDLOT_ADMIN_KEY to turn "
                "it on.</p>",
                status_code=404,
            )
        )

    async def guarded_post(self, request: Request) -> tuple[str, dict[str, str]] | Response:
        """(session nonce, form) for a POST from a signed-in page of ours; otherwise the refusal to send."""
        if not self.on:
            return self.off()
        nonce = self.session(request)
        if nonce is None:
            return self.respond(RedirectResponse("/admin", status_code=303))
        if not self.same_origin(request):
            return self.respond(HTMLResponse("cross-site request refused", status_code=403))
        try:
            fields = await self.form(request)
        except FormError as exc:
            return self.respond(HTMLResponse(str(exc), status_code=400))
        if not same(fields.get("csrf", ""), self.csrf(nonce)):
            return self.respond(HTMLResponse("missing or wrong CSRF token: reload the page", status_code=403))
        return nonce, fields

    # ---- the page -------------------------------------------------------------------------------------------------

    async def context(self, nonce: str, **extra) -> dict:
        invoker = self.api.invoker
        try:
            runtimes = invoker.status()
        except Exception as exc:  # noqa: BLE001 - the page must show, whatever a runtime says
            runtimes = {"error": {"ready": False, "error": str(exc)}}
        languages = [language for language in WIRE_NAMES if language in runtimes] or list(WIRE_NAMES)
        listings, builds = {}, {}
        for language in languages:
            listings[language] = await self.packages.listing(language)
            build = self.packages.latest(language)
            builds[language] = build.to_dict(tail=LOG_TAIL) if build else None
        protections = sorted({name for state in runtimes.values() for name in (state.get("protections") or {})})
        return {
            "csrf": self.csrf(nonce),
            "backend": self.settings.SANDLOT_BACKEND,
            "ready": invoker.ready(),
            "runtimes": runtimes,
            "languages": languages,
            "protections": [name for name in protections if name != "mode"],
            "listings": listings,
            "builds": builds,
            "history": [b.to_dict(log=False) for b in self.packages.history()[:10]],
            "runs": run_counts(self.metrics),
            "outcomes": ("ok", "error", "timeout", "forbidden_syscall", "output_limit", "memory_limit", "refused"),
            "enable_network": self.settings.ENABLE_NETWORK,
            "try_language": DEFAULT.wire_name,
            "try_code": DEFAULT.example,
            "add_language": DEFAULT.wire_name,
            "add_spec": "",
            **extra,
        }

    async def index(self, request: Request) -> Response:
        if not self.on:
            return self.off()
        nonce = self.session(request)
        if nonce is None:
            return self.page("login.html", status=401, error="")
        notice = request.query_params.get("notice", "")[:300]
        return self.page("admin.html", **await self.context(nonce, notice=notice))

    async def login(self, request: Request) -> Response:
        if not self.on:
            return self.off()
        if not self.same_origin(request):
            return self.respond(HTMLResponse("cross-site request refused", status_code=403))
        try:
            fields = await self.form(request)
        except FormError as exc:
            return self.page("login.html", status=400, error=str(exc))
        if not hmac.compare_digest(fields.get("key", "").encode("utf-8", "surrogatepass"), self.key):
            await asyncio.sleep(0.5)  # guessing costs time
            return self.page("login.html", status=401, error="wrong key")
        response = RedirectResponse("/admin", status_code=303)
        response.set_cookie(
            COOKIE,
            self._new_session(),
            max_age=SESSION_SECONDS,
            path="/admin",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return self.respond(response)

    async def logout(self, request: Request) -> Response:
        checked = await self.guarded_post(request)
        if isinstance(checked, Response):
            return checked
        self.end_session(checked[0])
        response = RedirectResponse("/admin", status_code=303)
        response.delete_cookie(COOKIE, path="/admin", httponly=True, samesite="strict")
        return self.respond(response)

    async def add(self, request: Request) -> Response:
        return await self._change(request, "spec", "add", self.packages.add)

    async def remove(self, request: Request) -> Response:
        return await self._change(request, "name", "remove", self.packages.remove)

    async def _change(self, request: Request, field: str, verb: str, apply) -> Response:
        """An add or remove form: its change queued (then back to the page, saying which build carries it),
        or the page again with the refusal beside the form."""
        checked = await self.guarded_post(request)
        if isinstance(checked, Response):
            return checked
        nonce, fields = checked
        language, value = fields.get("language", ""), fields.get(field, "")
        try:
            build, _changes = apply(self.packages.language(language), [value])
        except PackageError as exc:
            kept = {"add_spec": value} if verb == "add" else {}  # an add form keeps what was typed
            context = await self.context(nonce, add_error=str(exc), add_language=language, **kept)
            return self.page("admin.html", status=exc.status, **context)
        notice = quote(f"build {build.id}: {verb} {value.strip()} ({language})")
        return self.respond(RedirectResponse(f"/admin?notice={notice}#build-{language}", status_code=303))

    async def try_code(self, request: Request) -> Response:
        checked = await self.guarded_post(request)
        if isinstance(checked, Response):
            return checked
        nonce, fields = checked
        language, code = fields.get("language", DEFAULT.wire_name), fields.get("code", "")
        data = {"language": language, "code": code, "enable_network": fields.get("network") == "on"}
        api = self.api

        async def invoke(run_request: RunRequest) -> dict:
            async with api.admission.worker(lambda: until_disconnected(request)):
                return await api.invoker.invoke(run_request)

        try:
            async with api.admission.request():
                reply = await run_path.run(data, self.settings.ENABLE_NETWORK, invoke)
            body = reply.body
        except Refused:
            body = {"code": -503, "message": "Too many requests", "data": None}
        except ClientWentAway:
            body = {"code": -499, "message": "client went away while waiting", "data": None}
        context = await self.context(nonce, try_result=body, try_language=language, try_code=code)
        return self.page("admin.html", **context)

    def _build(self, request: Request):
        """The build the path names; PackageError 404 when there is none (an id that is no number included)."""
        build_id = number(request.path_params["id"])
        if build_id is None:
            raise PackageError(404, "no such build")
        return self.packages.build(build_id)

    async def build_page(self, request: Request) -> Response:
        if not self.on:
            return self.off()
        if self.session(request) is None:
            return self.respond(RedirectResponse("/admin", status_code=303))
        try:
            build = self._build(request)
        except PackageError as exc:
            return self.respond(HTMLResponse(str(exc), status_code=404))
        return self.page("build.html", build=build.to_dict(tail=2000))

    async def build_json(self, request: Request) -> Response:
        if not self.on:
            return self.off()
        if self.session(request) is None:
            return self.respond(JSONResponse({"error": "signed out"}, status_code=401))
        try:
            build = self._build(request)
        except PackageError as exc:
            return self.respond(JSONResponse({"error": str(exc)}, status_code=404))
        data = build.to_dict(offset=number(request.query_params.get("offset", "")), tail=LOG_TAIL)
        return self.respond(JSONResponse(data))

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in STATIC:
            return Response(status_code=404)
        return self.respond(Response((HERE / "static" / name).read_bytes(), media_type=STATIC[name]))

    def routes(self) -> list[Route]:
        return [
            Route("/admin", self.index, methods=["GET"]),
            Route("/admin/login", self.login, methods=["POST"]),
            Route("/admin/logout", self.logout, methods=["POST"]),
            Route("/admin/packages", self.add, methods=["POST"]),
            Route("/admin/packages/remove", self.remove, methods=["POST"]),
            Route("/admin/try", self.try_code, methods=["POST"]),
            # ids as text, read by number(): Starlette's int convertor lets int() raise on 4,300 digits (a 500)
            Route("/admin/builds/{id}.json", self.build_json, methods=["GET"]),
            Route("/admin/builds/{id}", self.build_page, methods=["GET"]),
            Route("/admin/static/{name}", self.static, methods=["GET"]),
        ]
