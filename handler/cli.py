"""The `sandlot` command: serve the API, build dependency layers."""

from __future__ import annotations

import argparse
import logging
import secrets
import sys

from handler.settings import Settings, SettingsError, load_settings
from layers import build as layers


def _python_layer(settings: Settings, quiet: bool = False) -> str:
    requirements = layers.python_requirements(settings.SANDLOT_PYTHON_REQUIREMENTS)
    target = layers.python_layer_dir(settings.SANDLOT_DATA_DIR, requirements, settings.PYTHON_PATH)
    return str(layers.build_python_layer(requirements, target, settings.PIP_MIRROR_URL, quiet=quiet))


def build_app(settings: Settings, python_layer: str):
    """The app with the invoker the settings ask for."""
    from handler.app import create_app
    from handler.invoker import LocalInvoker
    from runtimes.nodejs.runtime import NodeRuntime
    from runtimes.python.runtime import PythonRuntime

    if settings.SANDLOT_BACKEND != "local":
        raise SettingsError("SANDLOT_BACKEND: only 'local' is available in this version")
    config = settings.runtime_config(python_layer=python_layer)
    invoker = LocalInvoker({"python3": PythonRuntime(config), "nodejs": NodeRuntime(config)})
    return create_app(settings, invoker, python_layer)


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from runtimes.jail import linux

    overrides = {}
    if args.port is not None:
        overrides["SANDBOX_PORT"] = args.port
    if args.host is not None:
        overrides["SANDLOT_HOST"] = args.host
    settings = load_settings(**overrides)
    if not settings.API_KEY:
        settings.API_KEY = secrets.token_urlsafe(32)
        print(f"sandlot: API_KEY is not set; this run's key is {settings.API_KEY}", file=sys.stderr, flush=True)
    linux.set_dumpable(False)  # our /proc entries (environment, memory) belong to root from here on
    app = build_app(settings, _python_layer(settings))
    uvicorn.run(
        app,
        host=settings.SANDLOT_HOST,
        port=settings.SANDBOX_PORT,
        log_level="info",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=10,
    )
    return 0


def build_layers(args: argparse.Namespace) -> int:
    settings = load_settings()
    if args.language in ("python3", "all"):
        print(_python_layer(settings))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sandlot", description="Run untrusted Python and Node.js code.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve_cmd = commands.add_parser("serve", help="start the HTTP service (local backend)")
    serve_cmd.add_argument("--host", default=None, help="address to bind (default SANDLOT_HOST or 0.0.0.0)")
    serve_cmd.add_argument("--port", type=int, default=None, help="port (default SANDBOX_PORT or 8194)")
    serve_cmd.set_defaults(func=serve)
    layers_cmd = commands.add_parser("layers", help="dependency layers")
    layer_commands = layers_cmd.add_subparsers(dest="layers_command", required=True)
    build_cmd = layer_commands.add_parser("build", help="build the dependency layer (shows pip's progress)")
    build_cmd.add_argument("--language", choices=["python3", "all"], default="all")
    build_cmd.set_defaults(func=build_layers)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except SettingsError as exc:
        print(f"sandlot: {exc}", file=sys.stderr)
        return 2
    except layers.LayerBuildError as exc:
        print(f"sandlot: could not build the dependency layer: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
