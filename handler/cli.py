"""The `sandlot` command: serve the API, build dependency layers, run a file, check health, show the config."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from runtimes.languages import DEFAULT, LANGUAGES, WIRE_NAMES, by_wire_name
from runtimes.linux.procfs import since_exec

if TYPE_CHECKING:
    import asyncio

    from handler.settings import Settings
    from layers.manager import LayerManager
    from runtimes.payload import RunResult

# Imports go where they are used: `sandlot serve` spawns its zygotes before it imports the web stack, and the
# other commands load what they ask for (tests/test_cli.py lists what `import handler.cli` must not load).


def load_settings(**overrides):
    from handler.settings import load_settings as load

    return load(**overrides)


def layer_manager(settings: Settings) -> LayerManager:
    """Each language's layer store, as the settings describe it: the base files, and the packages an operator
    asked for on top of them (kept in the data dir, layers/packages.py). A language's own layer module says how
    (runtimes/<language>/layer.py); one that cannot be served here (no node) has none."""
    from layers.manager import LayerManager

    data = Path(settings.SANDLOT_DATA_DIR)
    layers = {}
    for language in LANGUAGES:
        layer = language.layer_module().managed_layer(settings, data)
        if layer is not None:
            layers[language.wire_name] = layer
    return LayerManager(layers)


def _runtime_config(settings: Settings, layers: LayerManager):
    """The runtimes' config, with each language's layer in use."""
    in_use = {language.config_layer: layers.current(language.wire_name) for language in LANGUAGES}
    return settings.runtime_config(**in_use)


def local_backend(
    settings: Settings,
    layers: LayerManager,
    refused: dict[str, str] | None = None,
    build_at_start: frozenset[str] = frozenset(),
):
    """The local backend's invoker (a runtime per language) and its package manager. refused: languages whose
    runs are refused for good, with the reason (a layer that could not be had at start); build_at_start: those
    whose layer is built as their runtime starts (LocalInvoker)."""
    from handler.local_invoker import LocalInvoker
    from layers.packages import PackageManager

    config = _runtime_config(settings, layers)
    runtimes = {language.wire_name: language.runtime_class()(config) for language in LANGUAGES}
    for language, why in (refused or {}).items():
        runtimes[language].refused = why
    invoker = LocalInvoker(runtimes, layers, settings.PYTHON_DEPS_UPDATE_INTERVAL, build_at_start)
    packages = PackageManager(
        layers, runtimes, Path(settings.SANDLOT_DATA_DIR), allow_any=settings.SANDLOT_PACKAGES_ALLOW_ANY_SPEC
    )
    return invoker, packages


def build_app(
    settings: Settings,
    layers: LayerManager | None,
    refused: dict[str, str] | None = None,
    backend: tuple | None = None,
    starting: asyncio.Task | None = None,
):
    """The app with the invoker the settings ask for. refused: as local_backend's. backend: local_backend's
    answer where the caller made it already; starting: its invoker's start, begun before the app was built."""
    from handler.app import create_app

    if settings.SANDLOT_BACKEND == "lambda":
        from handler.lambda_invoker import LambdaInvoker

        return create_app(settings, LambdaInvoker.from_settings(settings))
    invoker, packages = backend or local_backend(settings, layers, refused)
    return create_app(settings, invoker, packages=packages, starting=starting)


def serve(args: argparse.Namespace) -> int:
    """The service. Its runtimes start first, their zygotes spawned before the web stack is imported: the
    zygotes' start (another process each) overlaps those imports, and the service's first run comes sooner."""
    from handler import pid_one

    pid_one.front()  # a container's pid 1: an init in front of the service, which goes on in a child
    import gc

    # the start's imports make objects that live as long as the service: no collection walks them while they are
    # made (about a tenth of the imports' CPU); collections are back, those objects frozen, once the app is built
    gc.disable()
    from runtimes.linux import protections

    if os.environ.get("SANDLOT_BACKEND", "local") == "local":  # (the lambda backend's functions probe their own)
        protections.probe_ahead()  # a child probes the platform while this process loads its settings and code
    try:
        return _serve_probed(args)
    finally:
        collections_back()  # a start that stopped before the app was built
        protections.cancel_ahead()  # a start that stopped before its runtimes asked for the record (bad settings)


