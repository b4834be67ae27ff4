"""BudgetTracker: deterministic breaches on an injected clock, one per dimension."""

from __future__ import annotations

import pytest

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.metrics import BUDGET_EXCEEDED, InMemoryMetrics
from suaveplan_sandbox.permissions import Budgets, BudgetTracker
from suaveplan_sandbox.testing import FakeClock


def _tracker(**budgets: int | float) -> tuple[BudgetTracker, FakeClock, InMemoryMetrics]:
    clock, metrics = FakeClock(), InMemoryMetrics()
    tracker = BudgetTracker(
        Budgets.model_validate(budgets), plugin="p", metrics=metrics, clock=clock
    )
    return tracker, clock, metrics


def _count(metrics: InMemoryMetrics, budget: str) -> float:
    return metrics.value(BUDGET_EXCEEDED.name, plugin="p", budget=budget)


def test_raises_budget_exceeded_on_wall_clock_breach() -> None:
    tracker, clock, metrics = _tracker(wallClockMs=30000)
    tracker.start_call()
    clock.advance_ms(30000)
    tracker.tick()
    clock.advance_ms(1)
    with pytest.raises(SuaveplanError) as info:
        tracker.tick()
    assert info.value.code == "BUDGET_EXCEEDED"
    assert info.value.details["budget"] == "wallClockMs"
    assert _count(metrics, "wallClockMs") == 1


def test_is_idempotent_on_duplicate_samples() -> None:
    tracker, _, metrics = _tracker(memoryMb=10)
    with pytest.raises(SuaveplanError):
        tracker.sample_memory(11 * 1024 * 1024)
    tracker.sample_memory(11 * 1024 * 1024)
    tracker.sample_memory(11 * 1024 * 1024)
    assert _count(metrics, "memoryMb") == 1
    assert tracker.breached == {"memoryMb"}


def test_wall_clock_is_per_call() -> None:
    tracker, clock, _ = _tracker(wallClockMs=100)
    tracker.start_call()
    clock.advance_ms(90)
    tracker.tick()
    tracker.start_call()
    clock.advance_ms(90)
    tracker.tick()
    assert tracker.remaining_s() == pytest.approx(0.01)


def test_memory_at_exactly_the_limit_is_not_a_breach() -> None:
    tracker, _, metrics = _tracker(memoryMb=10)
    tracker.sample_memory(10 * 1024 * 1024)
    assert _count(metrics, "memoryMb") == 0


def test_cpu_percent_needs_a_full_window_before_judging() -> None:
    tracker, _, metrics = _tracker(cpuPercent=50)
    # A start-up burst at 100% for half a window is not judged yet.
    tracker.sample_cpu(0.0, at=0.0)
    tracker.sample_cpu(0.5, at=0.5)
    assert _count(metrics, "cpuPercent") == 0
    with pytest.raises(SuaveplanError) as info:
        tracker.sample_cpu(1.0, at=1.0)
    assert info.value.details["budget"] == "cpuPercent"


def test_cpu_window_slides_so_old_idle_time_does_not_dilute_a_busy_loop() -> None:
    tracker, _, metrics = _tracker(cpuPercent=50)
    t, cpu = 0.0, 0.0
    for _ in range(100):  # ten idle seconds
        t += 0.1
        tracker.sample_cpu(cpu, at=t)
    breached_after = None
    for step in range(1, 30):
        t += 0.1
        cpu += 0.1
        try:
            tracker.sample_cpu(cpu, at=t)
        except SuaveplanError:
            breached_after = step
            break
    assert breached_after is not None and breached_after <= 10
    assert _count(metrics, "cpuPercent") == 1


def test_repeated_and_stale_cpu_samples_are_ignored() -> None:
    tracker, _, metrics = _tracker(cpuPercent=10)
    tracker.sample_cpu(0.0, at=0.0)
    for _ in range(5):
        tracker.sample_cpu(0.0, at=0.0)
    tracker.sample_cpu(5.0, at=-1.0)
    assert _count(metrics, "cpuPercent") == 0


def test_each_dimension_breaches_independently_once() -> None:
    tracker, clock, metrics = _tracker(wallClockMs=10, memoryMb=1)
    tracker.start_call()
    clock.advance_ms(11)
    with pytest.raises(SuaveplanError):
        tracker.tick()
    with pytest.raises(SuaveplanError):
        tracker.sample_memory(2 * 1024 * 1024)
    tracker.tick()
    assert _count(metrics, "wallClockMs") == _count(metrics, "memoryMb") == 1


def test_unset_budgets_are_not_enforced() -> None:
    tracker, clock, metrics = _tracker()
    tracker.start_call()
    clock.advance(10_000)
    tracker.tick()
    tracker.sample_memory(2**40)
    tracker.sample_cpu(0, at=0)
    tracker.sample_cpu(100, at=1)
    assert metrics.value(BUDGET_EXCEEDED.name) == 0
