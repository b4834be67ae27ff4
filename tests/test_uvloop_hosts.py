"""Both hosts on uvloop, the loop uvicorn picks when uvloop is installed.

The VM host relies on loop behaviour beyond coroutines: `add_reader` callbacks, `call_soon`
chains that keep the selector from sleeping (busy polling), timers for budgets, and tasks
for coroutine adapters. Each is exercised here on `uvloop.Loop`: every conformance scenario,
answers with polling on and off, the host's polling ending after its window, and a budget
breach followed by a working sandbox. The WASM host (a guest thread that reaches the loop
for async adapters, epoch ticks while it waits) runs its whole conformance harness here too.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import uvloop

from suaveplan_sandbox.adapters import Adapters
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.testing import InMemoryFs
from suaveplan_sandbox.testing._scenarios import Scenario
from suaveplan_sandbox.testing._vm_conformance import VM_SCENARIOS
from suaveplan_sandbox.testing._wasm_conformance import WASM_SCENARIOS, MakeSandbox
from suaveplan_sandbox.vm import create_vm_sandbox
from suaveplan_sandbox.vm._worker_loop import DEFAULT_BUSY_POLL_US, MAX_BUSY_POLL_US
from suaveplan_sandbox.wasm import create_wasm_sandbox

T = TypeVar("T")

PLUGIN = """
import datetime

import suaveplan
from suaveplan import SuaveplanError


def spin(n):
    total = 0
    for i in range(n):
        total += i
    return total


def spin_for(seconds):
    # Busy for a length of time, not a count: a faster machine must not shorten the call.
    end = datetime.datetime.now() + datetime.timedelta(seconds=seconds)
    rounds = 0
    while datetime.datetime.now() < end:
        rounds += 1
    return rounds


def read(path):
    return suaveplan.fs.read_bytes(path)


def missing():
    try:
        suaveplan.fs.read_bytes("./data/nope")
    except SuaveplanError as exc:
        return exc.code


def forever():
    while True:
        pass
"""


def _on_uvloop(main: Callable[[], Awaitable[T]]) -> T:
    async def checked() -> T:
        assert isinstance(asyncio.get_running_loop(), uvloop.Loop)
        return await main()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(checked())


def _sandbox_args(tmp_path: Path, **budgets: int) -> dict[str, Any]:
    (tmp_path / "p.py").write_text(PLUGIN)
    manifest: dict[str, Any] = {"name": "uv", "permissions": {"fs": ["./data/*"]}}
    if budgets:
        manifest["permissions"]["budgets"] = budgets
    return {
        "plugin_module_path": tmp_path / "p.py",
        "policy": PermissionPolicy.from_manifest(manifest, root=tmp_path),
    }


@pytest.mark.parametrize("name", [name for name, _ in VM_SCENARIOS])
def test_every_conformance_scenario_holds_on_uvloop(name: str) -> None:
    scenario = dict(VM_SCENARIOS)[name]
    _on_uvloop(lambda: scenario(create_vm_sandbox))


@pytest.mark.parametrize("poll_us", [0, DEFAULT_BUSY_POLL_US, MAX_BUSY_POLL_US])
def test_calls_and_host_calls_answer_the_same_on_uvloop(tmp_path: Path, poll_us: int) -> None:
    files = {"data/a.bin": b"a" * 1024}

    async def main() -> None:
        for fs in (InMemoryFs(files), InMemoryFs(files, delay=0.01)):  # fast, then slow
            async with await create_vm_sandbox(
                **_sandbox_args(tmp_path), proxies=Adapters(fs=fs), busy_poll_us=poll_us
            ) as sb:
                for _ in range(3):
                    assert await sb.call("read", "./data/a.bin") == b"a" * 1024
                    assert await sb.call("missing") == "SAND_FS_NOT_FOUND"
                answers = await asyncio.gather(*(sb.call("spin", n) for n in range(50)))
                assert answers == [sum(range(n)) for n in range(50)]
                assert fs.calls.count(("read_bytes", "data/a.bin")) == 3

    _on_uvloop(main)


def test_the_host_stops_polling_after_its_window_on_uvloop(tmp_path: Path) -> None:
    async def main() -> None:
        async with await create_vm_sandbox(
            **_sandbox_args(tmp_path), busy_poll_us=MAX_BUSY_POLL_US
        ) as sb:
            await sb.call("spin", 1)  # a fast answer: the next call polls
            for _ in range(2):
                cpu, began = time.process_time(), time.monotonic()
                await sb.call("spin_for", 0.15)
                took, spent = time.monotonic() - began, time.process_time() - cpu
                assert took >= 0.1, (
                    "the plugin must take longer than this for the test to mean much"
                )
                assert spent < 0.3 * took, (spent, took)
            assert sb._hot is None

    _on_uvloop(main)


def test_a_wall_clock_breach_ends_the_sandbox_and_the_next_one_works_on_uvloop(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        args = _sandbox_args(tmp_path, wallClockMs=200)
        async with await create_vm_sandbox(**args) as sb:
            began = time.monotonic()
            with pytest.raises(SuaveplanError) as info:
                await sb.call("forever")
            assert info.value.code == "BUDGET_EXCEEDED"
            assert info.value.details["budget"] == "wallClockMs"
            assert time.monotonic() - began < 5
        async with await create_vm_sandbox(**args) as sb:
            assert await sb.call("spin", 10) == 45

    _on_uvloop(main)


@pytest.mark.parametrize("scenario", WASM_SCENARIOS, ids=lambda s: s.name)
def test_every_wasm_conformance_scenario_holds_on_uvloop(
    scenario: Scenario[MakeSandbox],
) -> None:
    # The harness runs each scenario with `asyncio.run`, which takes its loop from the policy.
    made_on: list[type] = []

    async def on_uvloop(**kwargs: Any) -> Any:
        made_on.append(type(asyncio.get_running_loop()))
        return await create_wasm_sandbox(**kwargs)

    before = asyncio.get_event_loop_policy()
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    try:
        scenario.run(on_uvloop)
    finally:
        asyncio.set_event_loop_policy(before)
    assert made_on and set(made_on) == {uvloop.Loop}, made_on