def collections_back() -> None:
    """The garbage collector on again after the start (serve), what the start made frozen: the first collections
    do not walk the modules and the app, which live as long as the process."""
    import gc

    if not gc.isenabled():
        gc.freeze()
        gc.enable()


def _serve_probed(args: argparse.Namespace) -> int:
    from handler import logs
    from handler.early_settings import early_settings
    from runtimes.linux import protections, syscalls

    overrides = {}
    if args.port is not None:
        overrides["SANDBOX_PORT"] = args.port
    if args.host is not None:
        overrides["SANDLOT_HOST"] = args.host
    # the runtimes start from what the environment says of them (early_settings.py), and the model loads while
    # their zygotes start (_serve); where that reading cannot vouch for a value, the model first, as before
    early = early_settings(**overrides)
    settings = None
    if early is None or early.SANDLOT_BACKEND != "local":
        settings = _checked_settings(overrides)
        if settings.SANDLOT_BACKEND != "local":
            protections.cancel_ahead()  # (the lambda backend's functions probe their own platform)
    start_from = early if settings is None else settings
    log_config = logs.configure(start_from.SANDLOT_LOG_FORMAT, start_from.SANDLOT_LOG_LEVEL)
    if settings is not None:
        _warn_of_keys(settings)
    try:
        listening = _listen(start_from.SANDLOT_HOST, start_from.SANDBOX_PORT)
    except OSError as exc:
        logging.getLogger("sandlot.api").error(
            "cannot listen on %s:%d: %s", start_from.SANDLOT_HOST, start_from.SANDBOX_PORT, exc
        )
        return 3  # uvicorn's STARTUP_FAILURE, as where uvicorn itself could not bind
    syscalls.set_dumpable(False)  # our /proc entries (environment, memory) belong to root from here on
    layers = None
    refused: dict[str, str] = {}
    build_at_start: set[str] = set()
    if start_from.SANDLOT_BACKEND == "local":  # the lambda backend's layers are baked into the functions' images
        layers = layer_manager(start_from)
        for language in layers.layers:
            try:
                if layers.wants_build(language):
                    # built as its runtime starts (pip's and npm's progress shown), while the service serves and the
                    # other runtimes and the web stack start: a first start's build no longer delays them
                    build_at_start.add(language)
                    continue
                layers.ensure(language)
            except Exception as exc:  # noqa: BLE001 - the service stays up: that language's runs say why
                refused[language] = f"the {language} layer could not be built: {type(exc).__name__}: {exc}"
                logging.getLogger("sandlot.layers").error("%s runs refused: %s", language, refused[language])
    import asyncio

    try:
        import uvloop  # uvicorn's own choice where it is installed (uvicorn[standard])

        loop_factory = uvloop.new_event_loop
    except ImportError:
        loop_factory = None
    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            serving = _serve(
                settings, layers, refused, log_config, start_from, overrides, listening, frozenset(build_at_start)
            )
            return runner.run(serving)
    finally:
        for sock in listening:
            sock.close()


def _listen(host: str, port: int) -> list:
    """The service's listening sockets, bound before anything else starts: a client that connects while the
    service starts waits in the backlog (as a request waits for a starting runtime) instead of being refused.
    Bound as uvicorn's own bind would (asyncio's create_server: every address the host resolves to, SO_REUSEADDR,
    IPv6 sockets v6-only, uvicorn's backlog); no process the service starts inherits them."""
    import socket

    found = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    sockets = []
    try:
        for family, kind, proto, _name, address in dict.fromkeys(found):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(2048)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def _checked_settings(overrides: dict) -> Settings:
    """The settings model, a random API_KEY where none is set; SettingsError where a value (or a key) is refused."""
    import secrets

    settings = load_settings(**overrides)
    if "API_KEY" not in settings.model_fields_set:  # unset (set but empty is refused below)
        settings.API_KEY = secrets.token_urlsafe(32)
        print(f"sandlot: API_KEY is not set; this run's key is {settings.API_KEY}", file=sys.stderr, flush=True)
    settings.check_keys()  # SettingsError: refused, one line on stderr (main)
    return settings


