"""A call waiting for its answer inline (`vm/_inline_wait.py`): only while no other sandbox of
the loop is busy, never for longer than its bounds, and never at the cost of the loop's
other work or of a call's answer.

"Without a turn of the loop" is observed with a callback queued just before the call: it
runs on the loop's next turn, so it has not run when the call returns if, and only if, the
call returned without one. Tests that need an answer to come inline whatever the machine's
load widen every window involved (`_wide`) instead of timing anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest
import uvloop

from suaveplan_sandbox.adapters import Adapters, EventHandler
from suaveplan_sandbox.errors import SuaveplanError, WireValue
from suaveplan_sandbox.permissions import PermissionPolicy, _accel
from suaveplan_sandbox.testing import InMemoryFs
from suaveplan_sandbox.vm import VmSandbox, _inline_wait, _worker_loop, create_vm_sandbox
from suaveplan_sandbox.vm import _sandbox as vm_sandbox_module
from suaveplan_sandbox.vm._inline_wait import MAX_HOLD_MS, LoopShare, loop_share
from suaveplan_sandbox.vm._worker_loop import AdaptivePoll

T = TypeVar("T")

PLUGIN = """
import datetime

import suaveplan


def noop():
    return None


def read(path):
    return suaveplan.fs.read_bytes(path)


def spin_for(seconds):
    end = datetime.datetime.now() + datetime.timedelta(seconds=seconds)
    while datetime.datetime.now() < end:
        pass
    return "spun"


def chatter(seconds):
    # Frame after frame, each within microseconds of the last, for `seconds`.
    end = datetime.datetime.now() + datetime.timedelta(seconds=seconds)
    lines = 0
    while datetime.datetime.now() < end:
        print("line", lines)
        lines += 1
    return lines
"""


def _policy(root: Path, **budgets: int) -> PermissionPolicy:
    manifest: dict[str, Any] = {"name": "inline", "permissions": {"fs": ["./data/*"]}}
    if budgets:
        manifest["permissions"]["budgets"] = budgets
    return PermissionPolicy.from_manifest(manifest, root=root)


async def _sandbox(tmp_path: Path, **kwargs: Any) -> VmSandbox:
    path = tmp_path / "p.py"
    path.write_text(PLUGIN)
    kwargs.setdefault("proxies", Adapters(fs=InMemoryFs({"data/a.bin": b"a" * 1024})))
    kwargs.setdefault("policy", _policy(tmp_path))
    return await create_vm_sandbox(plugin_module_path=path, **kwargs)


@pytest.fixture
def wide(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inline waits (and holds of the loop) long enough for any answer a loaded machine
    gives; sandboxes get the same polling window through `_wide`."""
    monkeypatch.setattr(vm_sandbox_module, "INLINE_WAIT_US", 10_000_000)
    monkeypatch.setattr(vm_sandbox_module, "MAX_HOLD_S", 10.0)
    monkeypatch.setattr(_inline_wait, "MAX_HOLD_S", 10.0)


def _wide(sb: VmSandbox) -> VmSandbox:
    """The host polls for 10 s: an answer late on a loaded machine does not turn it off."""
    sb._poll = AdaptivePoll(10.0)
    return sb


async def _without_turn(call: Callable[[], Awaitable[T]]) -> tuple[T, bool]:
    """(the call's answer, whether it came without a turn of the loop)."""
    turned: list[bool] = []
    asyncio.get_running_loop().call_soon(turned.append, True)
    answer = await call()
    return answer, not turned


async def _turns_during(call: Awaitable[T]) -> tuple[T, int]:
    """(the call's answer, how many times a second task ran while it was in flight)."""
    turns = 0
    done = False

    async def ticker() -> None:
        nonlocal turns
        while not done:
            turns += 1
            await asyncio.sleep(0)

    tick = asyncio.ensure_future(ticker())
    await asyncio.sleep(0)  # the ticker is running
    start = turns
    try:
        answer = await call
        seen = turns - start
    finally:
        done = True
        await tick
    return answer, seen


# -- when a call waits inline -------------------------------------------------------------


