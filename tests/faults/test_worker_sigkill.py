"""A worker SIGKILLed at a random point: mid-call, mid-proxy-call and mid-write.

Each test injects several kills at points drawn from `random.Random(seed)` (the seed is in
the test id, so a failure reproduces). After every kill the call that was running fails with
`SAND_VM_WORKER_CRASHED` (or had already returned its correct answer), the host serves a
brand-new sandbox, nothing leaked, and every write whose call returned is on disk intact.
"""

from __future__ import annotations

import asyncio
import concurrent.futures.thread
import functools
import os
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

import pytest

from faults._support import HostProbe, SecurityRecord, kill, pid_gone, policy
from suaveplan_sandbox.adapters import Adapters, BeneathRootFs, QueryResult
from suaveplan_sandbox.errors import SuaveplanError, WireValue
from suaveplan_sandbox.vm import VmSandbox, create_vm_sandbox

KILLS = 5
_WORK_ITEM_RUN = concurrent.futures.thread._WorkItem.run.__code__


@pytest.mark.parametrize("seed", [701, 702])
async def test_worker_killed_mid_call_at_random_points(
    seed: int, tmp_path: Path, security_record: SecurityRecord
) -> None:
    rng = random.Random(seed)
    probe = HostProbe(tmp_path)
    await probe.warm_up()
    survived = 0
    for _ in range(KILLS):
        n = rng.randrange(10_000, 3_000_000)
        sb = await create_vm_sandbox(plugin_module_path=probe.plugin, policy=policy(tmp_path))
        pid = sb.pid
        call = asyncio.ensure_future(sb.call("spin", n))
        await asyncio.sleep(rng.uniform(0.0, 0.08))
        kill(pid)
        try:
            value = await call
        except SuaveplanError as exc:
            assert exc.code == "SAND_VM_WORKER_CRASHED"
            assert sb.state == "crashed"
        else:
            assert value == n * (n - 1) // 2  # it finished before the kill landed
        await sb.dispose()
        assert await pid_gone(pid)
        ok, why = await probe.healthy()
        assert ok, why
        survived += 1
    security_record("faults", kind="worker-sigkill-mid-call", injected=KILLS, survived=survived)


