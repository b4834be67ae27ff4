"""`cpuPercent` in the VM: CPU time over wall time, sampled from the worker while it works."""

from __future__ import annotations

from pathlib import Path

import pytest

from suaveplan_sandbox.adapters import Adapters
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.metrics import BUDGET_EXCEEDED, InMemoryMetrics
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.testing import InMemoryFs
from suaveplan_sandbox.vm import create_vm_sandbox

SOURCE = """
from suaveplan import fs


def spin():
    while True:
        pass


def mostly_waiting(n):
    for _ in range(n):
        fs.read_bytes("./data/a.bin")
    return n


def short_burst():
    total = 0
    for i in range(20000):
        total += i
    return total
"""

# Low enough that a busy loop breaches it even on a loaded, shared 2-core machine.
CPU_PERCENT = 10


def _setup(tmp: Path) -> tuple[Path, PermissionPolicy]:
    (tmp / "p.py").write_text(SOURCE)
    policy = PermissionPolicy.from_manifest(
        {
            "name": "cpu",
            "permissions": {"fs": ["./data/*"], "budgets": {"cpuPercent": CPU_PERCENT}},
        },
        root=tmp,
    )
    return tmp / "p.py", policy


async def test_a_busy_looping_plugin_over_its_cpu_percent_is_stopped(tmp_path: Path) -> None:
    path, policy = _setup(tmp_path)
    metrics = InMemoryMetrics()
    sb = await create_vm_sandbox(plugin_module_path=path, policy=policy, metrics=metrics)
    try:
        with pytest.raises(SuaveplanError) as info:
            await sb.call("spin")
        assert info.value.code == "BUDGET_EXCEEDED"
        assert info.value.details["budget"] == "cpuPercent"
        observed = info.value.details["observed"]
        assert isinstance(observed, float)
        assert observed > CPU_PERCENT
        assert sb.state == "crashed"
        assert metrics.value(BUDGET_EXCEEDED.name, budget="cpuPercent") == 1
    finally:
        await sb.dispose()


async def test_a_mostly_idle_plugin_is_not_stopped(tmp_path: Path) -> None:
    path, policy = _setup(tmp_path)
    metrics = InMemoryMetrics()
    # Each read waits 50 ms in the host adapter: the worker sleeps in recv meanwhile. Over the
    # 1 s window that is far below the budget even with short CPU bursts between the waits.
    fs = InMemoryFs({"data/a.bin": b"x"}, delay=0.05)
    async with await create_vm_sandbox(
        plugin_module_path=path, policy=policy, proxies=Adapters(fs=fs), metrics=metrics
    ) as sb:
        for _ in range(3):
            assert await sb.call("mostly_waiting", 10) == 10
            assert await sb.call("short_burst") == sum(range(20000))
        assert sb.state == "idle"
    assert metrics.value(BUDGET_EXCEEDED.name) == 0


async def test_back_to_back_calls_shorter_than_the_sampling_interval_cannot_hide_cpu(
    tmp_path: Path,
) -> None:
    path, policy = _setup(tmp_path)
    metrics = InMemoryMetrics()
    sb = await create_vm_sandbox(plugin_module_path=path, policy=policy, metrics=metrics)
    try:
        with pytest.raises(SuaveplanError) as info:
            for _ in range(20000):  # a few ms each; the window is 1 s
                await sb.call("short_burst")
        breach = info.value
        if breach.details.get("why") == "earlier-crash":
            # The sampler also runs between calls: a breach it finds there ends the worker
            # with no call in flight, and the next call reports it as its cause.
            assert isinstance(breach.cause, SuaveplanError)
            breach = breach.cause
        assert breach.code == "BUDGET_EXCEEDED", breach.details
        assert breach.details["budget"] == "cpuPercent"
        assert metrics.value(BUDGET_EXCEEDED.name, budget="cpuPercent") == 1
    finally:
        await sb.dispose()
