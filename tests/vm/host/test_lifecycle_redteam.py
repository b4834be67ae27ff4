"""Lifecycle red-team: what a crashed sandbox leaves behind, and the blocking facade's loop."""

from __future__ import annotations

import asyncio
import inspect
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from suaveplan_sandbox._loop_thread import LoopThread
from suaveplan_sandbox.adapters import Adapters, EventHandler
from suaveplan_sandbox.errors import SuaveplanError, WireValue
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.testing import InMemoryEvents
from suaveplan_sandbox.vm import VmSandbox, create_vm_sandbox

LISTENER = """
from suaveplan import events


@events.subscribe("orders.*")
def on_order(payload):
    pass


def echo(x):
    return x
"""


def _policy(tmp: Path) -> PermissionPolicy:
    return PermissionPolicy.from_manifest(
        {"name": "listener", "events": {"subscribes": ["orders.*"]}}, root=tmp
    )


async def test_dispose_after_a_crash_drops_the_subscriptions_from_a_shared_bus(
    tmp_path: Path,
) -> None:
    # A worker that dies (killed, a budget breach, a forged frame) closes the gateway at once;
    # the host's dispose must still take the sandbox's handlers off the host's bus, or the bus
    # keeps the dead sandbox alive and calls it for every event, for ever.
    (tmp_path / "p.py").write_text(LISTENER)
    bus = InMemoryEvents()
    sb = await create_vm_sandbox(
        plugin_module_path=tmp_path / "p.py",
        policy=_policy(tmp_path),
        proxies=Adapters(events=bus),
    )
    assert len(bus.subscriptions) == 1
    os.kill(sb.pid, signal.SIGKILL)
    with pytest.raises(SuaveplanError) as info:
        await sb.call("echo", 1)
    assert info.value.code == "SAND_VM_WORKER_CRASHED"
    await sb.dispose()
    assert bus.subscriptions == []


def test_the_blocking_loop_refuses_a_run_from_its_own_thread() -> None:
    # A host callback running on the facade's loop (an adapter, a bus handler) that calls the
    # blocking facade would wait on its own loop for ever: a coded error instead.
    lt = LoopThread("redteam-loop")
    try:

        async def inner() -> int:
            return 1

        async def outer() -> object:
            coro = inner()
            try:
                return lt.run(coro)
            except SuaveplanError as exc:
                return exc.code
            finally:
                coro.close()

        # The timeout only detects the deadlock; it never orders anything.
        fut = asyncio.run_coroutine_threadsafe(outer(), lt.loop)
        assert fut.result(timeout=60) == "SAND_INVALID_ARGUMENT"
    finally:
        lt.stop()


def test_stopping_the_blocking_loop_from_its_own_thread_is_refused_not_a_deadlock() -> None:
    # A facade disposed from a callback on its own loop would wait for that loop's tasks
    # from inside one of them: refused, and the loop is still stoppable from outside.
    lt = LoopThread("redteam-loop")
    try:

        async def stop_here() -> object:
            try:
                lt.stop()
            except SuaveplanError as exc:
                return exc.details.get("reason")
            return "stopped"

        fut = asyncio.run_coroutine_threadsafe(stop_here(), lt.loop)
        assert fut.result(timeout=60) == "blocking-call-on-own-loop"
    finally:
        lt.stop()
    assert lt.loop.is_closed()


PUBLISHER = """
from suaveplan import events


def pub():
    events.publish("orders.x", 1)
    return "published"


def echo(x):
    return x
"""


class _GatedBus:
    """A bus whose publish suspends until the test opens the gate."""

    def __init__(self) -> None:
        self._inner = InMemoryEvents()
        self.entered = asyncio.Event()
        self.gate = asyncio.Event()

    async def publish(self, plugin: str, topic: str, payload: WireValue) -> None:
        self.entered.set()
        await self.gate.wait()

    async def subscribe(self, plugin: str, pattern: str, handler: EventHandler) -> object:
        return await self._inner.subscribe(plugin, pattern, handler)


