"""Host calls from a worker that escaped the interpreter layer cost the host bounded state.

These tests play such a worker: they write frames into the host's channel directly while
the real worker spins, bypassing the guest runtime. A capability name the host does not know
is counted under one metric series, `unknown`, whatever the worker calls it; and a worker
sends one host call at a time (the real one waits for each answer), so one sent before the
last was answered is a protocol breach that ends the worker instead of starting another
adapter call.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from suaveplan_sandbox.adapters import Adapters
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.metrics import CAPABILITY_CALLS, PERMISSION_DENIED, InMemoryMetrics
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.protocol import HostCall, encode
from suaveplan_sandbox.testing import InMemoryFs
from suaveplan_sandbox.vm import VmSandbox, create_vm_sandbox

SOURCE = """
from suaveplan import fs


def spin():
    while True:
        pass


def read():
    return fs.read_bytes("./data/a.txt")
"""


class StalledFs:
    """An fs adapter whose reads wait until the test lets them go."""

    def __init__(self) -> None:
        self.started = 0
        self.release = asyncio.Event()

    async def read_bytes(self, path: str, *, max_bytes: int) -> bytes:
        self.started += 1
        await self.release.wait()
        return b"a"


async def _sandbox(tmp: Path, metrics: InMemoryMetrics, fs: object) -> VmSandbox:
    (tmp / "p.py").write_text(SOURCE)
    policy = PermissionPolicy.from_manifest(
        {"name": "forger", "permissions": {"fs": ["./data/*"]}}, root=tmp
    )
    return await create_vm_sandbox(
        plugin_module_path=tmp / "p.py",
        policy=policy,
        proxies=Adapters(fs=fs),  # type: ignore[arg-type]
        metrics=metrics,
    )


def _forge(sb: VmSandbox, call_id: int, capability: str, operation: str, args: dict) -> None:  # type: ignore[type-arg]
    frame = encode(HostCall(id=call_id, capability=capability, operation=operation, args=args))
    sb._on_readable_data(frame)


async def test_host_calls_naming_unknown_capabilities_share_one_metric_series(
    tmp_path: Path,
) -> None:
    metrics = InMemoryMetrics()
    async with await _sandbox(tmp_path, metrics, InMemoryFs()) as sb:
        call = asyncio.ensure_future(sb.call("spin"))
        await asyncio.sleep(0.05)
        for i in range(200):
            # Each is denied (and answered) at once, so the next one is not an overlap.
            _forge(sb, i + 1, f"cap-{i}-" + "z" * 200, "op", {})
        assert sb.state == "calling"
        series = {
            tuple(sorted(labels.items()))
            for name, labels, _ in metrics.samples()
            if name in (CAPABILITY_CALLS.name, PERMISSION_DENIED.name)
        }
        assert series == {
            (("capability", "unknown"), ("outcome", "deny"), ("plugin", "forger")),
            (
                ("capability", "unknown"),
                ("plugin", "forger"),
                ("reason", "unknown-capability"),
            ),
        }
        assert metrics.value(CAPABILITY_CALLS.name, capability="unknown") == 200
        assert sb.denials_total == 200
        call.cancel()


async def test_a_host_call_sent_before_the_last_was_answered_ends_the_worker(
    tmp_path: Path,
) -> None:
    fs = StalledFs()
    async with await _sandbox(tmp_path, InMemoryMetrics(), fs) as sb:
        call = asyncio.ensure_future(sb.call("spin"))
        await asyncio.sleep(0.05)
        for i in range(50):
            _forge(sb, i + 1, "fs", "read_bytes", {"path": "./data/a.txt"})
            if sb.state != "calling":
                break
        await asyncio.sleep(0)
        assert fs.started == 1  # the second request started no adapter call
        with pytest.raises(SuaveplanError) as info:
            await call
        assert info.value.code == "SAND_VM_WORKER_CRASHED"
        assert info.value.details["why"] == "hostcall-overlap"
        assert sb.state == "crashed"


async def test_an_honest_worker_makes_host_calls_one_after_another(tmp_path: Path) -> None:
    fs = StalledFs()
    async with await _sandbox(tmp_path, InMemoryMetrics(), fs) as sb:
        first = asyncio.ensure_future(sb.call("read"))
        for _ in range(500):
            if fs.started:
                break
            await asyncio.sleep(0.01)
        fs.release.set()
        assert await first == b"a"
        assert await sb.call("read") == b"a"
        assert fs.started == 2
        assert sb.state == "idle"
