"""The docs site builds with `mkdocs build --strict` and its nav lists every page in docs/."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mkdocs.config import load_config

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
CONFIG = ROOT / "mkdocs.yml"


def nav_pages(nav: list[Any]) -> list[str]:
    """Every page named in a mkdocs `nav` (entries are `Title: page.md` or sections)."""
    pages: list[str] = []
    for entry in nav:
        if isinstance(entry, str):
            pages.append(entry)
        elif isinstance(entry, dict):
            for value in entry.values():
                pages.extend(nav_pages(value) if isinstance(value, list) else [value])
    return pages


def _nav() -> list[Any]:
    nav = load_config(config_file=str(CONFIG))["nav"]
    assert isinstance(nav, list), "mkdocs.yml must spell out the nav"
    return nav


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        cwd=config.parent,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_every_docs_page_is_in_the_nav_and_the_nav_names_only_real_pages() -> None:
    listed = nav_pages(_nav())
    on_disk = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert sorted(listed) == on_disk
    assert len(listed) == len(set(listed)), "a page is listed twice"


def test_the_strict_build_passes_without_warnings(tmp_path: Path) -> None:
    site = tmp_path / "site"
    proc = _build(CONFIG, site)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "WARNING" not in output, output
    for page in nav_pages(_nav()):
        html = "index.html" if page == "index.md" else page.removesuffix(".md") + "/index.html"
        assert (site / html).is_file(), f"{page} was not rendered"


def test_a_broken_link_fails_the_strict_build(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# x\n\nSee [missing](no-such-page.md).\n")
    config = tmp_path / "mkdocs.yml"
    config.write_text("site_name: t\nnav:\n  - Home: index.md\n")
    proc = _build(config, tmp_path / "site")
    assert proc.returncode != 0
    assert "no-such-page.md" in proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("nav", "expected"),
    [
        (
            ["a.md", {"B": "b.md"}, {"S": [{"C": "s/c.md"}, "d.md"]}],
            ["a.md", "b.md", "s/c.md", "d.md"],
        ),
        ([], []),
    ],
)
def test_nav_pages_walks_sections(nav: list[Any], expected: list[str]) -> None:
    assert nav_pages(nav) == expected
