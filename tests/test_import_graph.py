"""Layers you can see: `permissions` and `protocol` are pure and import no sandbox or I/O code."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).parents[1] / "src" / "suaveplan_sandbox"
FORBIDDEN_FOR_PURE = (
    "suaveplan_sandbox.vm",
    "suaveplan_sandbox.wasm",
    "suaveplan_sandbox.adapters",
    "suaveplan_sandbox.gateway",
    "suaveplan_sandbox.cli",
    "asyncio",
    "socket",
    "subprocess",
    "sqlite3",
    "httpx",
    "wasmtime",
    "psutil",
)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("package", ["permissions", "protocol"])
def test_pure_packages_import_no_io_or_sandbox_code(package: str) -> None:
    files = sorted((SRC / package).rglob("*.py"))
    assert files, f"{package} has no modules"
    for path in files:
        for name in _imports(path):
            for bad in FORBIDDEN_FOR_PURE:
                assert name != bad and not name.startswith(bad + "."), (
                    f"{path.relative_to(SRC)} imports {name}"
                )
