"""How the host samples its workers: a CPU/RSS budget through the process handle, the wall
clock with the host's own timer, and every sandbox's idle and one-thread watchdogs through
the same handle (so a worker that cannot be opened fails the create closed, budgets or not)."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.metrics import BUDGET_EXCEEDED, InMemoryMetrics
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.vm import VmSandbox, create_vm_sandbox

SOURCE = """
def spin():
    while True:
        pass


def hold(mb):
    data = bytearray(mb * 1024 * 1024)  # zero-filled: every page resident
    while True:
        data[0] = 1
"""


async def _create(tmp: Path, budgets: dict[str, int], metrics: InMemoryMetrics) -> VmSandbox:
    (tmp / "p.py").write_text(SOURCE)
    policy = PermissionPolicy.from_manifest(
        {"name": "sampling", "permissions": {"budgets": budgets}}, root=tmp
    )
    return await create_vm_sandbox(plugin_module_path=tmp / "p.py", policy=policy, metrics=metrics)


async def test_a_resident_set_over_memory_mb_below_the_rlimit_is_ended_by_the_sampler(
    tmp_path: Path,
) -> None:
    # 160 MiB resident against memoryMb 64: far over the budget, but well within the
    # address-space backstop (64 MiB + the interpreter slack), so no MemoryError ends it;
    # only the host's RSS sample can, long before the wall clock would.
    metrics = InMemoryMetrics()
    sb = await _create(tmp_path, {"memoryMb": 64, "wallClockMs": 20_000}, metrics)
    try:
        with pytest.raises(SuaveplanError) as info:
            await sb.call("hold", 160)
        assert info.value.code == "BUDGET_EXCEEDED"
        assert info.value.details["budget"] == "memoryMb"
        assert sb.state == "crashed"
        assert metrics.value(BUDGET_EXCEEDED.name, budget="memoryMb") == 1
        assert metrics.value(BUDGET_EXCEEDED.name, budget="wallClockMs") == 0
    finally:
        await sb.dispose()


async def test_the_wall_clock_is_the_hosts_own_timer(tmp_path: Path) -> None:
    # The wall clock needs no sample of the worker: the host's timer ends the call.
    metrics = InMemoryMetrics()
    sb = await _create(tmp_path, {"wallClockMs": 200}, metrics)
    try:
        with pytest.raises(SuaveplanError) as info:
            await sb.call("spin")
        assert (info.value.code, info.value.details["budget"]) == (
            "BUDGET_EXCEEDED",
            "wallClockMs",
        )
        assert sb.state == "crashed"
        assert metrics.value(BUDGET_EXCEEDED.name, budget="wallClockMs") == 1
    finally:
        await sb.dispose()


@pytest.mark.parametrize("budgets", [{}, {"wallClockMs": 200}])
async def test_without_a_cpu_or_rss_budget_an_unreadable_worker_still_refuses_the_create(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, budgets: dict[str, int]
) -> None:
    # Every sandbox's worker is watched between calls and across them (the idle and
    # one-thread watchdogs, for a worker that escaped the interpreter): one that cannot be
    # read would go unwatched, so the create fails closed, naming that layer.
    def unavailable(*_: object, **__: object) -> psutil.Process:
        raise psutil.AccessDenied()

    monkeypatch.setattr(psutil, "Process", unavailable)
    with pytest.raises(SuaveplanError) as info:
        await _create(tmp_path, budgets, InMemoryMetrics())
    assert info.value.code == "SAND_VM_HARDENING_UNAVAILABLE"
    assert info.value.details == {"layer": "idle-watchdog", "why": "AccessDenied"}


@pytest.mark.parametrize("budgets", [{"memoryMb": 256}, {"cpuPercent": 50}])
async def test_a_cpu_or_rss_budget_opens_the_process_for_sampling(
    tmp_path: Path, budgets: dict[str, int]
) -> None:
    sb = await _create(tmp_path, budgets, InMemoryMetrics())
    try:
        assert sb._proc is not None
        assert sb._proc.pid == sb.pid
    finally:
        await sb.dispose()


@pytest.mark.parametrize("budgets", [{"memoryMb": 256}, {"cpuPercent": 50}])
async def test_a_cpu_or_rss_budget_that_cannot_be_sampled_refuses_the_create(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, budgets: dict[str, int]
) -> None:
    # Fail closed: a budget nothing can measure would be a budget in name only.
    def unavailable(*_: object, **__: object) -> psutil.Process:
        raise psutil.AccessDenied()

    monkeypatch.setattr(psutil, "Process", unavailable)
    with pytest.raises(SuaveplanError) as info:
        await _create(tmp_path, budgets, InMemoryMetrics())
    assert info.value.code == "SAND_VM_HARDENING_UNAVAILABLE"
    assert info.value.details == {"layer": "budget-sampling", "why": "AccessDenied"}


async def test_a_worker_that_becomes_unreadable_mid_call_ends_the_sandbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sb = await _create(tmp_path, {"cpuPercent": 90, "wallClockMs": 5000}, InMemoryMetrics())
    try:
        assert sb._proc is not None

        def unreadable() -> object:
            raise psutil.AccessDenied()  # e.g. /proc remounted hidepid=2 under the host

        monkeypatch.setattr(sb._proc, "oneshot", unreadable)
        with pytest.raises(SuaveplanError) as info:
            await sb.call("spin")
        assert info.value.code == "SAND_VM_HARDENING_UNAVAILABLE"
        assert sb.state == "crashed"
    finally:
        await sb.dispose()
