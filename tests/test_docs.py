"""The docs site: its generated pages follow the code, it builds strictly, and it documents the product.

The configuration reference and the command line's help are rendered by docs/gen_reference.py from the settings
models and from `sandlot`'s parser; these tests fail when a page and what the script renders now differ.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from handler.settings import Settings
from runtimes.function.environment_model import FunctionEnvironment
from runtimes.runtime_settings import JAIL_MODES

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _generator():
    spec = importlib.util.spec_from_file_location("gen_reference", DOCS / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = _generator()


@pytest.mark.parametrize("page", ["configuration.md", "cli.md"])
def test_the_generated_part_is_what_the_code_gives_now(page):
    path = DOCS / page
    assert gen.rendered(path) == path.read_text(), "run: python docs/gen_reference.py"


def test_every_setting_of_every_model_is_in_the_reference():
    page = (DOCS / "configuration.md").read_text()
    names = set(Settings.model_fields) | set(FunctionEnvironment.model_fields)
    missing = [name for name in sorted(names) if f"#### `{name}`" not in page]
    assert not missing


def test_every_setting_is_described():
    fields = {**Settings.model_fields, **FunctionEnvironment.model_fields}
    undescribed = [name for name, field in fields.items() if not field.description]
    assert undescribed == ["SANDLOT_DATA_DIR"] or not undescribed, f"add Field(description=...) to {undescribed}"
    assert Settings.model_fields["SANDLOT_DATA_DIR"].description


def test_the_reference_follows_the_model_when_a_setting_is_added(monkeypatch):
    from pydantic import Field

    class More(Settings):
        SANDLOT_EXAMPLE: int = Field(3, ge=1, description="an example")

    import handler.settings_report as report

    monkeypatch.setattr(report, "Settings", More)
    monkeypatch.setattr(gen, "Settings", More)
    text = gen.settings_reference()
    entry = text[text.index("#### `SANDLOT_EXAMPLE`") :].split("\n\n#", 1)[0]
    assert "An example." in entry
    assert "- Type: integer ≥ 1" in entry and "- Default: `3`" in entry
    assert "- Read by: the service (on Lambda, the API function)" in entry
    function_own = set(FunctionEnvironment.model_fields) - set(More.model_fields)
    assert text.count("\n#### ") == len(More.model_fields) + len(function_own)


def test_the_cli_page_has_every_command():
    page = (DOCS / "cli.md").read_text()
    for command in ("serve", "layers build", "run", "health", "config", "packages add", "packages build-log"):
        assert f"### `sandlot {command}`" in page
        assert f"usage: sandlot {command}" in page


def test_every_mode_is_described_on_the_security_page():
    page = (DOCS / "security.md").read_text()
    modes = page[page.index("## Modes") : page.index("\n## ", page.index("## Modes") + 1)]
    for mode in set(JAIL_MODES) - {"auto", "reduced"}:
        assert f"**{mode}**" in modes, mode


def test_the_docs_document_the_product_not_its_history():
    pages = [*DOCS.glob("*.md"), ROOT / "README.md", ROOT / "CHANGELOG.md"]
    narration = re.compile(r"\b(this|last|that|previous|next|a) stop\b|\bsessions? of\b|\bissue \d+", re.IGNORECASE)
    found = [f"{page.name}: {m.group(0)}" for page in pages for m in narration.finditer(page.read_text())]
    assert not found


def _build(config: Path, site: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)


needs_mkdocs = pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None, reason="mkdocs not installed: pip install -e '.[docs]'"
)


@needs_mkdocs
def test_the_site_builds_strictly(tmp_path):
    built = _build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert built.returncode == 0, built.stderr
    assert (tmp_path / "site" / "configuration" / "index.html").is_file()
    assert not (tmp_path / "site" / "gen_reference.py").exists()


@needs_mkdocs
def test_a_broken_anchor_fails_the_build(tmp_path):
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(DOCS, tmp_path / "docs")
    index = tmp_path / "docs" / "index.md"
    index.write_text(index.read_text() + "\n[gone](configuration.md#no-such-setting)\n")
    built = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert built.returncode != 0
    assert "no-such-setting" in built.stderr + built.stdout