class _BlockingAdapters:
    """Adapters whose every call parks until cancelled; records entries and cancellations."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.cancelled = 0
        self.completed = 0

    async def _park(self) -> None:
        self.entered.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        self.completed += 1

    async def get(self, name: str) -> str:
        await self._park()
        return "never"

    async def query(self, sql: str, params: Sequence[WireValue]) -> QueryResult:
        await self._park()
        return QueryResult(columns=(), rows=(), rowcount=0)

    async def read_bytes(self, path: str, *, max_bytes: int) -> bytes:
        await self._park()
        return b""


@pytest.mark.parametrize("seed", [711])
async def test_worker_killed_while_the_host_serves_its_capability_call(
    seed: int, tmp_path: Path, security_record: SecurityRecord
) -> None:
    rng = random.Random(seed)
    probe = HostProbe(tmp_path)
    await probe.warm_up()
    calls = [("secret", "API_KEY"), ("query", "SELECT * FROM faults_t"), ("read", "/data/x")]
    survived = 0
    for _ in range(KILLS):
        fake = _BlockingAdapters()
        adapters = Adapters(fs=fake, db=fake, secrets=fake)  # type: ignore[arg-type]
        sb = await create_vm_sandbox(
            plugin_module_path=probe.plugin, policy=policy(tmp_path), proxies=adapters
        )
        pid = sb.pid
        name, arg = rng.choice(calls)
        call = asyncio.ensure_future(sb.call(name, arg))
        await asyncio.wait_for(fake.entered.wait(), 10)
        await asyncio.sleep(rng.uniform(0.0, 0.02))
        kill(pid)
        with pytest.raises(SuaveplanError) as info:
            await call
        assert info.value.code == "SAND_VM_WORKER_CRASHED"
        # The crash cancelled the capability call the host was serving for the dead guest.
        for _ in range(100):
            if fake.cancelled:
                break
            await asyncio.sleep(0.01)
        assert (fake.cancelled, fake.completed) == (1, 0)
        assert sb._gateway.inflight == 0
        await sb.dispose()
        ok, why = await probe.healthy()
        assert ok, why
        survived += 1
    security_record("faults", kind="worker-sigkill-mid-proxy", injected=KILLS, survived=survived)


def _no_temp_files(directory: Path) -> bool:
    return not any(p.name.endswith(".suaveplan-tmp") for p in directory.iterdir())


def _runs_a_write(frame: FrameType) -> bool:
    if frame.f_code is BeneathRootFs._write_sync.__code__:
        return True
    if frame.f_code is not _WORK_ITEM_RUN:
        return False
    # An executor thread between taking the write's work item and entering `_write_sync`
    # (or just past it): `asyncio.to_thread` submits `partial(context.run, func, *args)`.
    fn = getattr(frame.f_locals.get("self"), "fn", None)
    func = fn.args[0] if isinstance(fn, functools.partial) and fn.args else None
    return getattr(func, "__func__", None) is BeneathRootFs._write_sync


def _writing_threads() -> int:
    """Threads now running a `BeneathRootFs` write (at any depth of their stack)."""
    busy = 0
    for frame in sys._current_frames().values():
        current: FrameType | None = frame
        while current is not None:
            if _runs_a_write(current):
                busy += 1
                break
            current = current.f_back
    return busy


async def _wait_for_writes_to_unwind(sb: VmSandbox, timeout_s: float = 20.0) -> None:
    """Bounded wait until no write the host ran for `sb` can still change the directory.

    A crash or `dispose()` only *requests* cancellation of in-flight adapter calls, and a
    cancelled write's thread cannot be stopped: it unlinks its temp file (or, if it won the
    rename before the cancellation, has renamed it) on its own time. Under load that thread
    may not even have created its temp file yet, so "no temp file now" proves nothing; once
    the gateway holds no call and no thread is inside the write, the directory is final.
    """
    deadline = time.monotonic() + timeout_s
    while sb._gateway.inflight or _writing_threads():
        assert time.monotonic() < deadline, "a cancelled write never unwound"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("seed", [721, 722])
async def test_worker_killed_mid_write_leaves_the_acknowledged_or_the_new_contents(
    seed: int, tmp_path: Path, security_record: SecurityRecord
) -> None:
    rng = random.Random(seed)
    probe = HostProbe(tmp_path)
    fs = BeneathRootFs(tmp_path)  # opened before the baseline: its root fd lives all along
    await probe.warm_up()
    data_dir = tmp_path / "data"
    target = data_dir / "doc.bin"
    survived = 0
    try:
        acknowledged = b"v0" * 1000
        target.write_bytes(acknowledged)
        for i in range(KILLS):
            sb = await create_vm_sandbox(
                plugin_module_path=probe.plugin, policy=policy(tmp_path), proxies=Adapters(fs=fs)
            )
            pid = sb.pid
            # A few acknowledged writes, then one that is killed at a random point.
            for j in range(rng.randrange(1, 4)):
                body = rng.randbytes(rng.randrange(1, 64 * 1024))
                assert await sb.call("write", "/data/doc.bin", body) == len(body)
                acknowledged = body
                assert target.read_bytes() == acknowledged, (i, j)
            pending = bytes([i]) * rng.randrange(256 * 1024, 4 * 1024 * 1024)
            call = asyncio.ensure_future(sb.call("write", "/data/doc.bin", pending))
            await asyncio.sleep(rng.uniform(0.0, 0.03))
            kill(pid)
            try:
                await call
            except SuaveplanError as exc:
                assert exc.code == "SAND_VM_WORKER_CRASHED"
            else:
                acknowledged = pending
            await sb.dispose()
            await _wait_for_writes_to_unwind(sb)
            on_disk = target.read_bytes()
            assert on_disk in (acknowledged, pending), "a killed write left a mix"
            assert _no_temp_files(data_dir)
            acknowledged = on_disk
            ok, why = await probe.healthy()
            assert ok, why
            survived += 1
    finally:
        fs.close()
    security_record("faults", kind="worker-sigkill-mid-write", injected=KILLS, survived=survived)


class _EntrySpyFs:
    """Delegates to a real `BeneathRootFs`; `entered` is set once a write reaches it."""

    def __init__(self, fs: BeneathRootFs) -> None:
        self.fs = fs
        self.entered = asyncio.Event()

    async def write_bytes(self, path: str, data: bytes) -> None:
        self.entered.set()
        await self.fs.write_bytes(path, data)

    async def read_bytes(self, path: str, *, max_bytes: int) -> bytes:
        return await self.fs.read_bytes(path, max_bytes=max_bytes)

    async def list_dir(self, path: str) -> list[str]:
        return await self.fs.list_dir(path)

    async def exists(self, path: str) -> bool:
        return await self.fs.exists(path)


@pytest.mark.parametrize("seed", [731])
async def test_write_of_a_killed_worker_never_lands_after_a_later_acknowledged_write(
    seed: int, tmp_path: Path, security_record: SecurityRecord, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The host thread writing for a killed worker cannot be stopped; before the fix its
    # rename landed after a fresh sandbox's acknowledged write and replaced it. A slow disk
    # (fsync of a large file takes 300 ms) makes the window certain instead of likely.
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        if os.fstat(fd).st_size > 1024 * 1024:
            time.sleep(0.3)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", slow_fsync)
    rng = random.Random(seed)
    probe = HostProbe(tmp_path)
    fs = BeneathRootFs(tmp_path)
    await probe.warm_up()
    target = tmp_path / "data" / "doc.bin"
    survived = 0
    kills = 3  # each costs a slow fsync
    try:
        for i in range(kills):
            spy = _EntrySpyFs(fs)
            sb = await create_vm_sandbox(
                plugin_module_path=probe.plugin, policy=policy(tmp_path), proxies=Adapters(fs=spy)
            )
            big = b"B" * rng.randrange(8 * 1024 * 1024, 12 * 1024 * 1024)
            call = asyncio.ensure_future(sb.call("write", "/data/doc.bin", big))
            await asyncio.wait_for(spy.entered.wait(), 10)
            kill(sb.pid)
            with pytest.raises(SuaveplanError) as info:
                await call
            assert info.value.code == "SAND_VM_WORKER_CRASHED"
            await sb.dispose()
            later = f"acknowledged {i}".encode()
            async with await create_vm_sandbox(
                plugin_module_path=probe.plugin, policy=policy(tmp_path), proxies=Adapters(fs=fs)
            ) as fresh:
                assert await fresh.call("write", "/data/doc.bin", later) == len(later)
            await _wait_for_writes_to_unwind(sb)  # every stray rename has landed or never will
            assert target.read_bytes() == later, "an acknowledged write was replaced"
            assert _no_temp_files(target.parent)
            ok, why = await probe.healthy()
            assert ok, why
            survived += 1
    finally:
        fs.close()
    security_record("faults", kind="worker-sigkill-stale-write", injected=kills, survived=survived)
