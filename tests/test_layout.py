"""The layout's rules, read from the imports (docs/architecture.md, "The rooms"): no circle, and each room
imports only what lies below it.

    runtimes/linux     the kernel's mechanisms: imports nothing of the jail, the layers or the handler
    runtimes/jail      policy/, service/, tmp/, trees/, zygote/: the service's side never imports the zygote's,
                       the zygote's never imports the service's, its /tmp caps or its trees
    layers/            builds confined with runtimes/linux, never with the jail
    handler/           the API: talks to runtimes through the contract only (tests/test_contract.py)

Every import counts, a lazy one inside a function too: it is a dependency all the same, only a later one. Only
those under `if TYPE_CHECKING:` do not: they never run.
"""

from __future__ import annotations

import ast
import collections
import functools
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("handler", "runtimes", "layers")
# the files every language folder has (its contract: runtimes/languages.py names them), and the API function's
# awslambdaric handler, whose string must not move: a name they share is the same role, not a homonym
LANGUAGE_FOLDERS = ("runtimes/python", "runtimes/nodejs")
SHARED_ROLES = {"__init__.py", "runtime.py", "runner.py", "runner_config.py", "lambda_function.py", "layer.py"}
# the wire models (pydantic, for validation and the OpenAPI schema) of the run contract's plain records: one thing
# in two forms, kept field for field equal by tests/test_contract.py, not two things under one name
TWINS = ("runtimes/run_models.py", "runtimes/payload.py")


def _modules() -> dict[str, str]:
    found = {}
    for package in PACKAGES:
        for directory, dirnames, filenames in os.walk(os.path.join(ROOT, package)):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            for filename in filenames:
                if filename.endswith(".py"):
                    path = os.path.join(directory, filename)
                    name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                    found[name.removesuffix(".__init__")] = path
    return found


@functools.cache
def graph() -> dict[str, set[str]]:
    """Each module of the project -> the project's modules it imports (a name imported from a package that is a
    module of its own counts as that module)."""
    modules = _modules()
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        with open(path) as f:
            tree = ast.parse(f.read())
        targets = set()
        for node in _executed(tree):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    targets.add(full if full in modules else node.module)
        edges[name] = {t for t in targets if t in modules and t != name and modules[t].endswith(".py")}
        edges[name] = {t for t in edges[name] if not modules[t].endswith("__init__.py") or _has_code(modules[t])}
    return edges


def _executed(tree: ast.AST):
    """Every node but those under `if TYPE_CHECKING:`, whose imports never run (annotations only)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (n for child in node.orelse for n in [child, *_executed(child)])
            continue
        yield node
        yield from _executed(node)


def _has_code(path: str) -> bool:
    with open(path) as f:
        return bool(f.read().strip())


def _under(module: str, room: str) -> bool:
    return module == room or module.startswith(room + ".")


def _crossings(source_room: str, *target_rooms: str) -> dict[str, list[str]]:
    return {
        module: sorted(t for t in targets if any(_under(t, room) for room in target_rooms))
        for module, targets in sorted(graph().items())
        if _under(module, source_room) and any(_under(t, room) for room in target_rooms for t in targets)
    }


def _circles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    edges = graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_no_import_circle():
    assert _circles() == []


def test_the_layers_import_nothing_of_the_jail():
    """Builds are confined with the kernel's mechanisms (runtimes/linux), not with the jail's code."""
    assert _crossings("layers", "runtimes.jail") == {}


def test_the_linux_mechanisms_import_nothing_of_the_jail_the_layers_or_the_handler():
    assert _crossings("runtimes.linux", "runtimes.jail", "layers", "handler") == {}


def test_the_service_side_never_imports_the_zygote_side():
    """The service starts the zygote as a process: it speaks to it through jail/protocol.py and the zygote's
    config record, never by importing its code (which would load the zygote's modules into the service)."""
    assert _crossings("runtimes.jail.service", "runtimes.jail.zygote") == {}


def test_the_zygote_side_imports_nothing_of_the_service_its_tmp_caps_or_its_trees():
    """Every page the zygote touches is copied on each fork: it loads what its children run, nothing else."""
    assert _crossings("runtimes.jail.zygote", "runtimes.jail.service", "runtimes.jail.tmp", "runtimes.jail.trees") == {}


def test_the_jail_imports_nothing_of_the_handler_or_the_layers():
    assert _crossings("runtimes.jail", "handler", "layers") == {}


def _names() -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    modules: dict[str, list[str]] = collections.defaultdict(list)
    classes: dict[str, list[str]] = collections.defaultdict(list)
    for path in _modules().values():
        relative = os.path.relpath(path, ROOT)
        in_language = os.path.dirname(relative) in LANGUAGE_FOLDERS
        if not (os.path.basename(path) in SHARED_ROLES and (in_language or relative == "handler/lambda_function.py")):
            modules[os.path.basename(path)].append(relative)
        with open(path) as f:
            for node in ast.walk(ast.parse(f.read())):
                if isinstance(node, ast.ClassDef) and not in_language:
                    classes[node.name].append(relative)
    for paths in classes.values():
        if sorted(paths) == sorted(TWINS):
            paths.remove(TWINS[0])
    return modules, classes


def test_no_two_modules_share_a_name():
    """A module's name says what it is: two rooms' modules of one name are two different things under one name.
    (A language folder's files share their names with the other languages': the same roles.)"""
    modules, _ = _names()
    assert {name: paths for name, paths in modules.items() if len(paths) > 1 and name != "__init__.py"} == {}


def test_no_two_classes_share_a_name():
    _, classes = _names()
    assert {name: paths for name, paths in classes.items() if len(paths) > 1} == {}


def test_every_directory_of_code_is_a_package_that_the_wheel_takes():
    """pyproject.toml finds packages instead of listing them: a directory of modules without an __init__.py would
    be left out of the wheel (and of the images, which pip-install it) without a word."""
    missing = []
    for package in PACKAGES:
        for directory, dirnames, filenames in os.walk(os.path.join(ROOT, package)):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            if any(f.endswith(".py") for f in filenames) and "__init__.py" not in filenames:
                missing.append(os.path.relpath(directory, ROOT))
    assert missing == []
