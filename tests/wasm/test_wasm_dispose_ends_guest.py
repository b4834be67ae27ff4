"""`dispose()` ends a guest that never returns when no `wallClockMs` would.

Without a budget nothing else stops guest code: before, a guest looping in a call kept its
thread and a core busy for the life of the process after its sandbox was disposed, and kept
its store's preopened directories. Ordering and generous deadlines, never a timing assert.

The guest is disposed only once its thread has taken the call (it holds the sandbox's lock
while the call runs): a call still queued at dispose() is dropped, never run, which is
another route than the one under test. The thread watched is this sandbox's own, never a
count of every guest thread of the process (another test's may end meanwhile)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.wasm import WasmSandbox, create_wasm_sandbox

SPIN_WAT = '(module (func (export "spin") (loop (br 0))))'
# A `_start` that never returns, for `run` (each run instantiates the module afresh).
SPIN_RUN_WAT = """
(module
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)
  (func $start (export "_start") (loop (br 0))))
"""
GENEROUS_S = 30.0


def _guest_threads(sb: WasmSandbox) -> list[threading.Thread]:
    # The executor thread this sandbox runs its guest on (not the process-wide epoch ticker).
    executor = sb._executor
    return [] if executor is None else list(executor._threads)


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
    ],
)
async def test_dispose_ends_a_guest_that_never_returns_without_a_wall_clock_budget(
    root: Path, wat: Callable[[str], Path], how: str, budgets: dict[str, int]
) -> None:
    policy = PermissionPolicy.from_manifest(
        {"name": "guest", "permissions": {"budgets": budgets}}, root=root
    )
    text = SPIN_WAT if how == "call" else SPIN_RUN_WAT
    sb = await create_wasm_sandbox(wasm_module_path=wat(text), policy=policy)
    pending = asyncio.ensure_future(sb.call("spin") if how == "call" else sb.run())
    # The guest thread took the call and holds the sandbox while it runs.
    assert await _until(sb._lock.locked), "the guest never started"
    threads = _guest_threads(sb)
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
