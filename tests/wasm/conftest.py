"""Fixtures for the WASM host tests: a policy root with an upload and a private file, WAT."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import wasmtime


@pytest.fixture
def root(tmp_path: Path) -> Path:
    base = tmp_path / "root"
    (base / "uploads").mkdir(parents=True)
    (base / "uploads" / "a.txt").write_text("hello")
    (base / "private").mkdir()
    (base / "private" / "s.txt").write_text("secret")
    return base


@pytest.fixture
def wat(tmp_path: Path) -> Callable[[str], Path]:
    """Compile WAT text to a `.wasm` file at test time."""

    def compile_wat(text: str) -> Path:
        path = tmp_path / f"guest{abs(hash(text))}.wasm"
        path.write_bytes(wasmtime.wat2wasm(text))
        return path

    return compile_wat
