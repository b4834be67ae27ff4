"""The per-call RLIMIT_CPU backstop in a real worker. The host arms it from the budgets
(wallClockMs + 1 s, 300 s without one); these tests lower it to 1 s at the fork server so a
runaway is caught quickly and short calls are shown to re-arm it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psutil
import pytest

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.vm import VmSandbox, create_vm_sandbox
from suaveplan_sandbox.vm._zygote import ForkServer

PLUGIN = """
def burn(iterations):
    # CPU, not wall time: a pure-Python loop with no host calls.
    n = 0
    for _ in range(iterations):
        n += 1
    return n


def spin():
    while True:
        pass
"""


def sb_cpu(sb: VmSandbox) -> float:
    times = psutil.Process(sb.pid).cpu_times()
    return float(times.user + times.system)


@pytest.fixture
def cpu_one_second(monkeypatch: pytest.MonkeyPatch) -> None:
    real = ForkServer.fork

    def fork(
        self: ForkServer, *args: Any, rlimits: tuple[int | None, int | None], **kw: Any
    ) -> int:
        return real(self, *args, rlimits=(rlimits[0], 1), **kw)

    monkeypatch.setattr(ForkServer, "fork", fork)


async def test_a_runaway_call_is_killed_by_the_cpu_rlimit_when_nothing_else_stops_it(
    tmp_path: Path, cpu_one_second: None
) -> None:
    (tmp_path / "plugin.py").write_text(PLUGIN)
    # No wallClockMs/cpuPercent budget: the host's sampler has nothing to enforce.
    policy = PermissionPolicy.from_manifest({"name": "spin"}, root=tmp_path)
    async with await create_vm_sandbox(
        plugin_module_path=tmp_path / "plugin.py", policy=policy
    ) as sb:
        with pytest.raises(SuaveplanError) as info:
            await sb.call("spin")
        assert info.value.code == "SAND_VM_WORKER_CRASHED"


async def test_the_backstop_is_per_call_so_many_short_calls_add_up_beyond_it(
    tmp_path: Path, cpu_one_second: None
) -> None:
    (tmp_path / "plugin.py").write_text(PLUGIN)
    policy = PermissionPolicy.from_manifest({"name": "burn"}, root=tmp_path)
    async with await create_vm_sandbox(
        plugin_module_path=tmp_path / "plugin.py", policy=policy
    ) as sb:
        # Calibrate one call to about 0.4 s of CPU, then make six: about 2.4 s in total,
        # more than the soft limit armed at any single point (CPU used so far + 1 s).
        iterations = 2_000_000
        start = sb_cpu(sb)
        await sb.call("burn", iterations)
        per = max(sb_cpu(sb) - start, 1e-3) / iterations
        iterations = int(0.4 / per)
        before = sb_cpu(sb)
        for _ in range(6):
            assert await sb.call("burn", iterations) == iterations
        # Calibration is rough on a loaded machine; what matters is that the calls together
        # used clearly more than the 1 s one armed limit would have allowed.
        assert sb_cpu(sb) - before > 1.3
