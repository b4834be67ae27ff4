"""`cpuPercent` for WASM guests: thread CPU time sampled on each epoch tick ends a spinning guest."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.metrics import InMemoryMetrics
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.wasm import create_wasm_sandbox

SPIN_WAT = """
(module
  (func (export "spin") (loop (br 0)))
  (func (export "answer") (result i32) (i32.const 42)))
"""


def policy(root: Path, budgets: dict[str, object]) -> PermissionPolicy:
    return PermissionPolicy.from_manifest(
        {"name": "guest", "permissions": {"budgets": budgets}}, root=root
    )


def _budget_count(metrics: InMemoryMetrics, budget: str) -> float:
    return metrics.value("plugin.budget_exceeded_total", plugin="guest", budget=budget)


async def test_infinite_loop_under_cpu_percent_ends_with_cpu_budget(
    root: Path, wat: Callable[[str], Path]
) -> None:
    metrics = InMemoryMetrics()
    async with await create_wasm_sandbox(
        wasm_module_path=wat(SPIN_WAT),
        policy=policy(root, {"cpuPercent": 20, "wallClockMs": 600_000}),
        metrics=metrics,
    ) as sb:
        with pytest.raises(SuaveplanError) as info:
            await sb.call("spin")
        assert info.value.code == "BUDGET_EXCEEDED"
        assert info.value.details["budget"] == "cpuPercent"
        assert info.value.details["limit"] == 20
        assert _budget_count(metrics, "cpuPercent") == 1
        assert _budget_count(metrics, "wallClockMs") == 0
        # The guest was interrupted, not the handle: a later call runs under a fresh window.
        assert await sb.call("answer") == 42
        assert _budget_count(metrics, "cpuPercent") == 1


async def test_wall_clock_still_ends_the_guest_when_cpu_percent_is_set(
    root: Path, wat: Callable[[str], Path]
) -> None:
    # cpuPercent 100 = one core: a single-threaded spin never exceeds it, so the wall clock
    # budget (enforced by the same epoch callback) is what ends the guest.
    metrics = InMemoryMetrics()
    async with await create_wasm_sandbox(
        wasm_module_path=wat(SPIN_WAT),
        policy=policy(root, {"cpuPercent": 100, "wallClockMs": 50}),
        metrics=metrics,
    ) as sb:
        with pytest.raises(SuaveplanError) as info:
            await sb.call("spin")
    assert info.value.code == "BUDGET_EXCEEDED"
    assert info.value.details["budget"] == "wallClockMs"
    assert _budget_count(metrics, "wallClockMs") == 1
    assert _budget_count(metrics, "cpuPercent") == 0


async def test_run_of_a_command_module_is_held_to_cpu_percent(root: Path) -> None:
    metrics = InMemoryMetrics()
    async with await create_wasm_sandbox(
        wasm_module_path=Path(__file__).parent / "fixtures" / "spin.wasm",
        policy=policy(root, {"cpuPercent": 20, "wallClockMs": 600_000}),
        metrics=metrics,
    ) as sb:
        with pytest.raises(SuaveplanError) as info:
            await sb.run(argv=["spin"])
    assert info.value.details["budget"] == "cpuPercent"
    assert _budget_count(metrics, "cpuPercent") == 1
