"""The engine enables only the reviewed proposals; a module using any other one is refused.

Each disabled proposal has a tiny WAT guest that wasmtime's defaults would accept; ours is
`SAND_WASM_INSTANTIATION_FAILED` at create, and a fresh sandbox answers afterwards. The
baseline our toolchains emit still loads, and a disk-cache artefact written under another
config is never read back.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
from collections.abc import Callable
from pathlib import Path

import pytest
import wasmtime

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.wasm import _engine, _engine_config, create_wasm_sandbox

DISABLED = {
    "threads (shared memory)": "(module (memory 1 1 shared))",
    "threads (atomics)": (
        "(module (memory 1 1) (func (result i32) (i32.atomic.load (i32.const 0))))"
    ),
    "tail calls": "(module (func $f (return_call $f)))",
    "exceptions": "(module (tag $e) (func (throw $e)))",
    "exnref": "(module (func (result exnref) (ref.null exn)))",
    "function references": (
        "(module (type $t (func)) (func (param (ref $t)) (call_ref $t (local.get 0))))"
    ),
    "gc": (
        "(module (type $s (struct (field i32)))"
        " (func (result (ref $s)) (struct.new $s (i32.const 1))))"
    ),
    "wide arithmetic": (
        "(module (func (param i64 i64 i64 i64) (result i64 i64)"
        " (i64.add128 (local.get 0) (local.get 1) (local.get 2) (local.get 3))))"
    ),
    "memory64": "(module (memory i64 1))",
    "multi-memory": "(module (memory 1) (memory 1))",
    "relaxed simd": (
        "(module (func (param v128 v128 v128) (result v128)"
        " (f32x4.relaxed_madd (local.get 0) (local.get 1) (local.get 2))))"
    ),
    "custom page sizes": "(module (memory 1 (pagesize 1)))",
    "stack switching": (
        "(module (type $f (func)) (type $c (cont $f)) (func $g) (elem declare func $g)"
        " (func (result (ref $c)) (cont.new $c (ref.func $g))))"
    ),
    "component model": "(component)",
}

# What wasi-sdk, Rust, TinyGo and Zig emit by default (Wasm 2.0): these must keep loading.
BASELINE = {
    "bulk memory": (
        '(module (memory 1) (func (export "f") (memory.fill (i32.const 0) (i32.const 0)'
        " (i32.const 1))))"
    ),
    "multi-value": '(module (func (export "f") (result i32 i32) (i32.const 1) (i32.const 2)))',
    "reference types": (
        '(module (table 1 externref) (func (export "f") (param externref)'
        " (table.set 0 (i32.const 0) (local.get 0))))"
    ),
    "simd": '(module (func (export "f") (result v128) (v128.const i32x4 1 2 3 4)))',
    "sign extension": '(module (func (export "f") (result i32) (i32.extend8_s (i32.const 1))))',
    "non-trapping float-to-int": (
        '(module (func (export "f") (result i32) (i32.trunc_sat_f32_s (f32.const 1))))'
    ),
    "mutable globals": '(module (global (export "g") (mut i32) (i32.const 0)))',
}


def policy(root: Path) -> PermissionPolicy:
    return PermissionPolicy.from_manifest({"name": "guest", "permissions": {}}, root=root)


@pytest.mark.parametrize("text", list(DISABLED.values()), ids=list(DISABLED))
def test_wasmtimes_defaults_would_accept_each_disabled_proposal(text: str) -> None:
    # Otherwise the refusal below would prove nothing about our config.
    wasm = wasmtime.wat2wasm(text)
    if text == "(component)":
        return  # a component is never a core module; the switch is off regardless
    if "pagesize" in text or "cont.new" in text:
        return  # off by default in wasmtime 51; named so a default flip is still refused
    wasmtime.Module.validate(wasmtime.Engine(), wasm)


@pytest.mark.parametrize("text", list(DISABLED.values()), ids=list(DISABLED))
async def test_a_module_using_a_disabled_proposal_is_refused_at_create(
    text: str, root: Path, wat: Callable[[str], Path]
) -> None:
    with pytest.raises(SuaveplanError) as info:
        await create_wasm_sandbox(wasm_module_path=wat(text), policy=policy(root))
    assert info.value.code == "SAND_WASM_INSTANTIATION_FAILED"
    async with await create_wasm_sandbox(
        wasm_module_path=wat('(module (func (export "f") (result i32) (i32.const 7)))'),
        policy=policy(root),
    ) as sb:
        assert await sb.call("f") == 7


@pytest.mark.parametrize("text", list(BASELINE.values()), ids=list(BASELINE))
async def test_the_toolchain_baseline_still_loads(
    text: str, root: Path, wat: Callable[[str], Path]
) -> None:
    async with await create_wasm_sandbox(wasm_module_path=wat(text), policy=policy(root)):
        pass


def test_every_engine_setting_is_a_wasmtime_config_setting() -> None:
    names = [name for name, _ in _engine_config.ENGINE_SETTINGS]
    assert len(names) == len(set(names))
    for name in names:
        assert isinstance(getattr(wasmtime.Config, name, None), property), name
    settings = dict(_engine_config.ENGINE_SETTINGS)
    assert settings["parallel_compilation"] is False
    assert settings["epoch_interruption"] is True


def test_every_wasm_proposal_switch_of_this_wasmtime_py_is_reviewed() -> None:
    # A wasmtime-py upgrade that adds a proposal switch fails here until it is reviewed
    # (and listed, on or off, in ENGINE_SETTINGS).
    switches = {
        name
        for name, value in vars(wasmtime.Config).items()
        if name.startswith("wasm_") and isinstance(value, property)
    }
    reviewed = {name for name, _ in _engine_config.ENGINE_SETTINGS} | {
        "wasm_relaxed_simd_deterministic"  # only matters with relaxed SIMD on
    }
    assert switches <= reviewed, sorted(switches - reviewed)


def test_the_artefact_name_carries_a_hash_of_the_whole_config() -> None:
    tag = hashlib.sha256(repr(_engine_config.ENGINE_SETTINGS).encode()).hexdigest()[:12]
    version = importlib.metadata.version("wasmtime")
    expected = f".wasmtime-{version}-{tag}.cwasm"
    assert expected == _engine._ARTEFACT_SUFFIX


def test_an_artefact_written_under_the_old_config_is_never_loaded(tmp_path: Path) -> None:
    # Compile a tail-calling module with wasmtime's defaults (as the old engine could) and
    # store it under every name the old config used; our engine must recompile from the
    # bytes, and so refuse it.
    wasm = bytes(wasmtime.wat2wasm('(module (func $f (export "f") (return_call $f)))'))
    old = wasmtime.Engine()
    artefact = bytes(wasmtime.Module(old, wasm).serialize())
    digest = hashlib.sha256(wasm).hexdigest()
    version = importlib.metadata.version("wasmtime")
    for suffix in (f".wasmtime-{version}.cwasm", f".wasmtime-{version}-nogc.cwasm"):
        (tmp_path / (digest + suffix)).write_bytes(artefact)
    before = _engine.compile_count()
    with pytest.raises(SuaveplanError) as info:
        _engine.load_module(wasm, cache_dir=tmp_path)
    assert info.value.code == "SAND_WASM_INSTANTIATION_FAILED"
    assert _engine.compile_count() == before


def test_a_valid_module_with_only_an_old_config_artefact_is_compiled_afresh(
    tmp_path: Path,
) -> None:
    wasm = bytes(wasmtime.wat2wasm('(module (func (export "f") (result i32) (i32.const 41)))'))
    digest = hashlib.sha256(wasm).hexdigest()
    version = importlib.metadata.version("wasmtime")
    old = bytes(wasmtime.Module(wasmtime.Engine(), wasm).serialize())
    (tmp_path / f"{digest}.wasmtime-{version}-nogc.cwasm").write_bytes(old)
    before = _engine.compile_count()
    _engine.load_module(wasm, cache_dir=tmp_path)
    assert _engine.compile_count() == before + 1
    assert (tmp_path / (digest + _engine._ARTEFACT_SUFFIX)).is_file()