def _warn_of_keys(settings: Settings) -> None:
    if warning := settings.check_keys():  # a weak key the operator allowed (SANDLOT_ALLOW_INSECURE_API_KEY)
        logging.getLogger("sandlot.settings").warning("%s", warning)


def _import_web_stack() -> None:
    """What serving needs beyond the runtimes: Starlette, uvicorn and the app (in a thread, beside the start)."""
    import uvicorn  # noqa: F401
    import uvicorn.lifespan.on  # noqa: F401
    import uvicorn.protocols.http.auto  # noqa: F401

    import handler.app  # noqa: F401


def _model_then_web_stack(overrides: dict, marks: dict) -> Settings:
    """The settings model, then the web stack, in one thread: the second does not wait for the event loop, which
    the runtimes' start keeps busy meanwhile, to be handed over."""
    settings = _checked_settings(overrides)
    _warn_of_keys(settings)
    marks["settings model"] = since_exec()
    _import_web_stack()
    return settings


async def _serve(
    settings: Settings | None,
    layers: LayerManager | None,
    refused: dict[str, str],
    log_config,
    start_from=None,
    overrides: dict | None = None,
    listening: list | None = None,
    build_at_start: frozenset[str] = frozenset(),
) -> int:
    """The service; settings None: the runtimes start from start_from (early_settings.py) and the model loads
    meanwhile, its refusal stopping them before it ends the start."""
    import asyncio

    marks = {"settings": since_exec()}
    start_from = start_from or settings
    backend = starting = app = server = None
    if start_from.SANDLOT_BACKEND == "local":
        backend = local_backend(start_from, layers, refused, build_at_start)
        starting = asyncio.create_task(backend[0].start())  # the zygotes spawn while the web stack is imported
    try:
        if backend is not None:
            # the platform's probe forks children that run Python (runtimes/linux/protections.py): none may be
            # forked while another thread imports (a lock it holds, the loader's or a module's, would stay
            # held in the child); the runtimes' own ask waits for this record, then their zygotes are exec'ed.
            # Usually the record is there already: serve() had a child probe ahead, beside the settings' load
            from runtimes.linux.protections import platform_protections

            await asyncio.to_thread(platform_protections)
            marks["platform probed"] = since_exec()
        if settings is None:  # SettingsError: the finally below stops the runtimes, then main() says why
            settings = await asyncio.to_thread(_model_then_web_stack, overrides or {}, marks)
        else:
            await asyncio.to_thread(_import_web_stack)
        marks["web stack"] = since_exec()
        import uvicorn

        from handler.metrics import Metrics, start_separate_listener
        from handler.settings import parse_metrics_setting

        app = build_app(settings, layers, refused, backend, starting)
        collections_back()
        app.state.api.start_marks = marks
        metrics_mode, metrics_host, metrics_port = parse_metrics_setting(settings.SANDLOT_METRICS)
        if metrics_mode == "address":
            metrics: Metrics = app.state.metrics
            start_separate_listener(metrics, metrics_host, metrics_port)
            logging.getLogger("sandlot.metrics").info("metrics served on %s:%d/metrics", metrics_host, metrics_port)
        config = uvicorn.Config(
            app,
            host=settings.SANDLOT_HOST,
            port=settings.SANDBOX_PORT,
            log_config=log_config,
            log_level=settings.SANDLOT_LOG_LEVEL,
            access_log=False,
            lifespan="on",
            ws="none",  # no route speaks WebSocket: uvicorn's default would import the websockets package at start
            timeout_graceful_shutdown=10,
        )
        server = uvicorn.Server(config)
        if listening:  # bound at the start (_listen): uvicorn serves them, and logs nothing of them
            logging.getLogger("sandlot.api").info(
                "serving on http://%s:%d", settings.SANDLOT_HOST, settings.SANDBOX_PORT, extra={"listening": True}
            )
        await server.serve(sockets=listening or None)
    finally:
        if backend is not None and (app is None or not app.state.api.stopped):  # the app's lifespan never ran
            if not starting.done():
                starting.cancel()
                # its end first: a zygote it was starting is killed before what it starts on (its tree's mount
                # point) is taken down by the stop below, not left to fail with a traceback on a refused start
                await asyncio.wait([starting])
            await backend[0].stop()
    return 0 if server.started else 3  # uvicorn.run's STARTUP_FAILURE where it could not start


