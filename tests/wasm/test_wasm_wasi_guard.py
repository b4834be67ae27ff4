"""WASI calls that could hold host resources: `poll_oneoff` sleeps and `path_open` descriptors."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

import pytest

from _descriptors import descriptors_under
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.metrics import InMemoryMetrics
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.wasm import Errno, create_wasm_sandbox
from suaveplan_sandbox.wasm._wasi_guard import MAX_OPEN_FILES, MAX_POLL_SUBSCRIPTIONS
from wasm._guest_thread import guest_threads, released, running

HOUR_NS: Final = 3600 * 10**9
EVENTTYPE_CLOCK, EVENTTYPE_FD_WRITE = 0, 2
# Memory map: subscriptions at 0 (48 bytes each), events at 512 (32 bytes each), nevents
# at 200, clock_time_get's answer at 304, path_open's fd at 64, "a.txt" at 100.
GUARD_WAT: Final = """
(module
  (import "wasi_snapshot_preview1" "poll_oneoff" (func $poll (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "clock_time_get" (func $now (param i32 i64 i32) (result i32)))
  (import "wasi_snapshot_preview1" "path_open"
    (func $open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_close" (func $close (param i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_renumber" (func $renumber (param i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 100) "a.txt")
  (func $clock (param $at i32) (param $userdata i64) (param $clock i32) (param $ns i64)
      (param $abs i32)
    (i64.store (local.get $at) (local.get $userdata))
    (i32.store8 (i32.add (local.get $at) (i32.const 8)) (i32.const 0))
    (i32.store (i32.add (local.get $at) (i32.const 16)) (local.get $clock))
    (i64.store (i32.add (local.get $at) (i32.const 24)) (local.get $ns))
    (i32.store16 (i32.add (local.get $at) (i32.const 40)) (local.get $abs)))
  (func (export "sleep") (param $ns i64) (result i32)
    (call $clock (i32.const 0) (i64.const 0x1234) (i32.const 1) (local.get $ns) (i32.const 0))
    (call $poll (i32.const 0) (i32.const 512) (i32.const 1) (i32.const 200)))
  (func (export "sleep_until") (param $clock i32) (param $at i64) (result i32)
    (call $clock (i32.const 0) (i64.const 0x1234) (local.get $clock) (local.get $at) (i32.const 1))
    (call $poll (i32.const 0) (i32.const 512) (i32.const 1) (i32.const 200)))
  (func (export "sleep_on") (param $clock i32) (param $ns i64) (result i32)
    (call $clock (i32.const 0) (i64.const 0x1234) (local.get $clock) (local.get $ns) (i32.const 0))
    (call $poll (i32.const 0) (i32.const 512) (i32.const 1) (i32.const 200)))
  (func (export "two_clocks") (param $a i64) (param $b i64) (result i32)
    (call $clock (i32.const 0) (i64.const 1) (i32.const 1) (local.get $a) (i32.const 0))
    (call $clock (i32.const 48) (i64.const 2) (i32.const 1) (local.get $b) (i32.const 0))
    (call $poll (i32.const 0) (i32.const 512) (i32.const 2) (i32.const 200)))
  (func (export "clock_and_stdout") (param $ns i64) (result i32)
    (call $clock (i32.const 0) (i64.const 1) (i32.const 1) (local.get $ns) (i32.const 0))
    (i64.store (i32.const 48) (i64.const 77))
    (i32.store8 (i32.const 56) (i32.const 2))
    (i32.store (i32.const 64) (i32.const 1))
    (call $poll (i32.const 0) (i32.const 512) (i32.const 2) (i32.const 200)))
  (func (export "poll_raw") (param i32 i32 i32 i32) (result i32)
    (call $poll (local.get 0) (local.get 1) (local.get 2) (local.get 3)))
  (func (export "now") (param $clock i32) (result i64)
    (drop (call $now (local.get $clock) (i64.const 1) (i32.const 304)))
    (i64.load (i32.const 304)))
  (func (export "open") (result i32)
    (call $open (i32.const 3) (i32.const 0) (i32.const 100) (i32.const 5) (i32.const 0)
      (i64.const 2) (i64.const 0) (i32.const 0) (i32.const 64)))
  (func (export "open_many") (param $n i32) (result i32)
    (local $i i32) (local $ok i32)
    (loop $l
      (if (i32.eqz (call $open (i32.const 3) (i32.const 0) (i32.const 100) (i32.const 5)
                     (i32.const 0) (i64.const 2) (i64.const 0) (i32.const 0) (i32.const 64)))
        (then (local.set $ok (i32.add (local.get $ok) (i32.const 1)))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (local.get $n))))
    (local.get $ok))
  (func (export "close") (param i32) (result i32) (call $close (local.get 0)))
  (func (export "renumber") (param i32 i32) (result i32) (call $renumber (local.get 0) (local.get 1)))
  (func (export "load") (param i32) (result i32) (i32.load (local.get 0)))
  (func (export "load8") (param i32) (result i32) (i32.load8_u (local.get 0)))
  (func (export "load64") (param i32) (result i64) (i64.load (local.get 0)))
  (func (export "_start")
    (if (i32.ne (call $open (i32.const 3) (i32.const 0) (i32.const 100) (i32.const 5)
                  (i32.const 0) (i64.const 2) (i64.const 0) (i32.const 0) (i32.const 64))
                (i32.const 0))
      (then unreachable))))
"""


def policy(root: Path, **budgets: int) -> PermissionPolicy:
    return PermissionPolicy.from_manifest(
        {"name": "guest", "permissions": {"fs": ["uploads/*"], "budgets": budgets}}, root=root
    )


def _budget_count(metrics: InMemoryMetrics, budget: str) -> float:
    return metrics.value("plugin.budget_exceeded_total", plugin="guest", budget=budget)


async def test_a_guest_sleeping_past_its_wall_clock_budget_is_ended_and_lets_go_of_its_thread(
    root: Path, wat: Callable[[str], Path]
) -> None:
    metrics = InMemoryMetrics()
    sb = await create_wasm_sandbox(
        wasm_module_path=wat(GUARD_WAT), policy=policy(root, wallClockMs=100), metrics=metrics
    )
    with pytest.raises(SuaveplanError) as info:
        await sb.call("sleep", HOUR_NS)
    assert info.value.code == "BUDGET_EXCEEDED"
    assert info.value.details == {"budget": "wallClockMs", "limit": 100}
    assert _budget_count(metrics, "wallClockMs") == 1
    assert sb.state == "ended"
    threads = guest_threads(sb)
    await sb.dispose()
    # The thread (and with it the store) is not left sleeping for the hour the guest asked.
    assert await released(threads)


async def test_a_sleeping_guest_without_a_wall_clock_budget_wakes_when_disposed(
    root: Path, wat: Callable[[str], Path]
) -> None:
    sb = await create_wasm_sandbox(wasm_module_path=wat(GUARD_WAT), policy=policy(root))
    sleeping = asyncio.create_task(sb.call("sleep", HOUR_NS))
    assert await running(sb)
    await asyncio.sleep(0.2)
    assert not sleeping.done()
    threads = guest_threads(sb)
    await sb.dispose()
    with pytest.raises(SuaveplanError):
        await asyncio.wait_for(sleeping, timeout=10)
    assert await released(threads)


async def test_a_sleeping_guest_under_a_wall_clock_budget_wakes_when_disposed(
    root: Path, wat: Callable[[str], Path]
) -> None:
    # Asleep in the host's poll_oneoff, not in guest code: the wake event ends it, under a
    # wall-clock budget too (ten minutes: only dispose() ends it within the test's time).
    metrics = InMemoryMetrics()
    sb = await create_wasm_sandbox(
        wasm_module_path=wat(GUARD_WAT), policy=policy(root, wallClockMs=600_000), metrics=metrics
    )
    sleeping = asyncio.create_task(sb.call("sleep", HOUR_NS))
    assert await running(sb)
    await asyncio.sleep(0.2)
    assert not sleeping.done()
    threads = guest_threads(sb)
    await sb.dispose()
    with pytest.raises(SuaveplanError):
        await asyncio.wait_for(sleeping, timeout=10)
    assert await released(threads)
    assert _budget_count(metrics, "wallClockMs") == 0


async def test_a_short_sleep_sleeps_and_reports_its_clock_event(
    root: Path, wat: Callable[[str], Path]
) -> None:
    async with await create_wasm_sandbox(
        wasm_module_path=wat(GUARD_WAT), policy=policy(root, wallClockMs=5000, memoryMb=16)
    ) as sb:
        for clock in (0, 1):  # realtime, monotonic
            began = time.monotonic()
            assert await sb.call("sleep_on", clock, 20_000_000) == Errno.SUCCESS
            assert time.monotonic() - began >= 0.02  # never returns early
            assert await sb.call("load", 200) == 1  # nevents
            assert await sb.call("load64", 512) == 0x1234  # userdata
            assert await sb.call("load8", 512 + 10) == EVENTTYPE_CLOCK


async def test_an_absolute_timeout_is_met_on_the_guest_s_own_clock(
    root: Path, wat: Callable[[str], Path]
) -> None:
    async with await create_wasm_sandbox(
        wasm_module_path=wat(GUARD_WAT), policy=policy(root, wallClockMs=5000, memoryMb=16)
    ) as sb:
        for clock in (0, 1):  # realtime, monotonic
            target = await sb.call("now", clock) + 30_000_000
            assert await sb.call("sleep_until", clock, target) == Errno.SUCCESS
            assert await sb.call("now", clock) >= target
            assert await sb.call("load", 200) == 1
        # A time already past is due at once.
        assert await sb.call("sleep_until", 1, 0) == Errno.SUCCESS
        assert await sb.call("load", 200) == 1


async def test_only_the_clocks_due_are_reported(root: Path, wat: Callable[[str], Path]) -> None:
    async with await create_wasm_sandbox(
        wasm_module_path=wat(GUARD_WAT), policy=policy(root, wallClockMs=5000, memoryMb=16)
    ) as sb:
        assert await sb.call("two_clocks", HOUR_NS, 10_000_000) == Errno.SUCCESS
        assert await sb.call("load", 200) == 1
        assert await sb.call("load64", 512) == 2  # the second subscription's userdata


async def test_a_poll_with_an_fd_subscription_is_answered_by_wasmtime_at_once(
    root: Path, wat: Callable[[str], Path]
) -> None:
    async with await create_wasm_sandbox(
        wasm_module_path=wat(GUARD_WAT), policy=policy(root, wallClockMs=5000, memoryMb=16)
    ) as sb:
        assert await sb.call("clock_and_stdout", HOUR_NS) == Errno.SUCCESS
        assert await sb.call("load", 200) == 1
        assert await sb.call("load64", 512) == 77
        assert await sb.call("load8", 512 + 10) == EVENTTYPE_FD_WRITE


async def test_malformed_polls_get_an_errno(root: Path, wat: Callable[[str], Path]) -> None:
    async with await create_wasm_sandbox(
        wasm_module_path=wat(GUARD_WAT), policy=policy(root, wallClockMs=5000, memoryMb=16)
    ) as sb:
        assert await sb.call("poll_raw", 0, 512, 0, 200) == Errno.INVAL  # nothing to wait for
        assert await sb.call("sleep_on", 2, 1000) == Errno.INVAL  # a CPU-time clock
        assert await sb.call("poll_raw", 4, 512, 1, 200) == Errno.INVAL  # misaligned
        assert await sb.call("poll_raw", 65536 - 40, 512, 1, 200) == Errno.FAULT
        assert await sb.call("poll_raw", -8, 512, 1, 200) == Errno.FAULT
        too_many = MAX_POLL_SUBSCRIPTIONS + 1
        assert await sb.call("poll_raw", 0, 512, too_many, 200) == Errno.NOMEM
        assert await sb.call("poll_raw", 0, 512, -1, 200) == Errno.NOMEM


async def test_a_guest_holds_at_most_max_open_files_host_descriptors(
    root: Path, wat: Callable[[str], Path]
) -> None:
    async with await create_wasm_sandbox(
        wasm_module_path=wat(GUARD_WAT), policy=policy(root, wallClockMs=60_000, memoryMb=16)
    ) as sb:
        before = descriptors_under(root)
        assert await sb.call("open_many", 1000) == MAX_OPEN_FILES
        assert descriptors_under(root) - before <= MAX_OPEN_FILES
        assert await sb.call("open") == Errno.MFILE
        # Closing one frees its place; closing something it did not open frees nothing.
        first = 4  # after stdio (0-2) and the preopen (3)
        assert await sb.call("close", first) == Errno.SUCCESS
        assert await sb.call("close", first) == Errno.BADF
        assert await sb.call("open") == Errno.SUCCESS
        assert await sb.call("open") == Errno.MFILE
        # Renumbering one opened file onto another closes the target: one place is free.
        assert await sb.call("renumber", first + 1, first + 2) == Errno.SUCCESS
        assert await sb.call("open") == Errno.SUCCESS
        assert await sb.call("open") == Errno.MFILE
    assert descriptors_under(root) <= before


async def test_each_run_has_its_own_open_file_count_and_gives_its_files_back(
    root: Path, wat: Callable[[str], Path]
) -> None:
    async with await create_wasm_sandbox(
        wasm_module_path=wat(GUARD_WAT), policy=policy(root, wallClockMs=60_000, memoryMb=16)
    ) as sb:
        assert await sb.call("open_many", MAX_OPEN_FILES) == MAX_OPEN_FILES
        before = descriptors_under(root)
        assert (await sb.run()).exit_code == 0  # its own instance: its open succeeds
        assert descriptors_under(root) == before
