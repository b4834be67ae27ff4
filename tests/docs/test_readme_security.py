"""The README's security section quotes a current `make security-report`.

The escape table it quotes must list every corpus family with as many techniques as the
corpus holds today (so adding a technique without re-running the report fails here), all
contained, under both the full sandbox and the process layer alone.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PLUGINS = REPO / "tests" / "security" / "escapes" / "plugins"


def _security_section() -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    match = re.search(r"^## Security\b.*?(?=^## )", text, re.S | re.M)
    assert match, "README has no '## Security…' section"
    return match.group(0)


def _escape_rows(section: str) -> dict[str, list[str]]:
    start = section.index("Escape techniques")
    rows: dict[str, list[str]] = {}
    for line in section[start:].splitlines()[1:]:
        if not line.strip():
            if rows:
                break
            continue
        if not line.startswith("|") or set(line) <= {"|", "-", " "}:
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return rows


def test_the_readme_names_the_command_that_produced_its_figures() -> None:
    section = _security_section()
    assert "make security-report" in section
    assert "Machine:" in section


def test_the_quoted_escape_table_matches_todays_corpus() -> None:
    rows = _escape_rows(_security_section())
    assert rows.pop("family") == ["both", "process-only"]
    total = rows.pop("**all**")
    corpus = Counter(
        p.name.split("_", 1)[0] for p in PLUGINS.glob("*.py") if not p.name.startswith("_")
    )
    assert set(rows) == set(corpus), "families differ: re-run make security-report"
    for family, cells in rows.items():
        assert cells == [f"{corpus[family]}/{corpus[family]}"] * 2, family
    n = sum(corpus.values())
    assert total == [f"{n}/{n}"] * 2
