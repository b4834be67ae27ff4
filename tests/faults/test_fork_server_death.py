"""The fork server (zygote) SIGKILLed while idle, while workers are live, and mid-request.

Documented behaviour (`vm/_zygote.py`): EOF on the control socket marks the fork server
dead, the next request restarts it, and a request in flight when it died raises
`SAND_VM_FORK_SERVER_FAILED`. Workers already forked hold only their own socket to the host,
so they keep serving after their parent is gone, and are gone themselves once disposed.
"""

from __future__ import annotations

import asyncio
import random
import threading
from pathlib import Path

import pytest

from faults._support import HostProbe, SecurityRecord, kill, pid_gone, policy
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.vm import VmSandbox, create_vm_sandbox
from suaveplan_sandbox.vm._zygote import fork_server

ROUNDS = 4


async def _kill_zygote() -> int:
    pid = fork_server().ping()
    kill(pid)
    assert await pid_gone(pid)
    return pid


@pytest.mark.parametrize("seed", [741])
async def test_fork_server_killed_while_idle_is_restarted_on_the_next_request(
    seed: int, tmp_path: Path, security_record: SecurityRecord
) -> None:
    rng = random.Random(seed)
    probe = HostProbe(tmp_path)
    await probe.warm_up()
    survived = 0
    for _ in range(ROUNDS):
        await asyncio.sleep(rng.uniform(0.0, 0.05))
        starts = fork_server().starts
        old = await _kill_zygote()
        async with await create_vm_sandbox(
            plugin_module_path=probe.plugin, policy=policy(tmp_path)
        ) as sb:
            assert await sb.call("echo", [1, 2]) == [1, 2]
        assert fork_server().starts == starts + 1
        assert fork_server().pid not in (None, old)
        ok, why = await probe.healthy()
        assert ok, why
        survived += 1
    security_record("faults", kind="zygote-kill-idle", injected=ROUNDS, survived=survived)


@pytest.mark.parametrize("seed", [742])
async def test_workers_outlive_a_killed_fork_server_and_are_gone_once_disposed(
    seed: int, tmp_path: Path, security_record: SecurityRecord
) -> None:
    rng = random.Random(seed)
    probe = HostProbe(tmp_path)
    await probe.warm_up()
    survived = 0
    for _ in range(ROUNDS):
        boxes: list[VmSandbox] = [
            await create_vm_sandbox(plugin_module_path=probe.plugin, policy=policy(tmp_path))
            for _ in range(rng.randrange(1, 4))
        ]
        pids = [sb.pid for sb in boxes]
        calls = [
            asyncio.ensure_future(sb.call("spin", rng.randrange(1000, 200_000))) for sb in boxes
        ]
        await asyncio.sleep(rng.uniform(0.0, 0.02))
        await _kill_zygote()
        for call in calls:
            assert isinstance(await call, int)
        for i, sb in enumerate(boxes):
            assert await sb.call("echo", i) == i  # still served by the orphaned worker
            await sb.dispose()
        for pid in pids:
            assert await pid_gone(pid)
        ok, why = await probe.healthy()
        assert ok, why
        survived += 1
    security_record("faults", kind="zygote-kill-live-workers", injected=ROUNDS, survived=survived)


@pytest.mark.parametrize("seed", [743, 744])
async def test_fork_server_killed_mid_request_fails_that_request_only(
    seed: int, tmp_path: Path, security_record: SecurityRecord
) -> None:
    rng = random.Random(seed)
    probe = HostProbe(tmp_path)
    await probe.warm_up()
    outcomes: list[str] = []
    for _ in range(ROUNDS):
        zygote = fork_server().ping()
        # A fresh plugin digest each round, so the request also carries a `load`.
        plugin = tmp_path / f"p{len(outcomes)}.py"
        plugin.write_text(probe.plugin.read_text() + f"\n\nROUND = {len(outcomes)}\n")
        timer = threading.Timer(rng.uniform(0.0, 0.004), kill, args=(zygote,))
        timer.start()
        try:
            sb = await create_vm_sandbox(plugin_module_path=plugin, policy=policy(tmp_path))
        except SuaveplanError as exc:
            # The request in flight when the fork server died; a worker forked just before
            # can also lose its Ready to the same death.
            assert exc.code in ("SAND_VM_FORK_SERVER_FAILED", "SAND_VM_WORKER_CRASHED"), exc
            outcomes.append(exc.code)
        else:
            assert await sb.call("echo", "ok") == "ok"
            await sb.dispose()
            outcomes.append("created")
        finally:
            timer.join()
        assert await pid_gone(zygote)
        ok, why = await probe.healthy()
        assert ok, why
    security_record(
        "faults", kind="zygote-kill-mid-request", injected=ROUNDS, survived=len(outcomes)
    )
