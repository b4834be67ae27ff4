"""One job at a time per worker: queued calls run in order, cancelled ones never run."""

from __future__ import annotations

import asyncio
from pathlib import Path

from suaveplan_sandbox.adapters import Adapters
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.testing import InMemoryFs
from suaveplan_sandbox.vm import VmSandbox, create_vm_sandbox

SOURCE = """
from suaveplan import fs

RAN = []


def slow(tag):
    fs.read_bytes("./data/a.bin")  # the adapter takes 200 ms
    RAN.append(tag)
    return tag


def fast(tag):
    RAN.append(tag)
    return tag


def ran():
    return RAN
"""


async def _sandbox(tmp: Path) -> VmSandbox:
    (tmp / "p.py").write_text(SOURCE)
    policy = PermissionPolicy.from_manifest(
        {"name": "queue", "permissions": {"fs": ["./data/*"]}}, root=tmp
    )
    fs = InMemoryFs({"data/a.bin": b"x"}, delay=0.2)
    return await create_vm_sandbox(
        plugin_module_path=tmp / "p.py", policy=policy, proxies=Adapters(fs=fs)
    )


async def test_concurrent_calls_run_one_at_a_time_in_submission_order(tmp_path: Path) -> None:
    async with await _sandbox(tmp_path) as sb:
        results = await asyncio.gather(
            sb.call("slow", "a"), sb.call("fast", "b"), sb.call("fast", "c")
        )
        assert list(results) == ["a", "b", "c"]
        assert await sb.call("ran") == ["a", "b", "c"]


async def test_a_call_cancelled_while_queued_never_runs(tmp_path: Path) -> None:
    async with await _sandbox(tmp_path) as sb:
        first = asyncio.ensure_future(sb.call("slow", "a"))
        queued = asyncio.ensure_future(sb.call("fast", "never"))
        await asyncio.sleep(0.05)
        queued.cancel()
        assert await first == "a"
        assert queued.cancelled()
        assert await sb.call("ran") == ["a"]


async def test_a_call_cancelled_in_flight_leaves_the_sandbox_usable(tmp_path: Path) -> None:
    async with await _sandbox(tmp_path) as sb:
        inflight = asyncio.ensure_future(sb.call("slow", "a"))
        await asyncio.sleep(0.05)
        inflight.cancel()
        # Its reply arrives later and is dropped; the next call gets its own answer.
        assert await sb.call("fast", "b") == "b"
        assert sb.state == "idle"
        assert await sb.call("ran") == ["a", "b"]


async def test_a_budget_breach_fails_the_call_in_flight_and_queued_calls_as_a_crash(
    tmp_path: Path,
) -> None:
    from suaveplan_sandbox.errors import SuaveplanError

    (tmp_path / "p.py").write_text(
        "def spin():\n    while True:\n        pass\n\ndef f():\n    return 1\n"
    )
    policy = PermissionPolicy.from_manifest(
        {"name": "queue", "permissions": {"budgets": {"wallClockMs": 200}}}, root=tmp_path
    )
    async with await create_vm_sandbox(plugin_module_path=tmp_path / "p.py", policy=policy) as sb:
        results = await asyncio.gather(sb.call("spin"), sb.call("f"), return_exceptions=True)
        first, queued = results
        assert isinstance(first, SuaveplanError)
        assert isinstance(queued, SuaveplanError)
        assert (first.code, first.details["budget"]) == ("BUDGET_EXCEEDED", "wallClockMs")
        assert queued.code == "SAND_VM_WORKER_CRASHED"
        assert queued.details["why"] == "earlier-crash"
