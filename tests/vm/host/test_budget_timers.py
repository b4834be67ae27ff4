"""The wall-clock and sampling timers outlive jobs: one timer serves many calls, a timer left
by an earlier call never ends a later one early, and a later call's own deadline still holds."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.vm import _sandbox as vm_sandbox_module
from suaveplan_sandbox.vm import create_vm_sandbox

SRC = (
    "def quick():\n    return 1\n\n"
    "def busy(n):\n    x = 0\n    for i in range(n):\n        x += i\n    return 2\n"
    "\ndef spin():\n    while True:\n        pass\n"
)


def _policy(tmp: Path, budgets: dict[str, int]) -> tuple[str, PermissionPolicy]:
    plugin = tmp / "plugin.py"
    plugin.write_text(SRC)
    manifest = {
        "name": "timers",
        "version": "1.0.0",
        "permissions": {"budgets": budgets},
    }
    return str(plugin), PermissionPolicy.from_manifest(manifest, root=tmp)


async def _iterations_for(sb: object, seconds: float) -> int:
    """Loop iterations of `busy` that take about `seconds` in this worker."""
    n = 20000
    while True:
        started = time.monotonic()
        await sb.call("busy", n)  # type: ignore[attr-defined]
        took = time.monotonic() - started
        if took >= 0.005:
            return max(1, int(n * seconds / took))
        n *= 4


def test_quick_calls_share_one_deadline_timer_and_sampler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A sampling interval longer than the test: a sampler that fires on its own (a loaded
    # machine can take 20 ms over 50 calls) re-arms legitimately; only calls must not.
    monkeypatch.setattr(vm_sandbox_module, "SAMPLE_INTERVAL_S", 60.0)

    async def main() -> None:
        path, policy = _policy(tmp_path, {"wallClockMs": 5000, "memoryMb": 256})
        async with await create_vm_sandbox(plugin_module_path=path, policy=policy) as sb:
            await sb.call("quick")
            deadline, sampler = sb._deadline, sb._sampler
            assert deadline is not None
            assert sampler is not None
            for _ in range(50):
                assert await sb.call("quick") == 1
            assert sb._deadline is deadline
            assert sb._sampler is sampler

    asyncio.run(main())


def test_calls_back_to_back_for_longer_than_the_budget_all_succeed(tmp_path: Path) -> None:
    # Each call is short; together they run well past one budget, so the deadline timer an
    # early call left fires while a later call is in flight and must re-arm, not breach.
    async def main() -> None:
        path, policy = _policy(tmp_path, {"wallClockMs": 150})
        async with await create_vm_sandbox(plugin_module_path=path, policy=policy) as sb:
            n = await _iterations_for(sb, 0.02)
            end = time.monotonic() + 0.6
            calls = 0
            while time.monotonic() < end:
                assert await sb.call("busy", n) == 2
                calls += 1
            assert calls >= 5
            assert sb.state == "idle"

    asyncio.run(main())


def test_a_later_call_is_still_held_to_its_own_deadline(tmp_path: Path) -> None:
    async def main() -> None:
        path, policy = _policy(tmp_path, {"wallClockMs": 200})
        async with await create_vm_sandbox(plugin_module_path=path, policy=policy) as sb:
            n = await _iterations_for(sb, 0.02)
            for _ in range(5):
                await sb.call("busy", n)
            # The deadline timer an earlier call armed is still pending: it fires mid-spin.
            assert sb._deadline is not None
            started = time.monotonic()
            with pytest.raises(SuaveplanError) as info:
                await sb.call("spin")
            took = time.monotonic() - started
            assert info.value.code == "BUDGET_EXCEEDED"
            assert info.value.details["budget"] == "wallClockMs"
            assert took >= 0.2  # not ended by the earlier deadline

    asyncio.run(main())
