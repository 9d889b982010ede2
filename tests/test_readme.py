"""The README's configuration table is the settings model's: generated from it, and checked against it."""

from __future__ import annotations

import os

from handler.settings import Settings
from handler.settings_report import BEGIN, END, markdown_table, with_table

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def test_the_readme_table_is_the_one_the_model_gives():
    with open(README) as f:
        readme = f.read()
    assert BEGIN in readme and END in readme
    assert with_table(readme) == readme, "run: python -m handler.settings_report --write README.md"


def test_every_setting_is_described():
    undescribed = [name for name, field in Settings.model_fields.items() if not field.description]
    assert not undescribed, f"add Field(description=...) to {undescribed}"


def test_the_table_follows_the_model_when_a_setting_is_added():
    class More(Settings):
        SANDLOT_EXAMPLE: int = 3

    import handler.settings_report as report

    original = report.Settings
    report.Settings = More
    try:
        table = markdown_table()
    finally:
        report.Settings = original
    assert "| `SANDLOT_EXAMPLE` | `3` |  |" in table
    assert table.count("\\n") == 0 and len(table.splitlines()) == len(More.model_fields) + 2