def build_layers(args: argparse.Namespace) -> int:
    layers = layer_manager(load_settings())
    for language in layers.layers:
        if args.language in (language, "all"):
            print(layers.ensure(language))
    return 0


def build_trees(args: argparse.Namespace) -> int:
    """The chroot jail's trees for the layers in use, and their layer-less ones, with their cells, into an image
    (the service image's Dockerfile): a container of the image then copies none at start, and only an operator's
    layer where it has one (the runtime's build_image_tree)."""
    settings = load_settings()
    layers = layer_manager(settings)
    for language in layers.layers:
        layers.ensure(language)
    config = _runtime_config(settings, layers)
    for language in LANGUAGES:
        runtime = language.runtime_class()(config)
        if runtime.missing():
            continue
        for path, built in runtime.build_image_tree(args.into or "", args.slots or 0):
            print(f"{language.wire_name}: {path}{'' if built else ' (there already)'}")
    return 0


# ---- sandlot run ---------------------------------------------------------------------------------------------------

EXTENSIONS = {suffix: language.wire_name for language in LANGUAGES for suffix in language.extensions}
SANDBOX_FAILED = 125  # the sandbox, not the code, failed (docker run's convention)
TIMED_OUT = 124  # timeout(1)'s convention


def _default_url() -> str:
    port = os.environ.get("SANDBOX_PORT", "8194")
    return os.environ.get("SANDLOT_URL", f"http://127.0.0.1:{port}")


def _api_key() -> str:
    return os.environ.get("API_KEY") or load_settings().API_KEY


def _run_request(args: argparse.Namespace) -> dict:
    from handler.settings import SettingsError

    language = args.language or EXTENSIONS.get(Path(args.file).suffix.lower())
    if language is None:
        raise SettingsError(f"cannot tell the language of {args.file!r}: give --language {'|'.join(WIRE_NAMES)}")
    try:
        code = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
    except OSError as exc:
        raise SettingsError(f"cannot read {args.file}: {exc.strerror}") from exc
    request = {"language": language, "code": code, "enable_network": bool(args.network)}
    if args.timeout is not None:
        request["timeout"] = args.timeout
    if args.memory is not None:
        request["memory_limit_mb"] = args.memory
    if args.stdin is not None:
        try:
            request["stdin"] = Path(args.stdin).read_text() if args.stdin != "-" else sys.stdin.read()
        except OSError as exc:
            raise SettingsError(f"cannot read {args.stdin}: {exc.strerror}") from exc
    return request


def _print_result(envelope: dict) -> int:
    """Write the run's streams as they were; the run's exit code, or 125 when the sandbox refused."""
    from runtimes.payload import RunOutcome

    if envelope.get("code") != 0 or not isinstance(envelope.get("data"), dict):
        print(f"sandlot: {envelope.get('message') or envelope}", file=sys.stderr)
        return SANDBOX_FAILED
    data = envelope["data"]
    sys.stdout.write(data.get("stdout", ""))
    sys.stdout.flush()
    sys.stderr.write(data.get("stderr", ""))
    exit_code = data.get("exit_code", 1)
    if exit_code != 0:
        own = data.get("error", "").replace(data.get("stderr", ""), "").strip()
        if own:
            print(f"sandlot: {own}", file=sys.stderr)
    sys.stderr.flush()
    if data.get("outcome") == RunOutcome.TIMEOUT:
        return TIMED_OUT
    return exit_code if 0 <= exit_code <= 255 else 1


