"""Host calls served inline (`Gateway.dispatch_eager`): no task when the adapter never
suspends, and otherwise exactly what `Gateway.dispatch` does — results, errors, audit rows,
metrics, ordering and cancellation on dispose."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from suaveplan_sandbox.adapters import Adapters, BeneathRootFs
from suaveplan_sandbox.adapters._protocols import AuditRecord
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.gateway import Gateway
from suaveplan_sandbox.gateway import _gateway as gateway_module
from suaveplan_sandbox.metrics import InMemoryMetrics
from suaveplan_sandbox.permissions import PermissionChecker, PermissionPolicy
from suaveplan_sandbox.testing import InMemoryFs, RecordingAudit
from suaveplan_sandbox.vm import create_vm_sandbox

PLUGIN = """
import suaveplan
from suaveplan import SuaveplanError


def read(path):
    return suaveplan.fs.read_bytes(path)


def try_read(path):
    try:
        return ["ok", suaveplan.fs.read_bytes(path)]
    except SuaveplanError as exc:
        return ["error", exc.code]


def read_all(paths):
    return [suaveplan.fs.read_bytes(p) for p in paths]
"""


class _Fs:
    """In-memory files; `slow/*` suspends on the loop, `boom` raises, `hang` never returns.
    (Composition: `InMemoryFs` is final.)"""

    def __init__(self) -> None:
        self.inner = InMemoryFs(
            {
                "data/a.bin": b"a" * 1024,
                "data/slow/b.bin": b"b",
                "data/boom": b"",
                "data/hang": b"",
            }
        )
        self.entered = asyncio.Event()
        self.cancelled = 0

    async def read_bytes(self, path: str, *, max_bytes: int) -> bytes:
        if path == "data/boom":
            raise RuntimeError("adapter bug")
        if path == "data/hang":
            self.entered.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        if path.startswith("data/slow/"):
            await asyncio.sleep(0.01)
        return await self.inner.read_bytes(path, max_bytes=max_bytes)

    async def write_bytes(self, path: str, data: bytes) -> None:
        await self.inner.write_bytes(path, data)

    async def list_dir(self, path: str) -> list[str]:
        return await self.inner.list_dir(path)

    async def exists(self, path: str) -> bool:
        return await self.inner.exists(path)


class _SelfCancelling(_Fs):
    async def read_bytes(self, path: str, *, max_bytes: int) -> bytes:
        raise asyncio.CancelledError  # a library's own cancellation, nobody cancelled us


def _policy(root: Path) -> PermissionPolicy:
    manifest = {"name": "eager", "version": "1.0.0", "permissions": {"fs": ["./data/*"]}}
    return PermissionPolicy.from_manifest(manifest, root=root)


async def _sandbox(root: Path, fs: _Fs, **kw: Any) -> Any:
    (root / "plugin.py").write_text(PLUGIN)
    return await create_vm_sandbox(
        plugin_module_path=root / "plugin.py",
        policy=_policy(root),
        proxies=Adapters(fs=fs),
        **kw,
    )


async def test_mixed_fast_and_suspending_host_calls_answer_in_order(tmp_path: Path) -> None:
    async with await _sandbox(tmp_path, _Fs()) as sb:
        paths = ["./data/a.bin", "./data/slow/b.bin", "./data/a.bin", "./data/slow/b.bin"]
        got = await sb.call("read_all", paths)
        assert got == [b"a" * 1024, b"b", b"a" * 1024, b"b"]
        # Concurrent calls on two sandboxes: each gets its own answers.
        async with await _sandbox(tmp_path, _Fs()) as other:
            answers = await asyncio.gather(
                *(
                    box.call("read", p)
                    for _ in range(10)
                    for box, p in ((sb, "./data/a.bin"), (other, "./data/slow/b.bin"))
                )
            )
        assert answers == [b"a" * 1024, b"b"] * 10


async def test_dispose_cancels_a_suspended_host_call(tmp_path: Path) -> None:
    fs = _Fs()
    sb = await _sandbox(tmp_path, fs)
    call = asyncio.ensure_future(sb.call("read", "./data/hang"))
    await asyncio.wait_for(fs.entered.wait(), 10)
    await sb.dispose()
    with pytest.raises(SuaveplanError) as info:
        await call
    assert info.value.code == "SAND_VM_DISPOSED"
    for _ in range(10):  # the task's done callbacks run on the next loop iterations
        if not sb._host_tasks:
            break
        await asyncio.sleep(0)
    assert fs.cancelled == 1
    assert sb._gateway.inflight == 0
    assert not sb._host_tasks


def _comparable(rows: list[AuditRecord]) -> list[AuditRecord]:
    return [dataclasses.replace(r, duration_ms=0.0, extra={}) for r in rows]


_REQUESTS: list[tuple[str, str]] = [
    ("./data/a.bin", "ok"),
    ("./data/slow/b.bin", "ok"),
    ("./data/missing", "SAND_FS_NOT_FOUND"),
    ("./secret.txt", "SAND_PERM_DENIED"),
    ("./data/boom", "SAND_ADAPTER_FAILED"),
]


async def test_audit_rows_and_metrics_match_the_task_path(tmp_path: Path) -> None:
    # Through the VM (eager path) ...
    vm_audit, vm_metrics = RecordingAudit(), InMemoryMetrics()
    async with await _sandbox(tmp_path, _Fs(), audit=vm_audit, metrics=vm_metrics) as sb:
        for path, expected in _REQUESTS:
            status, value = await sb.call("try_read", path)
            assert (status if status == "ok" else value) == expected
        denials = sb.denials_total
    # ... and the same requests through `Gateway.dispatch` directly.
    gw_audit, gw_metrics = RecordingAudit(), InMemoryMetrics()
    gateway = Gateway(
        checker=PermissionChecker(_policy(tmp_path), plugin="eager", metrics=gw_metrics),
        adapters=Adapters(fs=_Fs()),
        audit=gw_audit,
    )
    for path, expected in _REQUESTS:
        try:
            await gateway.dispatch("fs", "read_bytes", {"path": path})
            outcome = "ok"
        except SuaveplanError as exc:
            outcome = exc.code
        assert outcome == expected
    assert _comparable(vm_audit.records) == _comparable(gw_audit.records)
    assert len(vm_audit.records) == len(_REQUESTS)

    def counts(m: InMemoryMetrics) -> list[tuple[str, list[tuple[str, str]], float]]:
        return sorted((n, sorted(labels.items()), v) for n, labels, v in m.samples())

    assert counts(vm_metrics) == counts(gw_metrics)
    assert denials == 1


def _gateway(fs: _Fs, audit: RecordingAudit) -> Gateway:
    policy = PermissionPolicy.from_manifest(
        {"name": "g", "permissions": {"fs": ["./data/*"]}}, root=Path("/nonexistent")
    )
    return Gateway(
        checker=PermissionChecker(policy, plugin="g", metrics=InMemoryMetrics()),
        adapters=Adapters(fs=fs),
        audit=audit,
    )


async def _settled(gw: Gateway, path: str) -> object:
    done, value = gw.dispatch_eager("fs", "read_bytes", {"path": path})
    if done:
        return value
    assert isinstance(value, asyncio.Task)
    return await value


async def test_dispatch_eager_completes_inline_or_hands_back_a_task() -> None:
    audit = RecordingAudit()
    gw = _gateway(_Fs(), audit)
    # An adapter coroutine that does not suspend is answered here, on every Python (3.11
    # through `start_eagerly`'s own eager start), with its audit row written.
    done, value = gw.dispatch_eager("fs", "read_bytes", {"path": "./data/a.bin"})
    assert done is True
    assert value == b"a" * 1024
    assert [r.outcome for r in audit.records] == ["ok"]
    done, task = gw.dispatch_eager("fs", "read_bytes", {"path": "./data/slow/b.bin"})
    assert done is False
    assert isinstance(task, asyncio.Task)
    assert [r.outcome for r in audit.records] == ["ok"]  # not finished yet: no row
    assert await task == b"b"
    assert [r.outcome for r in audit.records] == ["ok", "ok"]
    with pytest.raises(SuaveplanError) as info:
        gw.dispatch_eager("fs", "read_bytes", {"path": "./etc/passwd"})
    assert info.value.code == "SAND_PERM_DENIED"


async def test_an_adapter_raising_cancelled_error_inline_is_an_adapter_failure() -> None:
    audit = RecordingAudit()
    gw = _gateway(_SelfCancelling(), audit)
    with pytest.raises(SuaveplanError) as info:
        await _settled(gw, "./data/a.bin")
    assert info.value.code == "SAND_ADAPTER_FAILED"
    assert [r.outcome for r in audit.records] == ["error:SAND_ADAPTER_FAILED"]


@pytest.mark.parametrize("before_first_step", [True, False])
async def test_close_cancels_the_rest_of_a_suspended_request(before_first_step: bool) -> None:
    audit = RecordingAudit()
    fs = _Fs()
    gw = _gateway(fs, audit)
    done, task = gw.dispatch_eager("fs", "read_bytes", {"path": "./data/hang"})
    assert done is False
    assert isinstance(task, asyncio.Task)
    if not before_first_step:
        await asyncio.wait_for(fs.entered.wait(), 10)
        await asyncio.sleep(0)
    await gw.close()
    with pytest.raises(SuaveplanError) as info:
        await task
    assert info.value.code == "SAND_CANCELLED"
    assert [r.outcome for r in audit.records] == ["error:SAND_CANCELLED"]
    assert gw.inflight == 0
    # Entered eagerly, then cancelled (before the task's own first step, too), never leaked.
    assert fs.entered.is_set() and fs.cancelled == 1


async def test_a_cached_file_read_through_the_default_adapter_needs_no_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # End to end: the sandbox's default fs adapter (no `proxies=`) answers a read the caches
    # hold as `Ready`, which the VM host's gateway takes without starting a task.
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.bin").write_bytes(b"z" * 1024)
    (tmp_path / "plugin.py").write_text(PLUGIN)
    async with await create_vm_sandbox(
        plugin_module_path=tmp_path / "plugin.py", policy=_policy(tmp_path)
    ) as sb:
        assert await sb.call("read", "./data/a.bin") == b"z" * 1024  # warms the caches
        # A miss (here a missing file) still goes to the adapter's thread, in a task.
        assert await sb.call("try_read", "./data/missing.bin") == ["error", "SAND_FS_NOT_FOUND"]
        if not BeneathRootFs(tmp_path).inline_io:  # no inline path here: the thread answers
            assert await sb.call("read", "./data/a.bin") == b"z" * 1024
            return

        def no_task(*_args: object) -> object:
            raise AssertionError("a cached read started a task")

        monkeypatch.setattr(gateway_module, "start_eagerly", no_task)
        assert await sb.call("read_all", ["./data/a.bin"] * 5) == [b"z" * 1024] * 5
