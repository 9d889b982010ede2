"""The README: short, with the quick start CI relies on, and every link into the docs alive."""

from __future__ import annotations

import os
import re

from runtimes.runtime_settings import JAIL_MODES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _read(*parts: str) -> str:
    with open(os.path.join(ROOT, *parts)) as f:
        return f.read()


def slugs(markdown: str) -> set[str]:
    """The anchors python-markdown's toc gives a page's headings (as mkdocs and GitHub do for these headings)."""
    found = set()
    in_code = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            title = line.lstrip("#").strip().replace("`", "")
            slug = re.sub(r"[^\w\s-]", "", title).strip().lower()
            found.add(re.sub(r"[-\s]+", "-", slug))
    return found


def test_the_readme_is_short():
    assert len(_read("README.md").splitlines()) <= 200


def test_the_quick_start_and_the_ci_command_are_in_the_readme():
    readme = _read("README.md")
    assert "./dev.sh serve" in readme and "./dev.sh test" in readme
    last = [line for line in _read(".ci", "run").splitlines() if line.strip()][-1]
    assert last.startswith("exec "), ".ci/run must end by exec'ing the README's test command"
    assert last.removeprefix("exec ").strip() in readme


def test_every_link_of_the_readme_leads_somewhere():
    readme = _read("README.md")
    links = re.findall(r"\]\(([^)#\s]+)(?:#([^)\s]+))?\)", readme)
    local = [(path, anchor) for path, anchor in links if "://" not in path]
    assert len(local) >= 10
    for path, anchor in local:
        assert os.path.exists(os.path.join(ROOT, path)), path
        if anchor:
            assert anchor in slugs(_read(path)), f"{path}#{anchor}"


def test_the_protections_table_names_real_modes():
    readme = _read("README.md")
    table = readme[readme.index("| protection |") :].split("\n\n", 1)[0]
    named = set(re.findall(r"\(`(\w+)`\)", table.splitlines()[0]))
    assert named and named <= set(JAIL_MODES), named - set(JAIL_MODES)