def run_file(args: argparse.Namespace) -> int:
    request = _run_request(args)
    if args.local:
        return _print_result(_run_locally(request))
    import httpx

    try:
        response = httpx.post(
            args.url.rstrip("/") + "/v1/sandbox/run",
            json=request,
            headers={"X-Api-Key": _api_key()},
            timeout=(args.timeout or 60) + 30,
        )
    except httpx.HTTPError as exc:
        print(f"sandlot: cannot reach {args.url}: {exc}", file=sys.stderr)
        return SANDBOX_FAILED
    if response.status_code == 401:
        print("sandlot: the service refused the key (set API_KEY)", file=sys.stderr)
        return SANDBOX_FAILED
    try:
        envelope = response.json()
    except ValueError:
        print(f"sandlot: HTTP {response.status_code}: {response.text[:200]}", file=sys.stderr)
        return SANDBOX_FAILED
    return _print_result(envelope)


def _run_locally(request: dict) -> dict:
    """The run through this machine's runtimes, in this process: the service's run path, jail and result."""
    import asyncio

    from handler import run_path
    from runtimes.linux import syscalls

    settings = load_settings()
    syscalls.set_dumpable(False)
    with _captured_output() as machinery:  # layer builds and runtime logs stay out of the run's streams
        reply = asyncio.run(run_path.run(request, settings.ENABLE_NETWORK, lambda body: _invoke_once(settings, body)))
        if reply.body["code"] == -500:
            machinery.seek(0)
            reply.body["message"] = f"{reply.body['message']}\n{machinery.read()[-2000:]}".strip()
    return reply.body


async def _invoke_once(settings: Settings, request) -> RunResult:
    """Start the request's runtime (building its layer if missing), run once, stop."""
    import asyncio

    from handler.local_invoker import LocalInvoker
    from layers.store import LayerBuildError
    from runtimes.payload import Unavailable

    layers = layer_manager(settings)
    try:
        if request.language in layers.layers:
            await asyncio.to_thread(layers.ensure, request.language)
    except LayerBuildError as exc:
        raise Unavailable(f"could not build the dependency layer: {exc}") from exc
    invoker = LocalInvoker({request.language: _runtime(settings, layers, request.language)})
    await invoker.start()
    try:
        if not invoker.ready():
            status = invoker.status()[request.language]
            raise Unavailable(status.get("error") or f"the {request.language} runtime did not start")
        return await invoker.invoke(request)
    finally:
        await invoker.stop()


def _runtime(settings: Settings, layers: LayerManager, language: str):
    config = _runtime_config(settings, layers)
    config.one_run_at_a_time = True  # the serial schedule: one run, and nothing of it left when this returns
    return by_wire_name(language).runtime_class()(config)


@contextmanager
def _captured_output():
    """fds 1 and 2 (child processes' too) go to a temporary file inside the block; yields it for reading."""
    import tempfile

    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with tempfile.TemporaryFile("w+", errors="replace") as capture:
        os.dup2(capture.fileno(), 1)
        os.dup2(capture.fileno(), 2)
        try:
            yield capture
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def _add_run(commands) -> None:
    cmd = commands.add_parser("run", help="run a file in the sandbox; its output as it was, its exit code")
    cmd.add_argument("file", help="the code (`-`: read it from stdin)")
    cmd.add_argument("--language", choices=list(WIRE_NAMES), help="default: from the file's extension")
    cmd.add_argument(
        "--url", default=_default_url(), help="the service (default SANDLOT_URL or 127.0.0.1:SANDBOX_PORT)"
    )
    cmd.add_argument("--timeout", type=float, default=None, help="seconds (default: the service's)")
    cmd.add_argument("--memory", type=int, default=None, help="memory limit, MB (default: the service's)")
    cmd.add_argument("--stdin", default=None, help="a file handed to the run as its stdin")
    cmd.add_argument("--network", action=argparse.BooleanOptionalAction, default=False, help="allow network")
    cmd.add_argument("--local", action="store_true", help="run through this machine's runtimes, without a service")
    cmd.set_defaults(func=run_file)


