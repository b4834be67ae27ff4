"""Modules that would cost the host too much to compile are refused before compiling.

Each hostile module is small (well under `max_module_bytes`) and valid; each is refused with
`SAND_WASM_INSTANTIATION_FAILED`, `details.stage="bounds"` and the bound's reason, and the
compile counter shows nothing was compiled. No wall-clock time is asserted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest
import wasmtime

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.wasm import CompileLimits, _engine, create_wasm_sandbox
from suaveplan_sandbox.wasm import _compile_bounds as bounds
from suaveplan_sandbox.wasm._instrument import NotInstrumented, Skip, instrument
from wasm._module_bytes import leb, section


def _vec(items: list[bytes]) -> bytes:
    return leb(len(items)) + b"".join(items)


MAGIC = b"\0asm\x01\0\0\0"
TYPE0 = section(1, _vec([b"\x60\x00\x00"]))  # (func)
MEMORY = section(5, b"\x01\x00\x01")


def _module(bodies: list[bytes], *, between: bytes = b"") -> bytes:
    funcs = section(3, leb(len(bodies)) + b"\x00" * len(bodies))
    code = section(10, _vec([leb(len(b)) + b for b in bodies]))
    return MAGIC + TYPE0 + funcs + MEMORY + between + code


def _locals(n: int) -> bytes:
    return b"\x01" + leb(n) + b"\x7f" if n else b"\x00"


def _live_locals_across_blocks(n: int) -> bytes:
    """n locals set, n sequential `if`s, then every local read: quadratic for Cranelift
    (n = 20,000, a 0.3 MB module, made it ask for 26 GB and abort the process)."""
    body = _locals(n)
    body += b"".join(b"\x41\x00\x21" + leb(i) for i in range(n))
    body += b"\x41\x00\x04\x40\x0b" * n
    body += b"\x20\x00" + b"".join(b"\x20" + leb(i) + b"\x6a" for i in range(1, n))
    return _module([body + b"\x1a\x0b"])


CASES = {
    "too-many-functions": lambda: _module([b"\x00\x0b"] * (bounds.MAX_FUNCTIONS + 1)),
    "function-too-large": lambda: _module(
        [b"\x00" + b"\x41\x00\x1a" * (bounds.MAX_FUNCTION_BYTES // 3 + 1) + b"\x0b"]
    ),
    "too-many-locals": lambda: _module([_locals(bounds.MAX_FUNCTION_LOCALS + 1) + b"\x0b"]),
    "too-many-locals-in-module": lambda: _module(
        [_locals(bounds.MAX_FUNCTION_LOCALS) + b"\x0b"]
        * (bounds.MAX_TOTAL_LOCALS // bounds.MAX_FUNCTION_LOCALS + 1)
    ),
    "function-too-costly": lambda: _live_locals_across_blocks(3000),
    "too-many-sections": lambda: MAGIC + b"\x00\x01\x00" * (bounds.MAX_SECTIONS + 1),
    "too-many-types": lambda: MAGIC + section(1, _vec([b"\x60\x00\x00"] * (bounds.MAX_TYPES + 1))),
    "too-many-imports": lambda: (
        MAGIC
        + TYPE0
        + section(
            2,
            _vec(
                [b"\x01a" + leb(len(s)) + s + b"\x00\x00" for s in _names(bounds.MAX_IMPORTS + 1)]
            ),
        )
    ),
    "too-many-exports": lambda: (
        MAGIC
        + section(6, _vec([b"\x7f\x00\x41\x00\x0b"]))
        + section(7, _vec([leb(len(s)) + s + b"\x03\x00" for s in _names(bounds.MAX_EXPORTS + 1)]))
    ),
    "too-many-globals": lambda: (
        MAGIC + section(6, _vec([b"\x7f\x00\x41\x00\x0b"] * (bounds.MAX_GLOBALS + 1)))
    ),
}


def _names(n: int) -> list[bytes]:
    return [str(i).encode() for i in range(n)]


@pytest.mark.parametrize("reason", list(CASES))
def test_a_module_over_a_bound_is_refused_without_compiling(reason: str) -> None:
    wasm = CASES[reason]()
    wasmtime.Module.validate(_engine.engine(), wasm)  # valid: only the bound refuses it
    before = _engine.compile_count()
    with pytest.raises(SuaveplanError) as info:
        _engine.load_module(wasm)
    assert info.value.code == "SAND_WASM_INSTANTIATION_FAILED"
    assert info.value.details["stage"] == "bounds"
    assert info.value.details["reason"] == reason
    assert _engine.compile_count() == before


@pytest.mark.parametrize("reason", list(CASES))
def test_a_cached_modules_shape_is_refused_for_the_same_bound_as_its_bytes(reason: str) -> None:
    # The module cache keeps a module's shape, not its bytes: judged under the defaults, the
    # shape measured under bounds large enough to admit it fails as the bytes do.
    wasm = CASES[reason]()
    wide = CompileLimits(
        **{f.name: 2**40 for f in dataclasses.fields(CompileLimits) if f.name.startswith("max_")}
    )
    shape = bounds.check_compile_bounds(wasm, wide)
    with pytest.raises(SuaveplanError) as from_bytes:
        bounds.check_compile_bounds(wasm)
    with pytest.raises(SuaveplanError) as from_shape:
        bounds.check_compile_shape(shape, CompileLimits())
    assert from_shape.value.details["reason"] == from_bytes.value.details["reason"] == reason
    assert from_shape.value.details["limit"] == from_bytes.value.details["limit"]


def test_the_code_size_bound_is_checked() -> None:
    # 64 MiB of code is too large to build in a test; the same check at a smaller bound.
    wasm = _module([b"\x00" + b"\x41\x00\x1a" * 400 + b"\x0b"])
    bounds.check_compile_bounds(wasm)
    with pytest.raises(SuaveplanError) as info:
        bounds.check_compile_bounds(wasm, CompileLimits(max_code_bytes=1000))
    assert info.value.details == {"stage": "bounds", "reason": "code-too-large", "limit": 1000}


def test_modules_at_the_bounds_are_accepted() -> None:
    bounds.check_compile_bounds(_module([b"\x00\x0b"] * bounds.MAX_FUNCTIONS))
    bounds.check_compile_bounds(_module([_locals(bounds.MAX_FUNCTION_LOCALS) + b"\x0b"]))
    bounds.check_compile_bounds(MAGIC + b"\x00\x01\x00" * bounds.MAX_SECTIONS)
    bounds.check_compile_bounds(_live_locals_across_blocks(1000))


async def test_create_reports_the_bound_and_a_fresh_sandbox_answers(
    root: Path, tmp_path: Path, wat: Callable[[str], Path]
) -> None:
    rules = PermissionPolicy.from_manifest({"name": "guest", "permissions": {}}, root=root)
    path = tmp_path / "costly.wasm"
    path.write_bytes(_live_locals_across_blocks(3000))
    with pytest.raises(SuaveplanError) as info:
        await create_wasm_sandbox(wasm_module_path=path, policy=rules)
    assert info.value.code == "SAND_WASM_INSTANTIATION_FAILED"
    assert info.value.details["reason"] == "function-too-costly"
    async with await create_wasm_sandbox(
        wasm_module_path=wat('(module (func (export "f") (result i32) (i32.const 7)))'),
        policy=rules,
    ) as sb:
        assert await sb.call("f") == 7


def test_fixtures_and_the_example_are_within_the_bounds() -> None:
    here = Path(__file__).parent
    for path in [
        *sorted((here / "fixtures").glob("*.wasm")),
        *sorted((here.parents[1] / "examples" / "wasm").glob("*.wasm")),
    ]:
        bounds.check_compile_bounds(path.read_bytes())


def test_the_grow_rewrite_skips_a_code_section_over_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The rewrite walks every instruction in Python; past MAX_REWRITE_CODE_BYTES the module
    # runs as it is (memoryMb verdict inferred) instead of holding the GIL that long.
    import suaveplan_sandbox.wasm._instrument as walker

    wasm = _module([b"\x00" + b"\x41\x01\x40\x00\x1a" * 50 + b"\x0b"])
    monkeypatch.setattr(walker, "MAX_REWRITE_CODE_BYTES", 100)
    out = instrument(wasm)
    assert isinstance(out, NotInstrumented) and out.reason is Skip.TOO_LARGE
