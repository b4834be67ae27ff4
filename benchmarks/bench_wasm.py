"""WASM host overhead: create from a cached module, gated import round trip, no recompile."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import wasmtime

from benchmarks._harness import BenchRow, measure, ratio_row
from suaveplan_sandbox.adapters import Adapters
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.testing._fakes import DictSecrets
from suaveplan_sandbox.wasm import _engine, create_wasm_sandbox

GUEST = """
(module
  (import "suaveplan" "secrets_get" (func $sg (param i32 i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "API_KEY")
  (func (export "secret") (result i32)
    (call $sg (i32.const 0) (i32.const 7) (i32.const 256) (i32.const 64) (i32.const 512))))
"""


def run() -> list[BenchRow]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        path = root / "guest.wasm"
        wasm = wasmtime.wat2wasm(GUEST)
        path.write_bytes(wasm)
        policy = PermissionPolicy.from_manifest(
            {"name": "bench", "secrets": [{"name": "API_KEY"}]}, root=root
        )
        adapters = Adapters(secrets=DictSecrets({"API_KEY": "k"}))
        loop = asyncio.new_event_loop()
        try:
            return _rows(loop, path, policy, adapters)
        finally:
            loop.close()


def _rows(
    loop: asyncio.AbstractEventLoop, path: Path, policy: PermissionPolicy, adapters: Adapters
) -> list[BenchRow]:
    eng = _engine.engine()
    module = _engine.load_module(path.read_bytes())
    ty = wasmtime.FuncType([wasmtime.ValType.i32()] * 5, [wasmtime.ValType.i32()])

    def bare_instantiate() -> object:
        store = wasmtime.Store(eng)
        store.set_epoch_deadline(1 << 62)
        linker = wasmtime.Linker(eng)
        linker.define_func("suaveplan", "secrets_get", ty, lambda *a: 0)
        return linker.instantiate(store, module)

    async def create_dispose() -> None:
        sb = await create_wasm_sandbox(wasm_module_path=path, policy=policy, proxies=adapters)
        await sb.dispose()

    compiles = _engine.compile_count()
    created = measure(lambda: loop.run_until_complete(create_dispose()), repeat=5)
    recompiled = _engine.compile_count() - compiles
    bare = measure(bare_instantiate, repeat=5)

    store = wasmtime.Store(eng)
    store.set_epoch_deadline(1 << 62)
    linker = wasmtime.Linker(eng)
    linker.define_func("suaveplan", "secrets_get", ty, lambda *a: 0)
    bare_inst = linker.instantiate(store, module)
    bare_fn = bare_inst.exports(store)["secret"]
    assert isinstance(bare_fn, wasmtime.Func)
    bare_call = measure(lambda: bare_fn(store), repeat=5)

    sb = loop.run_until_complete(
        create_wasm_sandbox(wasm_module_path=path, policy=policy, proxies=adapters)
    )
    try:
        gated = measure(lambda: loop.run_until_complete(sb.call("secret")), repeat=5)
    finally:
        loop.run_until_complete(sb.dispose())
    return [
        ratio_row("wasm create (cached module)", created, "bare instantiate", bare, at_most=2.5),
        ratio_row("wasm gated import round trip", gated, "bare no-op import", bare_call, at_most=3),
        BenchRow(
            name="wasm recompiles on repeated create",
            value_s=float(recompiled),
            baseline_name="expected",
            baseline_s=0.0,
            target="= 0",
            ok=recompiled == 0,
        ),
    ]