async def test_a_call_cancelled_during_its_host_call_does_not_answer_the_next(
    tmp_path: Path,
) -> None:
    (tmp_path / "p.py").write_text(PUBLISHER)
    bus = _GatedBus()
    policy = PermissionPolicy.from_manifest(
        {"name": "pub", "events": {"publishes": ["orders.*"]}}, root=tmp_path
    )
    async with await create_vm_sandbox(
        plugin_module_path=tmp_path / "p.py",
        policy=policy,
        proxies=Adapters(events=bus),
    ) as sb:
        first = asyncio.ensure_future(sb.call("pub"))
        await bus.entered.wait()
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        second = asyncio.ensure_future(sb.call("echo", "mine"))
        bus.gate.set()
        assert await second == "mine"
        assert await sb.call("echo", 2) == 2


def test_a_run_queued_when_the_loop_is_stopped_ends_instead_of_waiting_for_ever() -> None:
    # One thread calls a blocking facade while another disposes it: a run submitted just
    # before the stop must end (cancelled), not wait on a loop that never runs it again.
    lt = LoopThread("redteam-loop")
    entered, release = threading.Event(), threading.Event()

    async def blocker() -> None:
        entered.set()
        release.wait()  # holds the loop's thread, so what follows queues behind it

    async def late() -> str:
        return "ran"

    blocked = asyncio.run_coroutine_threadsafe(blocker(), lt.loop)
    entered.wait()
    pending = asyncio.run_coroutine_threadsafe(late(), lt.loop)
    queued = len(lt.loop._ready)  # type: ignore[attr-defined]
    stopper = threading.Thread(target=lt.stop)
    stopper.start()
    # The stop has queued its own work behind `late`'s submission (a condition, not a delay).
    while len(lt.loop._ready) <= queued:  # type: ignore[attr-defined]
        time.sleep(0.001)
    release.set()
    stopper.join(timeout=60)  # detects the hang only
    assert not stopper.is_alive()
    assert blocked.done()
    assert pending.done()


def test_a_run_after_stop_raises_the_coded_error_and_leaves_no_coroutine() -> None:
    lt = LoopThread("redteam-loop", disposed_code="SAND_VM_DISPOSED")
    lt.stop()

    async def late() -> str:
        return "ran"

    coro = late()
    with pytest.raises(SuaveplanError) as info:
        lt.run(coro)
    assert info.value.code == "SAND_VM_DISPOSED"
    assert inspect.getcoroutinestate(coro) == inspect.CORO_CLOSED  # no "never awaited"


COUNTER = """
CALLS = []


def bump():
    CALLS.append(1)
    return len(CALLS)
"""


def test_a_call_from_another_event_loop_is_refused_before_the_plugin_runs(
    tmp_path: Path,
) -> None:
    # The sandbox's state, its socket and its futures belong to the loop that created it: a
    # call awaited on another loop used to reach the worker (the plugin ran) from a second
    # thread, racing the owning loop's callbacks, then failed with asyncio's uncoded
    # "attached to a different loop".
    (tmp_path / "p.py").write_text(COUNTER)
    policy = PermissionPolicy.from_manifest({"name": "counter"}, root=tmp_path)
    lt = LoopThread("redteam-owner")
    try:

        async def create() -> object:
            return await create_vm_sandbox(
                plugin_module_path=tmp_path / "p.py", policy=policy, proxies=Adapters()
            )

        sb = lt.run(create())
        assert isinstance(sb, VmSandbox)

        async def elsewhere() -> object:
            return await sb.call("bump")

        with pytest.raises(SuaveplanError) as info:
            asyncio.run(elsewhere())
        assert info.value.code == "SAND_INVALID_ARGUMENT"
        assert sb.state == "idle"
        assert lt.run(sb.call("bump")) == 1  # the refused call never reached the plugin
        lt.run(sb.dispose())
    finally:
        lt.stop()
