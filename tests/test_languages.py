"""The language registry (runtimes/languages.py): the one place outside a language's own folder that names it,
and every path of a record names something real."""

import ast
import dataclasses
import importlib
import importlib.util
import os

import pytest

from runtimes import languages
from runtimes.languages import LANGUAGES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCANNED = ("handler", "layers", "runtimes")
# where a language may be spelled: the registry, and each language's own folder (tests/ and docs/ are not scanned)
ALLOWED = ("runtimes/languages.py", *(f"runtimes/{language.folder}/" for language in LANGUAGES))
NAMES = {name for language in LANGUAGES for name in (language.wire_name, language.folder)}


def _sources():
    for top in SCANNED:
        for directory, _dirs, files in os.walk(os.path.join(ROOT, top)):
            for name in sorted(files):
                if name.endswith(".py"):
                    path = os.path.relpath(os.path.join(directory, name), ROOT)
                    if not path.startswith(ALLOWED):
                        yield path


def spelled_names(source: str) -> list[tuple[int, str]]:
    """(line, name) of each string constant, f-strings' literal parts included, that is a language's name."""
    return [
        (node.lineno, node.value)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in NAMES
    ]


def test_the_scan_finds_what_it_looks_for():
    source = 'x = "python3"\ny = {"nodejs": 1}\nz = f"{a}" f"python"\nw = ("python3 runs", "node")\n'
    assert sorted(spelled_names(source)) == [(1, "python3"), (2, "nodejs"), (3, "python")]


def test_only_the_registry_and_the_language_folders_spell_a_language():
    spelled = []
    for path in _sources():
        with open(os.path.join(ROOT, path)) as f:
            spelled += [f"{path}:{line}: {name!r}" for line, name in spelled_names(f.read())]
    assert spelled == [], "read the record (runtimes/languages.py) instead:\n" + "\n".join(spelled)


def test_the_records_are_one_each_with_one_default():
    assert len({language.wire_name for language in LANGUAGES}) == len(LANGUAGES)
    assert len({language.folder for language in LANGUAGES}) == len(LANGUAGES)
    assert [language for language in LANGUAGES if language.default] == [languages.DEFAULT]
    suffixes = [suffix for language in LANGUAGES for suffix in language.extensions]
    assert len(set(suffixes)) == len(suffixes)
    assert tuple(language.wire_name for language in LANGUAGES) == languages.WIRE_NAMES
    for language in LANGUAGES:
        assert dataclasses.is_dataclass(language) and languages.by_wire_name(language.wire_name) is language
        for suffix in language.extensions:
            assert languages.by_extension(suffix) is language
    assert not languages.is_known(["python3"]) and not languages.is_known("ruby")


def _module_defines(module: str, name: str) -> bool:
    """Whether a module's source defines `name` at its top level, without importing it (a Lambda handler's module
    runs the function's init when imported)."""
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, module
    with open(spec.origin) as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return True
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name == name:
            return True
    return False


@pytest.mark.parametrize("language", LANGUAGES, ids=lambda language: language.wire_name)
def test_each_records_paths_name_real_things(language):
    from handler.settings import Settings
    from runtimes.config import RuntimeConfig
    from runtimes.function.environment import FIELDS
    from runtimes.function.environment_model import FunctionEnvironment
    from runtimes.function.function_config import baked_layer
    from runtimes.jail.service.runtime import JailedRuntime

    folder = f"runtimes.{language.folder}."
    runtime = language.runtime_class()
    assert issubclass(runtime, JailedRuntime) and language.runtime.startswith(folder)
    assert importlib.util.find_spec(language.runner) is not None and language.runner.startswith(folder)
    module, _, function = language.lambda_handler.rpartition(".")
    assert module.startswith(folder) and _module_defines(module, function)
    with open(os.path.join(ROOT, "runtimes", language.folder, "Dockerfile")) as f:
        assert f'CMD ["{language.lambda_handler}"]' in f.read()
    layer = language.layer_module()
    assert language.layer.startswith(folder)
    for name in ("build", "installed", "base_names", "managed_layer"):
        assert callable(getattr(layer, name)), name
    assert language.default_base_file().is_file()
    assert language.default_base_file() == languages.ROOT / "layers" / language.folder / os.path.basename(
        language.base_file
    )
    assert language.packages in ("pip", "npm")
    config = {field.name for field in dataclasses.fields(RuntimeConfig)}
    assert {language.config_path, language.config_layer} <= config
    assert language.path_setting in FunctionEnvironment.model_fields and language.path_setting in FIELDS
    assert language.layer_setting in FunctionEnvironment.model_fields
    assert FIELDS[language.layer_setting][1] == FunctionEnvironment.model_fields[language.layer_setting].default
    assert baked_layer(language).endswith(f"/layers/{language.folder}")
    assert {language.base_file_setting, language.lambda_function_setting, language.path_setting} <= set(
        Settings.model_fields
    )


def test_importing_the_registry_imports_no_runtime():
    """The registry is read on every cold path: importing it loads no runtime, layer build or pydantic."""
    import subprocess
    import sys

    script = (
        "import sys, runtimes.languages\n"
        "heavy = [m for m in sys.modules if m.startswith(('pydantic', 'runtimes.python', 'runtimes.nodejs', "
        "'runtimes.jail', 'layers'))]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, cwd=ROOT)