@pytest.mark.usefixtures("wide")
async def test_a_call_and_a_proxied_read_are_answered_without_a_turn_of_the_loop(
    tmp_path: Path,
) -> None:
    async with _wide(await _sandbox(tmp_path)) as sb:
        assert await _without_turn(lambda: sb.call("noop")) == (None, True)
        # The worker's host call, the gateway's answer and the result, all in the one wait.
        read = await _without_turn(lambda: sb.call("read", "./data/a.bin"))
        assert read == (b"a" * 1024, True)
        assert loop_share(asyncio.get_running_loop()).busy == 0


@pytest.mark.usefixtures("wide")
async def test_without_polling_a_call_always_waits_on_the_loop(tmp_path: Path) -> None:
    async with await _sandbox(tmp_path, busy_poll_us=0) as sb:
        for _ in range(3):
            assert await _without_turn(lambda: sb.call("noop")) == (None, False)


@pytest.mark.usefixtures("wide")
async def test_while_another_sandbox_is_busy_a_call_waits_on_the_loop(tmp_path: Path) -> None:
    async with await _sandbox(tmp_path) as busy, _wide(await _sandbox(tmp_path)) as sb:
        assert await _without_turn(lambda: sb.call("noop")) == (None, True)
        slow = asyncio.ensure_future(busy.call("spin_for", 0.3))
        await asyncio.sleep(0.05)  # its job is in flight: its answer must not wait on ours
        assert loop_share(asyncio.get_running_loop()).busy == 1
        assert await _without_turn(lambda: sb.call("noop")) == (None, False)
        assert await slow == "spun"
        assert await _without_turn(lambda: sb.call("noop")) == (None, True)


async def test_a_host_call_that_suspends_is_answered_through_the_loop(tmp_path: Path) -> None:
    async with await _sandbox(
        tmp_path, proxies=Adapters(fs=InMemoryFs({"data/a.bin": b"a" * 1024}, delay=0.05))
    ) as sb:
        await sb.call("noop")
        answer, turns = await _turns_during(sb.call("read", "./data/a.bin"))
        assert answer == b"a" * 1024
        assert turns > 0  # the wait stopped at the host call; the loop ran the adapter


class _SyncBus:
    """An events adapter that delivers synchronously, inside `publish` (the protocol allows
    a plain method): the handler's coroutine is run to its end right there."""

    def __init__(self) -> None:
        self.handlers: list[EventHandler] = []

    def publish(self, plugin: str, topic: str, payload: WireValue) -> None:
        for handler in self.handlers:
            coro = handler(topic, payload)
            assert isinstance(coro, Coroutine)
            with contextlib.suppress(StopIteration):
                coro.send(None)
            coro.close()

    def subscribe(self, plugin: str, pattern: str, handler: EventHandler) -> _SyncBus:
        self.handlers.append(handler)
        return self

    def close(self) -> None:
        self.handlers.clear()


PUBLISHER = """
import datetime

from suaveplan import events


@events.subscribe("t")
def on_t(payload):
    pass


def publish_then_spin(seconds):
    events.publish("t", 1)
    end = datetime.datetime.now() + datetime.timedelta(seconds=seconds)
    while datetime.datetime.now() < end:
        pass
    return "spun"
"""


@pytest.mark.usefixtures("wide")
async def test_a_host_call_that_starts_another_sandboxs_job_ends_the_inline_wait(
    tmp_path: Path,
) -> None:
    # The host call completes inline, but it began a delivery on the listener: that answer
    # must not wait for the publisher's call. With the publisher's wait ended, the loop reads
    # the listener's answer while the publisher still spins.
    bus = _SyncBus()
    (tmp_path / "pub.py").write_text(PUBLISHER)
    events = {"publishes": ["t"], "subscribes": ["t"]}
    policy = PermissionPolicy.from_manifest({"name": "pub", "events": events}, root=tmp_path)
    adapters = Adapters(events=bus)
    make = functools.partial(
        create_vm_sandbox, plugin_module_path=tmp_path / "pub.py", policy=policy, proxies=adapters
    )
    async with _wide(await make()) as publisher, await make() as listener:
        assert await publisher.call("publish_then_spin", 0) == "spun"
        # Both got the event; the publisher's own delivery was queued behind its call.
        while publisher.events_delivered + listener.events_delivered < 2:
            await asyncio.sleep(0.01)
        assert await publisher.call("publish_then_spin", 0.3) == "spun"
        assert listener.events_delivered == 2  # read while the publisher's call ran


# -- what an inline wait may not hold back ------------------------------------------------


