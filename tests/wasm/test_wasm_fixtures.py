"""The committed guest binaries are what `make wasm-fixtures` builds from the committed sources."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
from pathlib import Path
from types import ModuleType

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
REPO = FIXTURES.parents[2]
MANIFESTS = (FIXTURES / "hashes.json", REPO / "examples" / "wasm" / "hashes.json")


def _build_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("wasm_fixture_build", FIXTURES / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _recorded() -> list[tuple[Path, Path, dict[str, str]]]:
    """(source, committed binary, recorded hashes) for every fixture and the example."""
    out = []
    for manifest in MANIFESTS:
        for wasm_name, hashes in json.loads(manifest.read_text()).items():
            wasm = manifest.parent / wasm_name
            out.append((wasm.with_suffix(".c"), wasm, hashes))
    return out


def test_each_committed_fixture_matches_its_recorded_source_and_binary_hashes() -> None:
    build = _build_script()
    recorded = _recorded()
    # Every source the build compiles has a record, and every record a source and a binary.
    assert sorted(src for src, _, _ in recorded) == sorted(build.sources())
    for src, wasm, hashes in recorded:
        assert wasm.is_file(), wasm
        assert build.digest(src) == hashes["source"], f"{src.name} changed: make wasm-fixtures"
        assert build.digest(wasm) == hashes["wasm"], f"{wasm.name} is not the recorded build"


def test_make_wasm_fixtures_runs_the_build_script_with_ziglang_for_wasm32_wasi() -> None:
    makefile = (REPO / "Makefile").read_text()
    target = re.search(r"^wasm-fixtures:.*\n\t(.+)$", makefile, re.MULTILINE)
    assert target is not None and "tests/wasm/fixtures/build.py" in target.group(1)
    cmd = _build_script().command(Path("a.c"), Path("a.wasm"), "wasm32-wasi")
    assert cmd[1:6] == ["-m", "ziglang", "cc", "-target", "wasm32-wasi"]


@pytest.mark.slow
def test_rebuilding_every_fixture_reproduces_the_committed_bytes(tmp_path: Path) -> None:
    pytest.importorskip("ziglang")
    build = _build_script()
    for src, wasm, _ in _recorded():
        # Build from a copy so the recorded paths cannot leak into the binary differently.
        copy = tmp_path / src.name
        shutil.copyfile(src, copy)
        out = build.build(copy, tmp_path / wasm.name)
        assert out.read_bytes() == wasm.read_bytes(), f"{wasm.name} does not rebuild the same"