# ---- sandlot health ------------------------------------------------------------------------------------------------


def health(args: argparse.Namespace) -> int:
    """Readiness and the protections in force; 0 only when ready."""
    import httpx

    base = args.url.rstrip("/")
    try:
        ready = httpx.get(base + "/health", timeout=10)
    except httpx.HTTPError as exc:
        print(f"unreachable: {base}: {exc}")
        return 1
    print(f"{'ready' if ready.status_code == 200 else 'not ready'} ({base}/health: HTTP {ready.status_code})")
    key = os.environ.get("API_KEY", "")
    if key:
        try:
            detail = httpx.get(base + "/v1/sandbox/health", headers={"X-Api-Key": key}, timeout=10)
            data = detail.json().get("data") or {} if detail.status_code == 200 else {}
        except (httpx.HTTPError, ValueError):
            data = {}
        for language, state in sorted((data.get("runtimes") or {}).items()):
            protections = state.get("protections") or {}
            listed = ", ".join(k if v is True else f"{k}={v}" for k, v in protections.items() if v)
            missing = ", ".join(k for k, v in protections.items() if not v)
            print(f"{language}: {'ready' if state.get('ready') else 'not ready'}")
            print(f"  in force: {listed or '-'}")
            print(f"  missing:  {missing or '-'}")
            if state.get("error"):
                print(f"  error:    {state['error']}")
    else:
        print("(set API_KEY to see the protections in force)")
    return 0 if ready.status_code == 200 else 1


def _add_health(commands) -> None:
    cmd = commands.add_parser("health", help="is the service ready, and which protections are in force")
    cmd.add_argument(
        "--url", default=_default_url(), help="the service (default SANDLOT_URL or 127.0.0.1:SANDBOX_PORT)"
    )
    cmd.set_defaults(func=health)


# ---- sandlot packages ----------------------------------------------------------------------------------------------

BUILD_FAILED = 1


def _admin_key() -> str:
    """The key of the package routes: SANDLOT_ADMIN_KEY where set, else API_KEY (environment, then settings)."""
    key = os.environ.get("SANDLOT_ADMIN_KEY") or os.environ.get("API_KEY")
    if key:
        return key
    settings = load_settings()
    return settings.SANDLOT_ADMIN_KEY or settings.API_KEY


class _Refused(Exception):
    """The service refused or could not be reached: the message to print."""


def _call(args: argparse.Namespace, method: str, path: str, **kwargs) -> dict:
    import httpx

    headers = {"X-Api-Key": _admin_key()}
    try:
        response = httpx.request(method, args.url.rstrip("/") + path, headers=headers, timeout=60, **kwargs)
    except httpx.HTTPError as exc:
        raise _Refused(f"cannot reach {args.url}: {exc}") from exc
    if response.status_code == 401:
        raise _Refused("the service refused the key (set SANDLOT_ADMIN_KEY, or API_KEY where no admin key is set)")
    try:
        envelope = response.json()
    except ValueError:
        raise _Refused(f"HTTP {response.status_code}: {response.text[:200]}") from None
    if not isinstance(envelope, dict) or envelope.get("code") != 0:
        message = envelope.get("message") if isinstance(envelope, dict) else envelope
        raise _Refused(str(message))
    return envelope.get("data") or {}


def _show_list(data: dict) -> None:
    rows = data.get("packages") or []
    if not data.get("editable"):
        print(f"# {data.get('message', '')}")
    if data.get("error"):
        print(f"# {data['error']}")
    width = max([len(row["name"]) for row in rows] + [4])
    wide = max([len(row.get("version") or "-") for row in rows] + [7])
    print(f"{'name':<{width}}  {'version':<{wide}}  {'from':<10}  requested")
    for row in rows:
        pending = row.get("pending")
        note = f"  (pending: {pending['op']} {pending.get('spec') or ''}, build {pending['build']})" if pending else ""
        version, requested = row.get("version") or "-", row.get("requested") or ""
        print(f"{row['name']:<{width}}  {version:<{wide}}  {row['kind']:<10}  {requested}{note}".rstrip())


