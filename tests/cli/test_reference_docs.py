"""The error-code and metrics references in docs/ are generated from the registries."""

from __future__ import annotations

from pathlib import Path

import pytest

from suaveplan_sandbox.cli._reference import PAGES

DOCS = Path(__file__).parents[2] / "docs"


@pytest.mark.parametrize("page", sorted(PAGES))
def test_reference_page_matches_the_registry(page: str) -> None:
    expected = PAGES[page]()
    actual = (DOCS / page).read_text()
    assert actual == expected, (
        f"docs/{page} drifted: run `python -m suaveplan_sandbox.cli reference`"
    )


def test_every_required_code_is_documented() -> None:
    text = (DOCS / "reference/error-codes.md").read_text()
    for code in ("SAND_PERM_DENIED", "BUDGET_EXCEEDED", "SAND_MANIFEST_INVALID"):
        assert f"`{code}`" in text
