"""A module's start function is guest code: it runs off the event loop, under the budgets."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Final

import pytest
import wasmtime

from suaveplan_sandbox.adapters import Adapters
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.metrics import InMemoryMetrics
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.wasm import _engine, create_wasm_sandbox
from suaveplan_sandbox.wasm._instrument import declares_start
from suaveplan_sandbox.wasm._sandbox import STUCK_GRACE_S

LOOPING_START: Final = """
(module
  (func $forever (loop (br 0)))
  (start $forever)
  (func (export "answer") (result i32) (i32.const 42)))
"""
# Loops forever when started with arguments: a create (no argv) instantiates it, a run with
# argv spins in the start function, before `_start`.
LOOPING_START_WITH_ARGV: Final = """
(module
  (import "wasi_snapshot_preview1" "args_sizes_get" (func $sizes (param i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func $maybe_forever
    (drop (call $sizes (i32.const 0) (i32.const 4)))
    (if (i32.load (i32.const 0)) (then (loop (br 0)))))
  (start $maybe_forever)
  (func (export "_start"))
  (func (export "answer") (result i32) (i32.const 42)))
"""
# Asks for the secret GO until it reads "go" (at most 5000 times), then keeps the count.
WAITS_FOR_THE_LOOP: Final = """
(module
  (import "suaveplan" "secrets_get" (func $sg (param i32 i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "GO")
  (global $asked (mut i32) (i32.const 0))
  (func $wait
    (loop $again
      (global.set $asked (i32.add (global.get $asked) (i32.const 1)))
      (drop (call $sg (i32.const 0) (i32.const 2) (i32.const 256) (i32.const 16) (i32.const 512)))
      (br_if $again (i32.and
        (i32.ne (i32.load16_u (i32.const 256)) (i32.const 0x6f67))  ;; "go"
        (i32.lt_u (global.get $asked) (i32.const 5000))))))
  (start $wait)
  (func (export "saw_go") (result i32) (i32.eq (i32.load16_u (i32.const 256)) (i32.const 0x6f67))))
"""
SECRET_IN_START: Final = """
(module
  (import "suaveplan" "secrets_get" (func $sg (param i32 i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "SLOW")
  (func $ask (drop (call $sg (i32.const 0) (i32.const 4) (i32.const 256) (i32.const 16) (i32.const 512))))
  (start $ask))
"""
TRAPPING_START: Final = """
(module (func $boom unreachable) (start $boom) (func (export "answer") (result i32) (i32.const 1)))
"""


def policy(root: Path, budgets: dict[str, int], **extra: object) -> PermissionPolicy:
    return PermissionPolicy.from_manifest(
        {"name": "guest", "permissions": {"budgets": budgets}, **extra}, root=root
    )


def _budget_count(metrics: InMemoryMetrics, budget: str) -> float:
    return metrics.value("plugin.budget_exceeded_total", plugin="guest", budget=budget)


class _GoSecrets:
    """A synchronous adapter: "wait" until `go` is set, then "go"."""

    def __init__(self) -> None:
        self.go = threading.Event()

    def get(self, name: str) -> str:
        return "go" if self.go.wait(0.001) else "wait"


class _BlockingSecrets:
    def __init__(self) -> None:
        self.release = threading.Event()
        self.returned = threading.Event()

    def get(self, name: str) -> str:
        self.release.wait(30)
        self.returned.set()
        return "value"


def test_the_engine_knows_which_modules_have_a_start_function(
    wat: Callable[[str], Path],
) -> None:
    assert _engine.has_start(_engine.load_module_file(wat(LOOPING_START)))
    plain = wat('(module (func (export "answer") (result i32) (i32.const 1)))')
    assert not _engine.has_start(_engine.load_module_file(plain))
    # Bytes whose sections cannot be walked are assumed to have one (kept off the loop).
    assert declares_start(b"\0asm\x01\0\0\0\x08\xff")
    assert declares_start(b"\0asm\x0d\0\x01\0")


async def test_a_looping_start_function_ends_create_at_the_wall_clock_budget(
    root: Path, wat: Callable[[str], Path]
) -> None:
    metrics = InMemoryMetrics()
    with pytest.raises(SuaveplanError) as info:
        await create_wasm_sandbox(
            wasm_module_path=wat(LOOPING_START),
            policy=policy(root, {"wallClockMs": 100}),
            metrics=metrics,
        )
    assert info.value.code == "BUDGET_EXCEEDED"
    assert info.value.details == {"budget": "wallClockMs", "limit": 100}
    assert _budget_count(metrics, "wallClockMs") == 1


async def test_a_spinning_start_function_ends_create_at_the_cpu_budget(
    root: Path, wat: Callable[[str], Path]
) -> None:
    metrics = InMemoryMetrics()
    with pytest.raises(SuaveplanError) as info:
        await create_wasm_sandbox(
            wasm_module_path=wat(LOOPING_START),
            policy=policy(root, {"cpuPercent": 20, "wallClockMs": 600_000}),
            metrics=metrics,
        )
    assert info.value.code == "BUDGET_EXCEEDED"
    assert info.value.details["budget"] == "cpuPercent"
    assert _budget_count(metrics, "cpuPercent") == 1


async def test_the_event_loop_runs_other_tasks_while_a_start_function_runs(
    root: Path, wat: Callable[[str], Path]
) -> None:
    secrets = _GoSecrets()

    async def say_go() -> None:
        secrets.go.set()

    task = asyncio.create_task(say_go())  # runs only if create lets the loop turn
    async with await create_wasm_sandbox(
        wasm_module_path=wat(WAITS_FOR_THE_LOOP),
        policy=policy(root, {}, secrets=[{"name": "GO"}]),
        proxies=Adapters(secrets=secrets),
    ) as sb:
        assert await sb.call("saw_go") == 1
    await task


async def test_a_looping_start_function_ends_a_run_at_the_wall_clock_budget(
    root: Path, wat: Callable[[str], Path]
) -> None:
    metrics = InMemoryMetrics()
    async with await create_wasm_sandbox(
        wasm_module_path=wat(LOOPING_START_WITH_ARGV),
        policy=policy(root, {"wallClockMs": 100}),
        metrics=metrics,
    ) as sb:
        assert (await sb.run()).exit_code == 0  # no argv: the start function returns
        with pytest.raises(SuaveplanError) as info:
            await asyncio.wait_for(sb.run(argv=["spin"]), timeout=30)
        assert info.value.code == "BUDGET_EXCEEDED"
        assert info.value.details == {"budget": "wallClockMs", "limit": 100}
        assert _budget_count(metrics, "wallClockMs") == 1
        assert sb.state == "ended"
        with pytest.raises(SuaveplanError) as later:
            await sb.call("answer")
        assert later.value.code == "SAND_WASM_ENDED"


async def test_a_start_function_held_in_a_synchronous_adapter_is_abandoned_at_the_budget(
    root: Path, wat: Callable[[str], Path]
) -> None:
    secrets = _BlockingSecrets()
    metrics = InMemoryMetrics()
    try:
        with pytest.raises(SuaveplanError) as info:
            await asyncio.wait_for(
                create_wasm_sandbox(
                    wasm_module_path=wat(SECRET_IN_START),
                    policy=policy(root, {"wallClockMs": 100}, secrets=[{"name": "SLOW"}]),
                    proxies=Adapters(secrets=secrets),
                    metrics=metrics,
                ),
                timeout=100 / 1000 + STUCK_GRACE_S + 10,
            )
        assert info.value.code == "BUDGET_EXCEEDED"
        assert info.value.details["budget"] == "wallClockMs"
        assert not secrets.returned.is_set()  # answered while the adapter still held the thread
        assert _budget_count(metrics, "wallClockMs") == 1
    finally:
        secrets.release.set()
    assert await asyncio.to_thread(secrets.returned.wait, 10)


# -- traps in the start function ------------------------------------------------------------

# Traps in its start function when run with arguments (a create passes none).
TRAPPING_START_WITH_ARGV: Final = """
(module
  (import "wasi_snapshot_preview1" "args_sizes_get" (func $sizes (param i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func $maybe_trap
    (drop (call $sizes (i32.const 0) (i32.const 4)))
    (if (i32.load (i32.const 0)) (then (drop (i32.div_u (i32.const 1) (i32.const 0))))))
  (start $maybe_trap)
  (func (export "_start"))
  (func (export "answer") (result i32) (i32.const 42)))
"""
# The start function's name is the guest's text: it must not reach the details.
NAMED_TRAPPING_START: Final = """
(module
  (func $hunter2_private_name unreachable)
  (start $hunter2_private_name)
  (func (export "boom") unreachable))
"""
# A data segment past the memory's end traps while the module is instantiated, before any
# guest code runs (with or without a start function).
SEGMENT_OUT_OF_BOUNDS: Final = """
(module (memory 1) (data (i32.const 70000) "x") (func $s) {start})
"""


async def test_a_trapping_start_function_fails_create_as_a_trap_like_a_call(
    root: Path, wat: Callable[[str], Path]
) -> None:
    with pytest.raises(SuaveplanError) as info:
        await create_wasm_sandbox(
            wasm_module_path=wat(TRAPPING_START), policy=policy(root, {"wallClockMs": 1000})
        )
    assert info.value.code == "SAND_WASM_TRAP"
    assert info.value.details == {"stage": "start", "trap": "unreachable"}
    assert isinstance(info.value.__cause__, wasmtime.Trap)
    # A trap in a call: the same code, and the same details but for the stage.
    async with await create_wasm_sandbox(
        wasm_module_path=wat(NAMED_TRAPPING_START.replace("(start $hunter2_private_name)", "")),
        policy=policy(root, {}),
    ) as sb:
        with pytest.raises(SuaveplanError) as in_call:
            await sb.call("boom")
    assert in_call.value.code == "SAND_WASM_TRAP"
    assert in_call.value.details == {"stage": "call", "trap": "unreachable"}


async def test_a_start_function_trap_names_its_kind_and_nothing_the_guest_wrote(
    root: Path, wat: Callable[[str], Path]
) -> None:
    with pytest.raises(SuaveplanError) as info:
        await create_wasm_sandbox(
            wasm_module_path=wat(NAMED_TRAPPING_START), policy=policy(root, {})
        )
    assert info.value.details == {"stage": "start", "trap": "unreachable"}
    assert "hunter2" not in repr(info.value.details) + info.value.message


async def test_a_start_function_trapping_in_a_run_is_a_trap_and_the_sandbox_serves_on(
    root: Path, wat: Callable[[str], Path]
) -> None:
    async with await create_wasm_sandbox(
        wasm_module_path=wat(TRAPPING_START_WITH_ARGV), policy=policy(root, {"wallClockMs": 1000})
    ) as sb:
        with pytest.raises(SuaveplanError) as info:
            await sb.run(argv=["trap"])
        assert info.value.code == "SAND_WASM_TRAP"
        assert info.value.details == {"stage": "start", "trap": "integer-division-by-zero"}
        assert sb.state == "ready"
        assert (await sb.run()).exit_code == 0
        assert await sb.call("answer") == 42


@pytest.mark.parametrize("start", ["(start $s)", ""], ids=["with-start", "without-start"])
async def test_a_segment_trapping_before_any_guest_code_is_still_an_instantiation_failure(
    root: Path, wat: Callable[[str], Path], start: str
) -> None:
    with pytest.raises(SuaveplanError) as info:
        await create_wasm_sandbox(
            wasm_module_path=wat(SEGMENT_OUT_OF_BOUNDS.format(start=start)),
            policy=policy(root, {"wallClockMs": 1000}),
        )
    assert info.value.code == "SAND_WASM_INSTANTIATION_FAILED"
    assert info.value.details == {"stage": "instantiate"}
