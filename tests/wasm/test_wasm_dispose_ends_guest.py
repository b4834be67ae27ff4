"""`dispose()` ends a guest that never returns, whatever its budgets.

Without a budget nothing else stops guest code: before, a guest looping in a call kept its
thread and a core busy for the life of the process after its sandbox was disposed, and kept
its store's preopened directories. Under `wallClockMs` alone it kept them until that budget
ended it (minutes, for a generous one). Ordering and generous deadlines, never a timing
assert: the wall-clock budgets here are ten minutes, so only `dispose()` can end the guest
within a test's time.

The guest is disposed only once its thread has taken the call (it holds the sandbox's lock
while the call runs): a call still queued at dispose() is dropped, never run, which is
another route than the one under test. The thread watched is this sandbox's own, never a
count of every guest thread of the process (another test's may end meanwhile)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.metrics import InMemoryMetrics
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.wasm import _cpu, create_wasm_sandbox
from wasm._guest_thread import guest_threads
from wasm._guest_thread import running as guest_running

SPIN_WAT = '(module (func (export "spin") (loop (br 0))))'
# A `_start` that never returns, for `run` (each run instantiates the module afresh).
SPIN_RUN_WAT = """
(module
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)
  (func $start (export "_start") (loop (br 0))))
"""
GENEROUS_S = 30.0


async def _until(condition: Callable[[], bool]) -> bool:
    loop = asyncio.get_running_loop()
    end = loop.time() + GENEROUS_S
    while loop.time() < end:
        if condition():
            return True
        await asyncio.sleep(0.01)
    return condition()


@pytest.mark.parametrize("how", ["call", "run"])
@pytest.mark.parametrize(
    "budgets",
    [
        pytest.param({}, id="no-budget"),
        # A whole core allowed: the CPU budget's own tick, not a breach, ends it.
        pytest.param({"cpuPercent": 100}, id="cpu-percent-100"),
        # Failed before: under wallClockMs alone the guest ran on until the budget ended it.
        pytest.param({"wallClockMs": 600_000}, id="wall-clock"),
        pytest.param({"wallClockMs": 600_000, "memoryMb": 16}, id="wall-clock-memory"),
        pytest.param({"wallClockMs": 600_000, "cpuPercent": 100}, id="wall-clock-cpu"),
    ],
)
async def test_dispose_ends_a_guest_that_never_returns_whatever_its_budgets(
    root: Path, wat: Callable[[str], Path], how: str, budgets: dict[str, int]
) -> None:
    policy = PermissionPolicy.from_manifest(
        {"name": "guest", "permissions": {"budgets": budgets}}, root=root
    )
    text = SPIN_WAT if how == "call" else SPIN_RUN_WAT
    metrics = InMemoryMetrics()
    sb = await create_wasm_sandbox(wasm_module_path=wat(text), policy=policy, metrics=metrics)
    pending = asyncio.ensure_future(sb.call("spin") if how == "call" else sb.run())
    # The guest thread took the call and holds the sandbox while it runs.
    assert await guest_running(sb), "the guest never started"
    threads = guest_threads(sb)
    assert threads
    await asyncio.sleep(0.05)
    assert not pending.done()
    await sb.dispose()
    # The guest ends and its thread with it.
    assert await _until(lambda: not any(t.is_alive() for t in threads)), "the guest kept running"
    done, _ = await asyncio.wait([pending], timeout=GENEROUS_S)
    assert pending in done
    with pytest.raises(SuaveplanError) as info:
        pending.result()
    assert info.value.code in {"SAND_WASM_DISPOSED", "SAND_CANCELLED"}
    # Ended by dispose(), not judged a breach of any budget.
    assert metrics.value("plugin.budget_exceeded_total") == 0


@pytest.mark.parametrize(
    "budgets",
    [
        pytest.param({}, id="no-budget"),
        pytest.param({"cpuPercent": 100}, id="cpu-percent-100"),
        pytest.param({"wallClockMs": 600_000}, id="wall-clock"),
    ],
)
async def test_a_call_still_queued_at_dispose_gets_the_coded_error_not_a_cancellation(
    root: Path, wat: Callable[[str], Path], budgets: dict[str, int]
) -> None:
    # Failed before without wallClockMs: the queued call was dropped by dispose() and its
    # caller got a bare asyncio.CancelledError, which reads as if its own task had been
    # cancelled. With wallClockMs it was already SAND_WASM_DISPOSED; now every call is.
    policy = PermissionPolicy.from_manifest(
        {"name": "guest", "permissions": {"budgets": budgets}}, root=root
    )
    sb = await create_wasm_sandbox(wasm_module_path=wat(SPIN_WAT), policy=policy)
    running = asyncio.ensure_future(sb.call("spin"))
    assert await guest_running(sb), "the guest never started"
    queued = asyncio.ensure_future(sb.call("spin"))  # behind the running one, on one thread
    await asyncio.sleep(0.05)
    assert not queued.done()
    await sb.dispose()
    # The running guest is ended by dispose() too, under wallClockMs as without it.
    tasks = [running, queued]
    done, _ = await asyncio.wait(tasks, timeout=GENEROUS_S)
    assert done == set(tasks)
    for task in tasks:
        assert not task.cancelled()
        error = task.exception()
        assert isinstance(error, SuaveplanError), repr(error)
        assert error.code in {"SAND_WASM_DISPOSED", "SAND_CANCELLED"}
    assert queued.exception().code == "SAND_WASM_DISPOSED"  # type: ignore[union-attr]


async def test_a_caller_that_cancels_its_own_call_still_sees_its_cancellation(
    root: Path, wat: Callable[[str], Path]
) -> None:
    # The other side of the mapping above: a task cancelled by its own caller stays cancelled.
    policy = PermissionPolicy.from_manifest({"name": "guest"}, root=root)
    sb = await create_wasm_sandbox(wasm_module_path=wat(SPIN_WAT), policy=policy)
    try:
        running = asyncio.ensure_future(sb.call("spin"))
        assert await guest_running(sb), "the guest never started"
        queued = asyncio.ensure_future(sb.call("spin"))
        await asyncio.sleep(0.05)
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        assert not running.done()
    finally:
        await sb.dispose()
    with pytest.raises(SuaveplanError):
        await asyncio.wait_for(running, GENEROUS_S)


@pytest.mark.parametrize("how", ["call", "run"])
@pytest.mark.parametrize("hook", ["epoch-callback", "no-epoch-callback"])
async def test_a_wall_clock_breach_under_wall_clock_alone_is_unchanged(
    root: Path,
    wat: Callable[[str], Path],
    monkeypatch: pytest.MonkeyPatch,
    how: str,
    hook: str,
) -> None:
    # The tick that now ends a disposed guest under wallClockMs alone also judges the budget;
    # where wasmtime cannot run it the plain epoch deadline does, as before. Either way the
    # breach is the same: BUDGET_EXCEEDED wallClockMs, counted once, the guest ended.
    if hook == "no-epoch-callback":
        monkeypatch.setattr(_cpu, "_installed_hook_problem", lambda: "the binding is gone")
    policy = PermissionPolicy.from_manifest(
        {"name": "guest", "permissions": {"budgets": {"wallClockMs": 100}}}, root=root
    )
    metrics = InMemoryMetrics()
    text = SPIN_WAT if how == "call" else SPIN_RUN_WAT
    sb = await create_wasm_sandbox(wasm_module_path=wat(text), policy=policy, metrics=metrics)
    try:
        assert (sb._ends_on_dispose is None) == (hook == "no-epoch-callback")
        with pytest.raises(SuaveplanError) as info:
            await asyncio.wait_for(sb.call("spin") if how == "call" else sb.run(), GENEROUS_S)
        assert info.value.code == "BUDGET_EXCEEDED"
        assert info.value.details == {"budget": "wallClockMs", "limit": 100}
        assert metrics.value("plugin.budget_exceeded_total", budget="wallClockMs") == 1
        assert sb.state == "ended"
        with pytest.raises(SuaveplanError) as again:
            await sb.call("spin")
        assert again.value.code == "SAND_WASM_ENDED"
        assert again.value.details == {"budget": "wallClockMs", "limit": 100}
        assert metrics.value("plugin.budget_exceeded_total") == 1
    finally:
        await sb.dispose()