def _follow(args: argparse.Namespace, build_id: int, ours: set[str], offset: int = 0) -> int:
    """Print a build's log as it comes (polling every args.poll seconds). Where a build of several changes
    failed and each was retried alone, follow the retries that carry ours. 0 when every change of ours landed,
    1 when one did not."""
    import time

    while True:
        data = _call(args, "GET", f"/v1/sandlot/builds/{build_id}", params={"offset": offset})
        for line in data["log"]["lines"]:
            print(line, flush=True)
        offset = data["log"]["next_offset"]
        if data["state"] == "succeeded":
            print(f"sandlot: build {build_id} succeeded; the {data['language']} runtime serves {data['layer']}")
            return 0
        if data["state"] == "failed":
            break
        time.sleep(args.poll)
    retries = []
    for retry in data.get("retried_in") or []:
        changes = _call(args, "GET", f"/v1/sandlot/builds/{retry}", params={"tail": 0}).get("changes") or []
        carried = ours & {change.get("id") for change in changes}
        if carried:
            retries.append((retry, carried))
    if not retries:
        print(f"sandlot: build {build_id} failed; the old layer keeps serving: {data['error']}", file=sys.stderr)
        return BUILD_FAILED
    listed = ", ".join(str(retry) for retry, _ in retries)
    print(f"sandlot: build {build_id} failed; each change is retried alone: builds {listed}")
    return max(_follow(args, retry, carried) for retry, carried in retries)


def packages_command(args: argparse.Namespace) -> int:
    try:
        if args.packages_command == "list":
            data = _call(args, "GET", "/v1/sandlot/packages", params={"language": args.language})
            if args.json:
                import json

                print(json.dumps(data, indent=2))
            else:
                _show_list(data)
            return 0
        if args.packages_command == "build-log":
            return _build_log(args)
        if args.packages_command == "add":
            data = _call(args, "POST", "/v1/sandlot/packages", json={"language": args.language, "specs": args.specs})
        else:
            params = [("language", args.language), *(("name", name) for name in args.names)]
            data = _call(args, "DELETE", "/v1/sandlot/packages", params=params)
        build = data["build"]
        print(f"sandlot: build {build['id']} ({build['language']}): {build['state']}", file=sys.stderr)
        if args.no_wait:
            return 0
        return _follow(args, build["id"], {change["id"] for change in data["changes"]})
    except _Refused as exc:
        print(f"sandlot: {exc}", file=sys.stderr)
        return SANDBOX_FAILED


def _build_log(args: argparse.Namespace) -> int:
    path = f"/v1/sandlot/builds/{args.id}" if args.id else "/v1/sandlot/builds/latest"
    data = _call(args, "GET", path, params={"language": args.language, "tail": args.tail})
    for line in data["log"]["lines"]:
        print(line)
    if args.follow and data["state"] not in ("succeeded", "failed"):
        ours = {change.get("id") for change in data.get("changes") or []}
        return _follow(args, data["id"], ours, data["log"]["next_offset"])
    print(f"sandlot: build {data['id']} ({data['language']}, {data['trigger']}): {data['state']}")
    if data.get("error"):
        print(f"sandlot: error: {data['error']}", file=sys.stderr)
    return BUILD_FAILED if data["state"] == "failed" else 0


