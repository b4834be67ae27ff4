"""Creates do not queue behind an unrelated compile, and creates of one module share a compile.

Ordering, not time: the compile child that takes the first request is stopped (SIGSTOP)
before the request reaches it, so that compile cannot finish until the test lets it go; what
must happen meanwhile is then awaited with a liveness guard (a create stuck behind it would
wait minutes, the wall-clock limit of a compile). The module cache, the disk cache and a
second compile child each answer while it is held.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Final

import pytest

from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.wasm import _engine, create_wasm_sandbox
from suaveplan_sandbox.wasm._compile_child import compile_server
from wasm._module_bytes import answer

if TYPE_CHECKING:
    from suaveplan_sandbox.wasm._compile_child import CompilePool

# A liveness guard: far longer than any create here takes when nothing holds it up.
_GUARD_S: Final = 60.0


def _policy(root: Path) -> PermissionPolicy:
    return PermissionPolicy.from_manifest({"name": "guest", "permissions": {}}, root=root)


def _write(tmp_path: Path, wasm: bytes) -> Path:
    path = tmp_path / f"{uuid.uuid4().hex}.wasm"
    path.write_bytes(wasm)
    return path


async def _until(condition: object, what: str) -> None:
    assert callable(condition)
    for _ in range(int(_GUARD_S / 0.005)):  # a liveness guard, not a timing assertion
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"never happened: {what}")


async def _answers(root: Path, path: Path, **options: object) -> object:
    sb = await asyncio.wait_for(
        create_wasm_sandbox(wasm_module_path=path, policy=_policy(root), **options),  # type: ignore[arg-type]
        timeout=_GUARD_S,
    )
    async with sb:
        return await sb.call("answer")


class _Held:
    """Stops the compile child the next request goes to; lets it go again at the end."""

    def __init__(self) -> None:
        self.pool: CompilePool = compile_server()
        self.pid: int | None = None

    def stop(self) -> int:
        self.pool.compile(answer(0), memory_bytes=64 * 1024 * 1024, cpu_seconds=5)  # warm
        pid = self.pid = self.pool.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        return pid

    def release(self) -> None:
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGCONT)


@pytest.fixture
async def held() -> AsyncIterator[_Held]:
    # Async: torn down inside the test's event loop, before the loop waits for its threads
    # (one of them may be waiting on the stopped child).
    holder = _Held()
    try:
        yield holder
    finally:
        holder.release()


async def test_a_cached_module_and_another_new_module_do_not_wait_for_a_held_compile(
    root: Path, tmp_path: Path, held: _Held
) -> None:
    pool = held.pool
    in_memory, on_disk = _write(tmp_path, answer(2)), _write(tmp_path, answer(3))
    cache = tmp_path / "cache"
    assert await _answers(root, in_memory) == 2
    assert await _answers(root, on_disk, cache_dir=cache) == 3
    _engine._modules.pop(hashlib.sha256(on_disk.read_bytes()).hexdigest())  # disk only now
    stopped = held.stop()
    requests = pool.requests
    held_create = asyncio.create_task(_answers(root, _write(tmp_path, answer(1))))
    await _until(lambda: pool.busy_pid == stopped, "the first compile reached the held child")
    # While that compile cannot finish: a module cached in memory, one cached on disk, and a
    # new module compiled by another child.
    assert await _answers(root, in_memory) == 2
    assert await _answers(root, on_disk, cache_dir=cache) == 3
    assert await _answers(root, _write(tmp_path, answer(4))) == 4
    assert not held_create.done()
    assert pool.requests == requests + 2
    held.release()
    assert await asyncio.wait_for(held_create, _GUARD_S) == 1


async def test_creates_of_the_same_new_module_share_one_compile(
    root: Path, tmp_path: Path, held: _Held
) -> None:
    pool, stopped = held.pool, held.stop()
    wasm = answer(5)
    digest = hashlib.sha256(wasm).hexdigest()
    before, requests = _engine.compile_count(), pool.requests
    first = asyncio.create_task(asyncio.to_thread(_engine.load_module, wasm))
    await _until(lambda: pool.busy_pid == stopped, "the compile reached the held child")
    # Two more creates of the same bytes (one by file, one by bytes) join the compile in flight.
    by_file = asyncio.create_task(_answers(root, _write(tmp_path, wasm)))
    by_bytes = asyncio.create_task(asyncio.to_thread(_engine.load_module, wasm))
    flights = _engine._flights
    await _until(lambda: flights[digest].joined == 2, "both joined the compile")
    assert pool.requests == requests + 1
    held.release()
    module = await asyncio.wait_for(first, _GUARD_S)
    assert await asyncio.wait_for(by_bytes, _GUARD_S) is module
    assert await asyncio.wait_for(by_file, _GUARD_S) == 5
    assert _engine.compile_count() == before + 1
    assert pool.requests == requests + 1
    assert digest not in _engine._flights
