"""A guest held in host code past its wallClockMs (a synchronous adapter that does not return)
still ends with BUDGET_EXCEEDED at its budget plus `STUCK_GRACE_S`; the stuck thread is left
behind and, when the adapter finally returns, the guest runs no further."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

import pytest

from suaveplan_sandbox.adapters import Adapters, HttpRequest, HttpResponse
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.metrics import InMemoryMetrics
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.wasm import Errno, WasmSandbox, create_wasm_sandbox
from suaveplan_sandbox.wasm._sandbox import STUCK_GRACE_S

# `two` asks for SLOW (the adapter blocks), then for AFTER: a guest that ran on after the
# blocked import would ask for AFTER.
TWO_SECRETS_WAT: Final = """
(module
  (import "suaveplan" "secrets_get" (func $sg (param i32 i32 i32 i32 i32) (result i32)))
  (import "suaveplan" "sock_connect" (func $sc (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "SLOW")
  (data (i32.const 16) "AFTER")
  (data (i32.const 32) "api.example.com")
  (func (export "two") (result i32)
    (drop (call $sg (i32.const 0) (i32.const 4) (i32.const 256) (i32.const 64) (i32.const 512)))
    (call $sg (i32.const 16) (i32.const 5) (i32.const 256) (i32.const 64) (i32.const 512)))
  (func (export "connect_then_secret") (result i32)
    (drop (call $sc (i32.const 32) (i32.const 15) (i32.const 443) (i32.const 520)))
    (call $sg (i32.const 16) (i32.const 5) (i32.const 256) (i32.const 64) (i32.const 512)))
  (func (export "answer") (result i32) (i32.const 42)))
"""


class _BlockingSecrets:
    """A synchronous adapter: SLOW blocks the calling thread until `release`."""

    def __init__(self, *, block_s: float = 30.0) -> None:
        self.release = threading.Event()
        self.returned = threading.Event()
        self.requested: list[str] = []
        self._block_s = block_s

    def get(self, name: str) -> str:
        self.requested.append(name)
        if name == "SLOW":
            self.release.wait(self._block_s)
            self.returned.set()
        return "value"


class _BlockingFetch:
    """A synchronous connect that blocks until `release`, then hands out a real socket."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.returned = threading.Event()
        self.given: list[socket.socket] = []

    def request(self, request: HttpRequest) -> HttpResponse:
        raise AssertionError("not used")

    def connect(self, host: str, port: int, *, rule: str) -> socket.socket:
        self.release.wait(30)
        ours, theirs = socket.socketpair()
        theirs.close()
        self.given.append(ours)
        self.returned.set()
        return ours


def _policy(root: Path, **budgets: int) -> PermissionPolicy:
    return PermissionPolicy.from_manifest(
        {
            "name": "guest",
            "permissions": {"budgets": budgets, "fetch": ["api.example.com"]},
            "secrets": [{"name": "SLOW"}, {"name": "AFTER"}],
        },
        root=root,
    )


async def _wait_for(event: threading.Event) -> None:
    assert await asyncio.to_thread(event.wait, 5), "the adapter never returned"


async def _guest_thread_free(sb: WasmSandbox) -> None:
    """Until the sandbox's one guest thread has finished the call it was held in: a no-op
    queued behind it runs only then (a liveness guard, not a timing assertion)."""
    assert sb._executor is not None
    free = asyncio.wrap_future(sb._executor.submit(lambda: "free"))
    assert await asyncio.wait_for(free, 30) == "free"


@pytest.mark.parametrize(
    "budgets",
    [{"wallClockMs": 150}, {"wallClockMs": 150, "cpuPercent": 100}],
    ids=["epoch-deadline", "cpu-callback"],
)
async def test_a_guest_stuck_in_a_sync_adapter_ends_at_its_budget_and_runs_no_further(
    root: Path, wat: Callable[[str], Path], budgets: dict[str, int]
) -> None:
    secrets = _BlockingSecrets()
    metrics = InMemoryMetrics()
    sb = await create_wasm_sandbox(
        wasm_module_path=wat(TWO_SECRETS_WAT),
        policy=_policy(root, **budgets),
        proxies=Adapters(secrets=secrets),
        metrics=metrics,
    )
    try:
        began = time.monotonic()
        with pytest.raises(SuaveplanError) as info:
            await asyncio.wait_for(sb.call("two"), 10)
        took = time.monotonic() - began
        # Answered while the adapter still held the guest thread (it holds it 30 s, past the
        # 10 s above): the call was not left waiting for the adapter. Not a time bound: on a
        # loaded machine the answer may come well after budget + STUCK_GRACE_S.
        assert not secrets.returned.is_set()
        assert info.value.code == "BUDGET_EXCEEDED"
        assert info.value.details["budget"] == "wallClockMs"
        assert took >= 0.15, took  # never before the budget
        assert sb.state == "ended"
        with pytest.raises(SuaveplanError) as later:
            await sb.call("answer")
        assert later.value.code == "SAND_WASM_ENDED"
        # The adapter returns at last: the guest must not go on to ask for AFTER.
        secrets.release.set()
        await _wait_for(secrets.returned)
        await _guest_thread_free(sb)  # the stuck call has unwound, whatever it did next
        assert secrets.requested == ["SLOW"]
        assert metrics.value("plugin.budget_exceeded_total", plugin="guest") == 1
    finally:
        secrets.release.set()
        await sb.dispose()
        await sb.dispose()
    assert sb.state == "disposed"


async def test_a_socket_handed_out_after_the_call_was_abandoned_is_closed(
    root: Path, wat: Callable[[str], Path]
) -> None:
    fetch, secrets = _BlockingFetch(), _BlockingSecrets()
    sb = await create_wasm_sandbox(
        wasm_module_path=wat(TWO_SECRETS_WAT),
        policy=_policy(root, wallClockMs=100),
        proxies=Adapters(fetch=fetch, secrets=secrets),
    )
    try:
        with pytest.raises(SuaveplanError) as info:
            await asyncio.wait_for(sb.call("connect_then_secret"), 10)
        assert info.value.code == "BUDGET_EXCEEDED"
        fetch.release.set()
        await _wait_for(fetch.returned)
        for _ in range(3000):  # a liveness guard, not a timing assertion
            if fetch.given[0].fileno() == -1:
                break
            await asyncio.sleep(0.01)
        assert fetch.given[0].fileno() == -1  # closed, not kept by an ended sandbox
        assert secrets.requested == []
    finally:
        fetch.release.set()
        await sb.dispose()


async def test_a_call_queued_behind_a_stuck_call_is_refused_not_left_waiting(
    root: Path, wat: Callable[[str], Path]
) -> None:
    secrets = _BlockingSecrets()
    sb = await create_wasm_sandbox(
        wasm_module_path=wat(TWO_SECRETS_WAT),
        policy=_policy(root, wallClockMs=100),
        proxies=Adapters(secrets=secrets),
    )
    try:
        stuck = asyncio.ensure_future(sb.call("two"))
        queued = asyncio.ensure_future(sb.call("answer"))
        outcomes = await asyncio.wait_for(asyncio.gather(stuck, queued, return_exceptions=True), 10)
        codes = [o.code if isinstance(o, SuaveplanError) else o for o in outcomes]
        assert codes == ["BUDGET_EXCEEDED", "SAND_WASM_ENDED"]
    finally:
        secrets.release.set()
        await sb.dispose()


async def test_without_a_wall_clock_budget_a_slow_sync_adapter_is_waited_for(
    root: Path, wat: Callable[[str], Path]
) -> None:
    secrets = _BlockingSecrets(block_s=STUCK_GRACE_S + 0.3)
    async with await create_wasm_sandbox(
        wasm_module_path=wat(TWO_SECRETS_WAT),
        policy=_policy(root),
        proxies=Adapters(secrets=secrets),
    ) as sb:
        assert await sb.call("two") == Errno.SUCCESS
        assert secrets.requested == ["SLOW", "AFTER"]
        assert sb.state == "ready"


async def test_a_sync_adapter_that_returns_within_the_budget_is_no_breach(
    root: Path, wat: Callable[[str], Path]
) -> None:
    secrets = _BlockingSecrets(block_s=0.05)
    metrics = InMemoryMetrics()
    async with await create_wasm_sandbox(
        wasm_module_path=wat(TWO_SECRETS_WAT),
        policy=_policy(root, wallClockMs=2000),
        proxies=Adapters(secrets=secrets),
        metrics=metrics,
    ) as sb:
        assert await sb.call("two") == Errno.SUCCESS
        assert await sb.call("answer") == 42
    assert metrics.value("plugin.budget_exceeded_total") == 0
