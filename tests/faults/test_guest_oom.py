"""A guest that runs out of memory: VM workers and WASM instances under `memoryMb`.

The breach is `BUDGET_EXCEEDED` with `details.budget == "memoryMb"`, counted once; the VM
worker is killed (the sandbox is crashed and gets replaced), the WASM store is refused its
growth. Either way the host process itself never grows with the guest and keeps serving.
"""

from __future__ import annotations

import random
from pathlib import Path

import psutil
import pytest

from faults._support import HostProbe, SecurityRecord, pid_gone, policy
from suaveplan_sandbox.adapters import Adapters
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.metrics import InMemoryMetrics
from suaveplan_sandbox.vm import create_vm_sandbox
from suaveplan_sandbox.wasm import create_wasm_sandbox

MEMBOMB = Path(__file__).parent.parent / "wasm" / "fixtures" / "membomb.wasm"
HOST_GROWTH_LIMIT = 64 * 1024 * 1024  # the guest asks for hundreds of MiB; the host holds none


@pytest.mark.parametrize("seed", [781])
async def test_vm_guest_out_of_memory_is_a_memory_budget_breach(
    seed: int, tmp_path: Path, security_record: SecurityRecord
) -> None:
    rng = random.Random(seed)
    probe = HostProbe(tmp_path)
    await probe.warm_up()
    host_rss = psutil.Process().memory_info().rss
    rounds = 3
    survived = 0
    for _ in range(rounds):
        metrics = InMemoryMetrics()
        sb = await create_vm_sandbox(
            plugin_module_path=probe.plugin,
            policy=policy(tmp_path, memoryMb=rng.choice([48, 64, 96])),
            metrics=metrics,
        )
        pid = sb.pid
        with pytest.raises(SuaveplanError) as info:
            await sb.call("hog", rng.randrange(200, 600))
        assert info.value.code == "BUDGET_EXCEEDED"
        assert info.value.details["budget"] == "memoryMb"
        assert metrics.value("plugin.budget_exceeded_total") == 1
        assert sb.state == "crashed"
        await sb.dispose()
        assert await pid_gone(pid)
        ok, why = await probe.healthy()
        assert ok, why
        survived += 1
    assert psutil.Process().memory_info().rss - host_rss < HOST_GROWTH_LIMIT
    security_record("faults", kind="guest-oom-vm", injected=rounds, survived=survived)


@pytest.mark.parametrize("seed", [782])
async def test_wasm_guest_out_of_memory_is_a_memory_budget_breach(
    seed: int, tmp_path: Path, security_record: SecurityRecord
) -> None:
    rng = random.Random(seed)
    probe = HostProbe(tmp_path)

    async def breach(guest: Path, limit: int) -> tuple[str, object]:
        # Only plain data leaves: the error's traceback reaches frames holding the Store.
        metrics = InMemoryMetrics()
        sb = await create_wasm_sandbox(
            wasm_module_path=guest,
            policy=policy(tmp_path, memoryMb=limit),
            proxies=Adapters(),
            metrics=metrics,
        )
        try:
            with pytest.raises(SuaveplanError) as info:
                if guest == MEMBOMB:
                    await sb.run(argv=["membomb"])
                else:
                    await sb.call("grow")
            assert metrics.value("plugin.budget_exceeded_total") == 1
            return info.value.code, info.value.details.get("budget")
        finally:
            await sb.dispose()

    async def both_guests_once() -> None:
        await breach(MEMBOMB, 24)
        await breach(probe.wasm, 24)

    await probe.warm_up(both_guests_once)
    host_rss = psutil.Process().memory_info().rss
    rounds = 4
    survived = 0
    for i in range(rounds):
        limit = rng.choice([24, 32, 48])  # membomb starts at 257 pages (16 MiB + 1)
        outcome = await breach(MEMBOMB if i % 2 else probe.wasm, limit)
        assert outcome == ("BUDGET_EXCEEDED", "memoryMb")
        ok, why = await probe.healthy()
        assert ok, why
        survived += 1
    assert psutil.Process().memory_info().rss - host_rss < HOST_GROWTH_LIMIT
    security_record("faults", kind="guest-oom-wasm", injected=rounds, survived=survived)


async def test_wasm_guest_refused_a_large_growth_is_a_memory_budget_breach(
    tmp_path: Path, security_record: SecurityRecord
) -> None:
    probe = HostProbe(tmp_path)
    survived = 0
    sb = await create_wasm_sandbox(
        wasm_module_path=probe.wasm, policy=policy(tmp_path, memoryMb=16), proxies=Adapters()
    )
    try:
        with pytest.raises(SuaveplanError) as info:
            await sb.call("grow_by", 16)  # 1 + 15 * 16 = 241 pages; 257 > 256 is refused
        assert info.value.code == "BUDGET_EXCEEDED"
        survived = 1
    finally:
        await sb.dispose()
        security_record("faults", kind="guest-oom-wasm-large-grow", injected=1, survived=survived)
