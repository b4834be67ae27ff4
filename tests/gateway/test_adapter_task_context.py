"""Adapters always run inside an asyncio task, however the gateway starts them.

`asyncio.timeout`, `asyncio.TaskGroup`, anyio cancel scopes (httpx) and `current_task()` all
need a current task. The VM host serves host calls from its socket reader callback, where no
task is running, so a gateway that ran the adapter's first step right there would break such
adapters with "Timeout should be used inside a task" (or `SAND_ADAPTER_FAILED`).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from suaveplan_sandbox.adapters import Adapters
from suaveplan_sandbox.gateway import Gateway
from suaveplan_sandbox.permissions import PermissionChecker, PermissionPolicy
from suaveplan_sandbox.testing import InMemoryFs
from suaveplan_sandbox.vm import create_vm_sandbox

MANIFEST = {"name": "ctx", "version": "1.0.0", "permissions": {"fs": ["./data/*"]}}


class _TaskMindedFs:
    """Reads through `asyncio.timeout` and records whether a task was current."""

    def __init__(self) -> None:
        self.inner = InMemoryFs({"data/now.txt": b"now", "data/later.txt": b"later"})
        self.saw_task: list[bool] = []

    async def read_bytes(self, path: str, *, max_bytes: int) -> bytes:
        self.saw_task.append(asyncio.current_task() is not None)
        async with asyncio.timeout(5):
            if path == "data/later.txt":
                await asyncio.sleep(0.001)
            return await self.inner.read_bytes(path, max_bytes=max_bytes)

    async def write_bytes(self, path: str, data: bytes) -> None:
        await self.inner.write_bytes(path, data)

    async def list_dir(self, path: str) -> list[str]:
        return await self.inner.list_dir(path)

    async def exists(self, path: str) -> bool:
        return await self.inner.exists(path)


def _gateway(fs: _TaskMindedFs) -> Gateway:
    policy = PermissionPolicy.from_manifest(MANIFEST, root="/srv/ctx")
    return Gateway(checker=PermissionChecker(policy), adapters=Adapters(fs=fs))


async def _from_a_loop_callback(gateway: Gateway, path: str) -> object:
    """`dispatch_eager` as the VM host calls it: from a plain callback, not from a task."""
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[object] = loop.create_future()

    def callback() -> None:
        try:
            done, value = gateway.dispatch_eager("fs", "read_bytes", {"path": path})
        except Exception as exc:
            answer.set_exception(exc)
            return
        if done:
            answer.set_result(value)
        else:
            assert isinstance(value, asyncio.Task)
            value.add_done_callback(settle)

    def settle(task: asyncio.Task[object]) -> None:
        error = task.exception()
        if error is not None:
            answer.set_exception(error)
        else:
            answer.set_result(task.result())

    loop.call_soon(callback)
    return await answer


async def test_an_eagerly_started_adapter_runs_inside_a_task() -> None:
    fs = _TaskMindedFs()
    gateway = _gateway(fs)
    assert await _from_a_loop_callback(gateway, "./data/now.txt") == b"now"
    assert await _from_a_loop_callback(gateway, "./data/later.txt") == b"later"
    assert fs.saw_task == [True, True]
    assert gateway.inflight == 0


async def test_a_vm_guest_reads_through_an_adapter_that_needs_a_task(tmp_path: Path) -> None:
    (tmp_path / "plugin.py").write_text(
        "import suaveplan\n\ndef read(path):\n    return suaveplan.fs.read_bytes(path)\n"
    )
    fs = _TaskMindedFs()
    policy = PermissionPolicy.from_manifest(MANIFEST, root=tmp_path)
    async with await create_vm_sandbox(
        plugin_module_path=tmp_path / "plugin.py", policy=policy, proxies=Adapters(fs=fs)
    ) as sb:
        assert await sb.call("read", "./data/now.txt") == b"now"
        assert await sb.call("read", "./data/later.txt") == b"later"
    assert fs.saw_task == [True, True]
