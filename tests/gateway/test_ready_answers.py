"""`Ready`: an adapter answer that is there already. Awaited like a coroutine anywhere; taken
by the gateway without a task, a loop trip or a hop to the loop."""

from __future__ import annotations

import asyncio
import gc
import threading
import warnings
from pathlib import Path

import pytest

from suaveplan_sandbox.adapters import Adapters, BeneathRootFs, Ready
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.gateway import Gateway, _gateway
from suaveplan_sandbox.metrics import CAPABILITY_CALLS, InMemoryMetrics
from suaveplan_sandbox.permissions import PermissionChecker, PermissionPolicy
from suaveplan_sandbox.testing import RecordingAudit

# -- Ready on its own ---------------------------------------------------------------------------


async def test_awaiting_gives_the_value_without_suspending() -> None:
    ran: list[str] = []
    asyncio.get_running_loop().call_soon(ran.append, "loop turned")
    assert await Ready(b"x") == b"x"
    assert ran == []  # nothing else ran: the await never gave the loop a turn


async def test_tasks_gather_and_futures_accept_it_as_a_coroutine() -> None:
    task = asyncio.create_task(Ready(1))
    assert await task == 1
    assert list(await asyncio.gather(Ready(2), asyncio.ensure_future(Ready(3)))) == [2, 3]
    assert await asyncio.wait_for(Ready(4), timeout=1) == 4


async def test_a_task_cancelled_before_its_first_step_is_cancelled() -> None:
    task = asyncio.create_task(Ready(1))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_thrown_in_is_raised_out_and_close_is_harmless() -> None:
    ready = Ready(1)
    with pytest.raises(KeyError):
        ready.throw(KeyError("k"))
    with pytest.raises(ValueError, match="v"):
        ready.throw(ValueError, ValueError("v"))
    ready.close()
    with pytest.raises(StopIteration) as stop:
        ready.send(None)
    assert stop.value.value == 1


def test_dropping_one_unawaited_warns_nothing() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Ready(1)
        gc.collect()


# -- through the gateway ------------------------------------------------------------------------

MANIFEST = {"name": "ready", "version": "1.0.0", "permissions": {"fs": ["./data/*"]}}


class _ReadyFs:
    """Answers every read at once, as `Ready`; counts the calls."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def read_bytes(self, path: str, *, max_bytes: int) -> Ready[bytes]:
        self.calls.append(path)
        return Ready(b"answer")


def _gateway_for(fs: object, root: Path) -> tuple[Gateway, RecordingAudit, InMemoryMetrics]:
    metrics, audit = InMemoryMetrics(), RecordingAudit()
    checker = PermissionChecker(
        PermissionPolicy.from_manifest(MANIFEST, root=root), metrics=metrics
    )
    return Gateway(checker=checker, adapters=Adapters(fs=fs), audit=audit), audit, metrics  # type: ignore[arg-type]


def _no_task(*_args: object) -> object:
    raise AssertionError("a Ready answer must not start a task")


async def test_dispatch_eager_takes_the_value_without_a_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs = _ReadyFs()
    gateway, audit, metrics = _gateway_for(fs, tmp_path)
    monkeypatch.setattr(_gateway, "start_eagerly", _no_task)
    assert gateway.dispatch_eager("fs", "read_bytes", {"path": "./data/a"}) == (True, b"answer")
    assert fs.calls == ["data/a"]
    assert [(r.operation, r.allowed, r.outcome) for r in audit.records] == [
        ("read_bytes", True, "ok")
    ]
    calls = metrics.value(CAPABILITY_CALLS.name, plugin="ready", capability="fs", outcome="ok")
    assert calls == 1


async def test_dispatch_and_dispatch_sync_take_it_too(tmp_path: Path) -> None:
    fs = _ReadyFs()
    gateway, audit, _ = _gateway_for(fs, tmp_path)
    assert await gateway.dispatch("fs", "read_bytes", {"path": "./data/a"}) == b"answer"
    got: list[object] = []
    # On a thread with no loop and no `run_coroutine`: a coroutine would fail closed here,
    # a Ready is answered on the spot.
    thread = threading.Thread(
        target=lambda: got.append(gateway.dispatch_sync("fs", "read_bytes", {"path": "./data/b"}))
    )
    thread.start()
    thread.join(10)
    assert got == [b"answer"]
    assert fs.calls == ["data/a", "data/b"]
    assert [r.outcome for r in audit.records] == ["ok", "ok"]


# -- BeneathRootFs ------------------------------------------------------------------------------


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a").write_bytes(b"A" * 100)
    (tmp_path / "data" / "a").read_bytes()  # in the page cache
    return tmp_path


async def test_beneath_root_fs_answers_cached_reads_as_ready_and_others_as_coroutines(
    root: Path,
) -> None:
    inline, threaded = BeneathRootFs(root), BeneathRootFs(root, inline_io=False)
    try:
        assert inline.inline_io
        answer = inline.read_bytes("data/a", max_bytes=1000)
        for _ in range(3):  # a first look may miss the dentry cache
            if type(answer) is Ready:
                break
            await answer
            answer = inline.read_bytes("data/a", max_bytes=1000)
        assert type(answer) is Ready
        assert await answer == b"A" * 100
        assert type(inline.exists("data/a")) is Ready
        for call in (
            threaded.read_bytes("data/a", max_bytes=1000),
            threaded.exists("data/a"),
            inline.read_bytes("data/a", max_bytes=10),  # over the limit: the thread says so
        ):
            assert asyncio.iscoroutine(call) and type(call) is not Ready
            call.close()
        # Callers that start tasks, as for any coroutine, work with both shapes.
        reads = [
            inline.read_bytes("data/a", max_bytes=1000),
            threaded.read_bytes("data/a", max_bytes=1000),
        ]
        assert [await asyncio.create_task(r) for r in reads] == [b"A" * 100] * 2
        with pytest.raises(SuaveplanError) as info:
            await inline.read_bytes("data/a", max_bytes=10)
        assert info.value.code == "SAND_FS_TOO_LARGE"
    finally:
        inline.close()
        threaded.close()


async def test_a_cached_read_through_dispatch_sync_never_hops_to_the_loop(root: Path) -> None:
    # The WASM guest thread's path: a read the caches hold is answered on that thread.
    fs = BeneathRootFs(root)
    gateway, _, _ = _gateway_for(fs, root)
    hops: list[object] = []
    loop = asyncio.get_running_loop()

    def run_coroutine(coro: object) -> object:
        hops.append(coro)
        return asyncio.run_coroutine_threadsafe(coro, loop).result(10)  # type: ignore[arg-type]

    def read() -> object:
        return gateway.dispatch_sync(
            "fs", "read_bytes", {"path": "./data/a"}, run_coroutine=run_coroutine
        )

    try:
        await asyncio.to_thread(read)  # warms the caches this path needs
        hops.clear()
        assert await asyncio.to_thread(read) == b"A" * 100
        assert hops == []
    finally:
        fs.close()
