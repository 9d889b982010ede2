"""The `sandlot` command: serve the API, build dependency layers."""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import sys
from pathlib import Path

from handler.settings import Settings, SettingsError, load_settings
from layers import nodejs as node_layer
from layers import python as python_layer
from layers.manager import Layer, LayerManager
from layers.store import LayerBuildError, LayerStore


def layer_manager(settings: Settings) -> LayerManager:
    """The Python and Node.js layer stores, as the settings describe them."""
    data = Path(settings.SANDLOT_DATA_DIR) / "layers"
    python = os.path.realpath(settings.PYTHON_PATH)
    node = os.path.realpath(settings.NODEJS_PATH)
    requirements = lambda: python_layer.requirements_file(settings.SANDLOT_PYTHON_REQUIREMENTS)  # noqa: E731
    packages = lambda: node_layer.package_files(settings.SANDLOT_NODEJS_PACKAGE)  # noqa: E731
    python_store = LayerStore(
        data / "python",
        sources=lambda: [requirements()],
        build=lambda scratch: python_layer.build(
            requirements(), scratch, settings.build_uid, settings.PIP_MIRROR_URL, settings.SANDLOT_PIP_FIND_LINKS
        ),
        salt=python,
    )
    node_store = LayerStore(
        data / "nodejs",
        sources=packages,
        build=lambda scratch: node_layer.build(packages(), scratch, node, settings.build_uid),
        salt=node,
    )
    layers = {"python3": Layer(python_store, python_layer.installed)}
    if os.access(node, os.X_OK):
        layers["nodejs"] = Layer(node_store, node_layer.installed)
    return LayerManager(layers)


def build_app(settings: Settings, layers: LayerManager | None):
    """The app with the invoker the settings ask for."""
    from handler.app import create_app

    if settings.SANDLOT_BACKEND == "lambda":
        from handler.lambda_invoker import LambdaInvoker

        return create_app(settings, LambdaInvoker.from_settings(settings))
    from handler.local_invoker import LocalInvoker
    from runtimes.nodejs.runtime import NodeRuntime
    from runtimes.python.runtime import PythonRuntime

    config = settings.runtime_config(python_layer=layers.current("python3"), nodejs_layer=layers.current("nodejs"))
    runtimes = {"python3": PythonRuntime(config), "nodejs": NodeRuntime(config)}
    invoker = LocalInvoker(runtimes, layers, settings.PYTHON_DEPS_UPDATE_INTERVAL)
    return create_app(settings, invoker)


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
    layers = None
    if settings.SANDLOT_BACKEND == "local":  # the lambda backend's layers are baked into the functions' images
        layers = layer_manager(settings)
        for language in layers.layers:
            layers.ensure(language)  # builds on first start, showing pip's and npm's progress
    app = build_app(settings, layers)
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
    layers = layer_manager(load_settings())
    for language in layers.layers:
        if args.language in (language, "all"):
            print(layers.ensure(language))
    return 0


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
    build_cmd.add_argument("--language", choices=["python3", "nodejs", "all"], default="all")
    build_cmd.set_defaults(func=build_layers)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except SettingsError as exc:
        print(f"sandlot: {exc}", file=sys.stderr)
        return 2
    except LayerBuildError as exc:
        print(f"sandlot: could not build the dependency layer: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