@pytest.mark.parametrize("loop_factory", [asyncio.new_event_loop, uvloop.new_event_loop])
def test_calls_answered_inline_still_let_the_loop_turn(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    loop_factory: Callable[[], asyncio.AbstractEventLoop],
) -> None:
    # A task calling in a tight loop: calls answered inline never yield, so once the loop has
    # been held MAX_HOLD_MS a call waits on it, and the loop's other tasks get their turn.
    # On uvloop too. (No slow answer ends a wait early here: only the hold can let the loop
    # turn.)
    monkeypatch.setattr(vm_sandbox_module, "INLINE_WAIT_US", 10_000_000)

    async def main() -> tuple[int, int]:
        async with _wide(await _sandbox(tmp_path)) as sb:

            async def many() -> int:
                calls, end = 0, time.monotonic() + 0.3
                while time.monotonic() < end:
                    await sb.call("noop")
                    calls += 1
                return calls

            return await _turns_during(many())

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        calls, turns = runner.run(main())
    # 0.3 s is 150 holds of 2 ms; a call that waited on the loop turned it too.
    assert turns >= 10, (calls, turns)


async def test_a_worker_sending_frame_after_frame_holds_the_loop_no_longer_than_max_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each line is a frame arriving within the window of the last (a window wide enough that
    # no pause of the worker's ends the wait either): only the wait's own bound, MAX_HOLD_MS,
    # ends it, and then the loop reads the rest through its reader callback.
    monkeypatch.setattr(vm_sandbox_module, "INLINE_WAIT_US", 10_000_000)
    async with _wide(await _sandbox(tmp_path, log_lines_per_s=1)) as sb:
        lines, turns = await _turns_during(sb.call("chatter", 0.3))
        assert isinstance(lines, int)
        assert lines > 100
        assert turns >= 10, (lines, turns)


async def test_a_slow_answer_ends_the_inline_wait_after_its_window(tmp_path: Path) -> None:
    async with _wide(await _sandbox(tmp_path)) as sb:
        answer, turns = await _turns_during(sb.call("spin_for", 0.2))
        assert answer == "spun"
        assert turns >= 10  # the loop was free while the plugin ran


@pytest.mark.parametrize("native", [True, False], ids=["c", "python"])
def test_on_uvloop_an_inline_wait_ends_after_its_window_too(tmp_path: Path, native: bool) -> None:
    # The loop the host runs must not matter: on uvloop, with the polling wait in C and in
    # Python, a slow answer ends the wait and the loop runs while the plugin does.
    async def main() -> tuple[object, int]:
        with _accel.accelerated() if native else _accel.pure_python():
            sb = _wide(await _sandbox(tmp_path))
        async with sb:
            return await _turns_during(sb.call("spin_for", 0.2))

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        answer, turns = runner.run(main())
    assert answer == "spun"
    assert turns >= 10


@pytest.mark.usefixtures("wide")
async def test_a_worker_killed_during_an_inline_wait_fails_the_call_with_a_coded_error(
    tmp_path: Path,
) -> None:
    async with _wide(await _sandbox(tmp_path)) as sb:
        killer = threading.Timer(0.1, os.kill, args=(sb.pid, signal.SIGKILL))
        killer.start()
        try:
            with pytest.raises(SuaveplanError) as info:
                await sb.call("spin_for", 30)  # the wait reads the end of file itself
        finally:
            killer.join()
        assert info.value.code == "SAND_VM_WORKER_CRASHED"
        assert loop_share(asyncio.get_running_loop()).busy == 0
    async with await _sandbox(tmp_path) as sb:
        assert await sb.call("noop") is None


async def test_the_busy_count_returns_to_zero_however_jobs_end(tmp_path: Path) -> None:
    share = loop_share(asyncio.get_running_loop())
    sb = await _sandbox(tmp_path, policy=_policy(tmp_path, wallClockMs=100))
    with pytest.raises(SuaveplanError) as info:
        await sb.call("spin_for", 5)  # a budget breach kills the worker
    assert info.value.code == "BUDGET_EXCEEDED"
    assert share.busy == 0
    await sb.dispose()
    sb = await _sandbox(tmp_path)
    calls = [asyncio.ensure_future(sb.call("spin_for", 0.2)) for _ in range(3)]
    await asyncio.sleep(0.05)
    assert share.busy == 1  # one job in flight; the others queued
    await sb.dispose()  # the one in flight and the queued ones fail
    for call in calls:
        with pytest.raises(SuaveplanError):
            await call
    assert share.busy == 0


# -- the hold's bookkeeping ------------------------------------------------------------------


class _Loop:
    def __init__(self) -> None:
        self.queued: list[Callable[[], object]] = []

    def call_soon(self, fn: Callable[[], object]) -> None:
        self.queued.append(fn)

    def turn(self) -> None:
        queued, self.queued = self.queued, []
        for fn in queued:
            fn()


def test_inline_waits_start_only_within_max_hold_of_the_first_since_the_loop_turned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [100.0]
    monkeypatch.setattr(_inline_wait, "monotonic", lambda: now[0])
    share, loop = LoopShare(), _Loop()
    hold = MAX_HOLD_MS / 1000
    assert share.may_wait_inline(loop)  # type: ignore[arg-type]
    assert len(loop.queued) == 1  # one marker, however many waits follow
    now[0] += hold / 2
    assert share.may_wait_inline(loop)  # type: ignore[arg-type]
    now[0] += hold
    assert not share.may_wait_inline(loop)  # type: ignore[arg-type]
    assert len(loop.queued) == 1
    loop.turn()  # the loop turned: the hold starts again
    assert share.may_wait_inline(loop)  # type: ignore[arg-type]
    assert len(loop.queued) == 1
    share.busy = 1  # another sandbox's answer may be waiting: never
    assert not share.may_wait_inline(loop)  # type: ignore[arg-type]


def test_each_loop_has_its_own_share_and_drops_it_with_the_loop() -> None:
    first, second = asyncio.new_event_loop(), asyncio.new_event_loop()
    try:
        assert loop_share(first) is loop_share(first)
        assert loop_share(first) is not loop_share(second)
    finally:
        first.close()
        second.close()
    count = len(_inline_wait._shares)
    del first, second
    import gc

    gc.collect()
    assert len(_inline_wait._shares) <= count - 2


# -- which polling loop the host uses ---------------------------------------------------


async def test_the_host_polls_in_c_when_built_and_in_python_under_the_switch(
    tmp_path: Path,
) -> None:
    with _accel.accelerated():
        async with await _sandbox(tmp_path) as sb:
            assert sb._poll_recv.func is _accel.poll_recv()  # type: ignore[attr-defined]
            assert await sb.call("read", "./data/a.bin") == b"a" * 1024
    with _accel.pure_python():
        async with await _sandbox(tmp_path) as sb:
            poll = sb._poll_recv.func  # type: ignore[attr-defined]
            assert poll is _worker_loop._poll_recv_python
            await sb.call("noop")
            assert await sb.call("read", "./data/a.bin") == b"a" * 1024


def test_the_fork_server_inherits_the_switch_and_nothing_else() -> None:
    # In a fresh host process with the switch set (and another variable that must not pass),
    # the worker never loads the accelerator: its polling is the Python twin's.
    code = (
        "import asyncio, pathlib, sys, tempfile\n"
        "from suaveplan_sandbox.permissions import PermissionPolicy\n"
        "from suaveplan_sandbox.vm import create_vm_sandbox\n"
        "root = pathlib.Path(tempfile.mkdtemp())\n"
        "(root / 'p.py').write_text('def f():\\n    return 1\\n')\n"
        "async def main():\n"
        "    sb = await create_vm_sandbox(plugin_module_path=root / 'p.py',\n"
        "        policy=PermissionPolicy.from_manifest({'name': 'p'}, root=root),\n"
        "        _test_process_probe=True)\n"
        "    async with sb:\n"
        "        probe = await sb._process_probe()\n"
        "        assert await sb.call('f') == 1\n"
        "    print(sorted(m for m in probe['modules'] if 'speedups' in m), probe['env'])\n"
        "asyncio.run(main())\n"
    )
    out = {}
    for value in ("1", "0"):
        env = dict(os.environ, **{_accel.DISABLE_ENV: value, "SUAVEPLAN_TEST_OTHER": "x"})
        run = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        out[value] = run.stdout.strip()
    assert out["1"] == "[] {}"
    assert out["0"] == "['suaveplan_sandbox._speedups'] {}"
