"""The memoryMb verdict for a guest that fails after a refused `memory.grow` is exact for an
instrumented module (`wasm/_instrument.py`): the module records every refusal and the size
it asked for, so the host knows whether memoryMb or the module's own maximum refused it.
Modules the walker cannot instrument keep the size inference (tested here too)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Final

import pytest

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.metrics import InMemoryMetrics
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.wasm import create_wasm_sandbox
from suaveplan_sandbox.wasm._instrument import REFUSALS_EXPORT

# One grow of `pages` from a 1-page memory; a refusal is fatal to this guest.
BIG_GROW_WAT: Final = """
(module
  (memory (export "memory") 1 {max})
  {extra}
  (func (export "grow_or_die") (param $pages i32) (result i32)
    (if (i32.eq (memory.grow (local.get $pages)) (i32.const -1)) (then unreachable))
    (memory.size))
  (func (export "grow") (param $pages i32) (result i32) (memory.grow (local.get $pages)))
  (func (export "die") unreachable)
  (func (export "answer") (result i32) (i32.const 42)))
"""

# The same guest as a WASI command: a refused grow makes it exit 1.
BIG_GROW_COMMAND_WAT: Final = """
(module
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)
  (func (export "_start")
    (if (i32.eq (memory.grow (i32.const 100)) (i32.const -1)) (then (call $exit (i32.const 1))))))
"""


def _policy(root: Path, memory_mb: int) -> PermissionPolicy:
    return PermissionPolicy.from_manifest(
        {"name": "guest", "permissions": {"budgets": {"memoryMb": memory_mb}}}, root=root
    )


def _guest(max_pages: str = "", extra: str = "") -> str:
    return BIG_GROW_WAT.format(max=max_pages, extra=extra)


async def test_a_single_large_grow_refused_with_headroom_left_is_a_memory_budget_breach(
    root: Path, wat: Callable[[str], Path]
) -> None:
    # 100 pages asked of a 1-page memory under 2 MiB (32 pages): 31 pages of headroom are
    # left, more than the call grew (none). Inference alone called this a trap.
    metrics = InMemoryMetrics()
    sb = await create_wasm_sandbox(
        wasm_module_path=wat(_guest()), policy=_policy(root, 2), metrics=metrics
    )
    try:
        with pytest.raises(SuaveplanError) as info:
            await sb.call("grow_or_die", 100)
        assert info.value.code == "BUDGET_EXCEEDED"
        assert info.value.details == {"budget": "memoryMb", "limit": 2}
        assert metrics.value("plugin.budget_exceeded_total", plugin="guest", budget="memoryMb") == 1
        assert sb.state == "ended"
    finally:
        await sb.dispose()


async def test_a_command_that_exits_non_zero_after_a_large_refused_grow_is_a_breach(
    root: Path, wat: Callable[[str], Path]
) -> None:
    metrics = InMemoryMetrics()
    async with await create_wasm_sandbox(
        wasm_module_path=wat(BIG_GROW_COMMAND_WAT), policy=_policy(root, 2), metrics=metrics
    ) as sb:
        with pytest.raises(SuaveplanError) as info:
            await sb.run()
        assert info.value.code == "BUDGET_EXCEEDED"
        assert info.value.details["budget"] == "memoryMb"
    assert metrics.value("plugin.budget_exceeded_total", budget="memoryMb") == 1


async def test_a_grow_within_the_limit_is_no_breach_and_the_guest_sees_the_old_size(
    root: Path, wat: Callable[[str], Path]
) -> None:
    async with await create_wasm_sandbox(
        wasm_module_path=wat(_guest()), policy=_policy(root, 2)
    ) as sb:
        assert await sb.call("grow_or_die", 31) == 32
        assert await sb.call("grow", 1) == -1  # refused, and the guest copes: no breach
        assert sb.state == "ready"
        assert await sb.call("answer") == 42


@pytest.mark.parametrize(
    ("max_pages", "memory_mb", "pages"),
    [
        pytest.param("8", 4, 100, id="own-max-under-memoryMb"),
        pytest.param("1000", 2, 2000, id="beyond-own-max-above-memoryMb"),
        pytest.param("", 8192, 70000, id="beyond-4GiB-under-memoryMb"),
    ],
)
async def test_a_grow_refused_by_the_modules_own_maximum_is_a_trap(
    root: Path, wat: Callable[[str], Path], max_pages: str, memory_mb: int, pages: int
) -> None:
    metrics = InMemoryMetrics()
    async with await create_wasm_sandbox(
        wasm_module_path=wat(_guest(max_pages)), policy=_policy(root, memory_mb), metrics=metrics
    ) as sb:
        with pytest.raises(SuaveplanError) as info:
            await sb.call("grow_or_die", pages)
        assert info.value.code == "SAND_WASM_TRAP"
        assert sb.state == "ready"
        assert await sb.call("answer") == 42
    assert metrics.value("plugin.budget_exceeded_total") == 0


async def test_a_module_maximum_above_memory_mb_still_lets_memory_mb_refuse(
    root: Path, wat: Callable[[str], Path]
) -> None:
    async with await create_wasm_sandbox(
        wasm_module_path=wat(_guest("1000")), policy=_policy(root, 2)
    ) as sb:
        with pytest.raises(SuaveplanError) as info:
            await sb.call("grow_or_die", 100)  # within its own 1000, beyond memoryMb's 32
        assert info.value.code == "BUDGET_EXCEEDED"


async def test_a_refusal_in_an_earlier_call_does_not_turn_a_later_trap_into_a_breach(
    root: Path, wat: Callable[[str], Path]
) -> None:
    async with await create_wasm_sandbox(
        wasm_module_path=wat(_guest()), policy=_policy(root, 2)
    ) as sb:
        assert await sb.call("grow", 100) == -1  # refused by memoryMb, handled by the guest
        with pytest.raises(SuaveplanError) as info:
            await sb.call("die")  # an unrelated bug in a later call
        assert info.value.code == "SAND_WASM_TRAP"
        assert sb.state == "ready"


async def test_the_record_is_not_a_callable_export(root: Path, wat: Callable[[str], Path]) -> None:
    async with await create_wasm_sandbox(
        wasm_module_path=wat(_guest()), policy=_policy(root, 2)
    ) as sb:
        with pytest.raises(SuaveplanError) as info:
            await sb.call(REFUSALS_EXPORT)
        assert info.value.code == "SAND_WASM_NO_SUCH_EXPORT"


async def test_a_module_that_cannot_be_instrumented_keeps_the_size_inference(
    root: Path, wat: Callable[[str], Path]
) -> None:
    # The module already exports our reserved name, so it runs as it is: the refusal is
    # then inferred from sizes, and this case (31 pages of headroom, nothing grown in the
    # call) stays the documented trap, while a small-step bomb is still the breach.
    clash = f'(global (export "{REFUSALS_EXPORT}") (mut i64) (i64.const 0))'
    path = wat(_guest(extra=clash))
    async with await create_wasm_sandbox(wasm_module_path=path, policy=_policy(root, 2)) as sb:
        with pytest.raises(SuaveplanError) as info:
            await sb.call("grow_or_die", 100)
        assert info.value.code == "SAND_WASM_TRAP"
    sb = await create_wasm_sandbox(wasm_module_path=path, policy=_policy(root, 2))
    try:
        assert await sb.call("grow_or_die", 31) == 32
        with pytest.raises(SuaveplanError) as info:
            await sb.call("grow_or_die", 1)  # no headroom left: inferred as memoryMb
        assert info.value.code == "BUDGET_EXCEEDED"
    finally:
        await sb.dispose()
