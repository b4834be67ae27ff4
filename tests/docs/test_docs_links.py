"""The docs stay honest: relative links resolve and `suaveplan_sandbox.X` names exist."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted([*DOCS.glob("*.md"), ROOT / "README.md"])

_FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.MULTILINE | re.DOTALL)
_INLINE_CODE = re.compile(r"`([^`\n]+)`")
_LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_DOTTED = re.compile(r"\bsuaveplan_sandbox(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
_EXTERNAL = ("http://", "https://", "mailto:", "#")


def _prose(text: str) -> str:
    """The page without fenced code blocks (links inside them are not links)."""
    return _FENCE.sub("", text)


def relative_links(text: str) -> list[str]:
    prose = _INLINE_CODE.sub("", _prose(text))
    return [t for t in _LINK.findall(prose) if not t.startswith(_EXTERNAL)]


def dotted_names(text: str) -> set[str]:
    names: set[str] = set()
    for span in _INLINE_CODE.findall(_prose(text)):
        names.update(_DOTTED.findall(span))
    return names


def resolves(dotted: str) -> bool:
    """Import the longest importable module prefix, then walk attributes for the rest."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_pages_exist() -> None:
    names = {p.name for p in PAGES}
    for page in ("index.md", "concepts.md", "plugin-authors.md", "hosts.md", "manifest.md"):
        assert page in names
    for page in ("security.md", "comparison.md", "cli.md", "README.md"):
        assert page in names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in relative_links(page.read_text(encoding="utf-8")):
        path = target.split("#", 1)[0]
        if path and not (page.parent / path).exists():
            broken.append(target)
    assert not broken, f"{page.name}: broken links {broken}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_dotted_names_resolve(page: Path) -> None:
    missing = sorted(n for n in dotted_names(page.read_text(encoding="utf-8")) if not resolves(n))
    assert not missing, f"{page.name}: names that do not resolve {missing}"


def test_the_checks_can_fail() -> None:
    sample = "See [x](no-such-page.md) and `suaveplan_sandbox.vm.no_such_function`.\n"
    sample += "```\n[in code](ignored.md) `suaveplan_sandbox.ignored`\n```\n"
    assert relative_links(sample) == ["no-such-page.md"]
    assert dotted_names(sample) == {"suaveplan_sandbox.vm.no_such_function"}
    assert not resolves("suaveplan_sandbox.vm.no_such_function")
    assert not resolves("suaveplan_sandbox.no_such_module")
    assert resolves("suaveplan_sandbox.vm.create_vm_sandbox")
    assert resolves("suaveplan_sandbox.adapters.BeneathRootFs")
