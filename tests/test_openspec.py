"""Traceability: every `**Verified by:**` node id in `openspec/specs/*/spec.md` exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
SPECS = sorted((ROOT / "openspec" / "specs").glob("*/spec.md"))
_NODE = re.compile(r"`(tests/[^`:]+\.py)::([A-Za-z_][A-Za-z0-9_]*)(?:\[[^`]*\])?`")


def _tests_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test")
    }


def test_the_permissions_spec_is_present() -> None:
    assert ROOT / "openspec/specs/api-sandbox-permissions/spec.md" in SPECS


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.parent.name)
def test_every_verified_by_node_id_exists(spec: Path) -> None:
    text = spec.read_text()
    requirements = text.count("## Requirement:")
    verified = [line for line in text.splitlines() if line.startswith("**Verified by:**")]
    assert requirements and len(verified) >= requirements, "a requirement lacks Verified by"
    missing = []
    for line in verified:
        nodes = _NODE.findall(line)
        assert nodes, f"no node ids in: {line}"
        for file, name in nodes:
            path = ROOT / file
            if not path.is_file() or name not in _tests_in(path):
                missing.append(f"{file}::{name}")
    assert not missing, f"{spec.parent.name}: missing tests {missing}"