def _add_packages(commands) -> None:
    cmd = commands.add_parser("packages", help="list, add and remove the packages of the service's layers")
    sub = cmd.add_subparsers(dest="packages_command", required=True)

    def common(parser) -> None:
        parser.add_argument(
            "--url", default=_default_url(), help="the service (default SANDLOT_URL or 127.0.0.1:SANDBOX_PORT)"
        )
        parser.add_argument("--language", "-l", choices=list(WIRE_NAMES), default=DEFAULT.wire_name)
        parser.set_defaults(func=packages_command, poll=0.5)

    listing = sub.add_parser("list", help="the packages of a layer: version, requested spec, base file or not")
    common(listing)
    listing.add_argument("--json", action="store_true", help="as JSON")
    add = sub.add_parser("add", help="add packages (pip requirements or npm specs) and follow the build")
    common(add)
    add.add_argument("specs", nargs="+", help="e.g. six==1.16.0, 'requests>=2.31,<3', is-number@^7.0.0")
    add.add_argument("--no-wait", action="store_true", help="print the build's id and return at once")
    remove = sub.add_parser("remove", help="remove added packages and follow the build")
    common(remove)
    remove.add_argument("names", nargs="+")
    remove.add_argument("--no-wait", action="store_true", help="print the build's id and return at once")
    log = sub.add_parser("build-log", help="the log of the running, else last, build (exit 1 if it failed)")
    common(log)
    log.add_argument("--id", type=int, default=None, help="a build by its id (default: the language's latest)")
    log.add_argument("--tail", type=int, default=200, help="lines of the log to show (default 200)")
    log.add_argument("--follow", "-f", action="store_true", help="keep printing until the build ends")


# ---- sandlot config ------------------------------------------------------------------------------------------------


def show_config(args: argparse.Namespace) -> int:
    from handler.settings_report import settings_in_force

    rows = settings_in_force()
    if args.json:
        import json

        print(json.dumps(rows, indent=2))
        return 0
    width = max(len(row["name"]) for row in rows)
    for row in rows:
        print(f"{row['name']:<{width}}  {row['value']!s:<40}  ({row['source']})")
    return 0


def _add_config(commands) -> None:
    cmd = commands.add_parser("config", help="the settings in force and where each came from (secrets masked)")
    cmd.add_argument("--json", action="store_true", help="as JSON")
    cmd.set_defaults(func=show_config)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sandlot", description="Run untrusted Python and Node.js code.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve_cmd = commands.add_parser("serve", help="start the HTTP service (SANDLOT_BACKEND: local, or lambda)")
    serve_cmd.add_argument("--host", default=None, help="address to bind (default SANDLOT_HOST or 0.0.0.0)")
    serve_cmd.add_argument("--port", type=int, default=None, help="port (default SANDBOX_PORT or 8194)")
    serve_cmd.set_defaults(func=serve)
    layers_cmd = commands.add_parser("layers", help="dependency layers")
    layer_commands = layers_cmd.add_subparsers(dest="layers_command", required=True)
    build_cmd = layer_commands.add_parser("build", help="build the dependency layers (shows pip's and npm's progress)")
    build_cmd.add_argument("--language", choices=[*WIRE_NAMES, "all"], default="all")
    build_cmd.set_defaults(func=build_layers)
    trees_cmd = layer_commands.add_parser(
        "trees",
        help="build the chroot jail's trees for the layers in use, and the layer-less ones an operator's layer is "
        "added to, with their cells, into an image",
    )
    trees_cmd.add_argument("--into", default=None, help="where (default /opt/sandlot/image-trees, the image's)")
    trees_cmd.add_argument("--slots", type=int, default=None, help="cells per tree (default 16)")
    trees_cmd.set_defaults(func=build_trees)
    _add_run(commands)
    _add_health(commands)
    _add_config(commands)
    _add_packages(commands)
    args = parser.parse_args(argv)
    quiet = args.command in ("run", "health", "config", "packages")  # their output is the answer, not a log
    logging.basicConfig(
        level=logging.WARNING if quiet else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return args.func(args)
    except ValueError as exc:  # SettingsError, and LayerBuildError below, imported only once raised
        from handler.settings import SettingsError

        if not isinstance(exc, SettingsError):
            raise
        print(f"sandlot: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        from layers.store import LayerBuildError

        if not isinstance(exc, LayerBuildError):
            raise
        print(f"sandlot: could not build the dependency layer: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
