"""memoryMb bounds the whole store, not one memory: extra memories and table bombs are refused.

wasmtime's store limits are per memory and per table, with 10,000 of each allowed by default;
without counts a guest could multiply its budget by declaring more memories or tables.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import wasmtime

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.wasm import create_wasm_sandbox
from suaveplan_sandbox.wasm._sandbox import MAX_TABLES, memory_limits


def policy(root: Path, **budgets: int) -> PermissionPolicy:
    return PermissionPolicy.from_manifest(
        {"name": "guest", "permissions": {"budgets": budgets}}, root=root
    )


async def _refused_at_create(path: Path, root: Path, memory_mb: int) -> SuaveplanError:
    with pytest.raises(SuaveplanError) as info:
        await create_wasm_sandbox(wasm_module_path=path, policy=policy(root, memoryMb=memory_mb))
    assert info.value.code == "SAND_WASM_INSTANTIATION_FAILED"
    assert isinstance(info.value.__cause__, (wasmtime.WasmtimeError, wasmtime.Trap))
    return info.value


async def test_a_second_memory_is_refused_with_or_without_memory_mb(
    root: Path, wat: Callable[[str], Path]
) -> None:
    # Each memory alone fits the 16 MiB budget; together they are three times it. The store
    # allows one memory under memoryMb, and the engine has multi-memory off altogether (no
    # WASI toolchain we support emits it; `_engine_config.ENGINE_SETTINGS`).
    path = wat(
        '(module (memory (export "memory") 256) (memory $b 256) (memory $c 256)'
        ' (func (export "f") (result i32) (i32.const 7)))'
    )
    await _refused_at_create(path, root, memory_mb=16)
    with pytest.raises(SuaveplanError) as info:
        await create_wasm_sandbox(wasm_module_path=path, policy=policy(root))
    assert info.value.code == "SAND_WASM_INSTANTIATION_FAILED"


async def test_a_table_larger_than_memory_mb_is_refused_at_create(
    root: Path, wat: Callable[[str], Path]
) -> None:
    # 50,000,000 funcref elements are 400 MB of host memory under a 16 MiB budget.
    await _refused_at_create(wat("(module (table 50000000 funcref))"), root, memory_mb=16)


async def test_more_tables_than_allowed_are_refused_at_create(
    root: Path, wat: Callable[[str], Path]
) -> None:
    tables = " ".join("(table 1 funcref)" for _ in range(MAX_TABLES + 1))
    await _refused_at_create(wat(f"(module {tables})"), root, memory_mb=16)
    within = " ".join("(table 1 funcref)" for _ in range(MAX_TABLES))
    async with await create_wasm_sandbox(
        wasm_module_path=wat(f'(module {within} (func (export "f")))'),
        policy=policy(root, memoryMb=16),
    ) as sb:
        assert await sb.call("f") is None


async def test_table_growth_past_the_bound_is_refused_to_the_guest(
    root: Path, wat: Callable[[str], Path]
) -> None:
    bound = memory_limits(16)["table_elements"]
    path = wat(
        '(module (table $t 1 funcref) (func (export "grow") (param i32) (result i32)'
        " (table.grow $t (ref.null func) (local.get 0))))"
    )
    async with await create_wasm_sandbox(
        wasm_module_path=path, policy=policy(root, memoryMb=16)
    ) as sb:
        assert await sb.call("grow", bound) == -1  # 1 + bound elements: one too many
        assert await sb.call("grow", bound - 1) == 1  # exactly at the bound
        assert sb.state == "ready"


def test_tables_together_fit_in_memory_mb() -> None:
    for memory_mb in (1, 16, 1024):
        limits = memory_limits(memory_mb)
        assert limits["memories"] == 1
        assert limits["memory_size"] == memory_mb * 1024 * 1024
        assert limits["tables"] * limits["table_elements"] * 8 <= limits["memory_size"]


async def test_a_shared_memory_is_refused_because_it_would_grow_outside_the_limits(
    root: Path, wat: Callable[[str], Path]
) -> None:
    # wasmtime grows a shared memory without asking the store's limiter: with shared memory
    # enabled, this module grows to 201 pages under a 2 MiB budget. The engine keeps it (and
    # the threads proposal) off.
    path = wat(
        '(module (memory (export "memory") 1 65536 shared)'
        ' (func (export "grow") (param i32) (result i32) (memory.grow (local.get 0))))'
    )
    for memory_mb in (2, None):
        budgets = {} if memory_mb is None else {"memoryMb": memory_mb}
        with pytest.raises(SuaveplanError) as info:
            await create_wasm_sandbox(wasm_module_path=path, policy=policy(root, **budgets))
        assert info.value.code == "SAND_WASM_INSTANTIATION_FAILED"
        assert "shared memor" in str(info.value.__cause__)  # threads are off too
