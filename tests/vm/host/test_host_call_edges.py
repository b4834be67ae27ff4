"""Edges of a host call's life: an adapter that raises what is not an Exception, a plugin
finalizer that calls the host while the worker waits for an answer, and `dispose()` awaited
on an event loop other than the sandbox's own."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from suaveplan_sandbox._loop_thread import LoopThread
from suaveplan_sandbox.adapters import Adapters, QueryResult
from suaveplan_sandbox.errors import SuaveplanError, WireValue
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.testing import FakeDb, InMemoryFs
from suaveplan_sandbox.vm import VmSandbox, create_vm_sandbox

READER = """
import suaveplan
from suaveplan import SuaveplanError


def read():
    return suaveplan.fs.read_bytes('./data/a.bin')


def read_or_code():
    try:
        return suaveplan.fs.read_bytes('./data/a.bin')
    except SuaveplanError as exc:
        return exc.code
"""


class _InterruptOnce:
    """An in-memory fs whose first read raises `KeyboardInterrupt`; later reads read."""

    def __init__(self, files: dict[str, bytes], *, suspend: bool) -> None:
        self.inner = InMemoryFs(files)
        self.suspend = suspend
        self.interrupted = False

    async def read_bytes(self, path: str, *, max_bytes: int) -> bytes:
        if not self.interrupted:
            self.interrupted = True
            if self.suspend:  # raised from a task the loop runs, not inline
                await asyncio.sleep(0)
            raise KeyboardInterrupt
        return await self.inner.read_bytes(path, max_bytes=max_bytes)

    async def write_bytes(self, path: str, data: bytes) -> None:
        await self.inner.write_bytes(path, data)

    async def list_dir(self, path: str) -> list[str]:
        return await self.inner.list_dir(path)

    async def exists(self, path: str) -> bool:
        return await self.inner.exists(path)


def _reader_policy(tmp: Path, *, wall_ms: int = 60_000) -> PermissionPolicy:
    return PermissionPolicy.from_manifest(
        {
            "name": "reader",
            "permissions": {"fs": ["./data/*"], "budgets": {"wallClockMs": wall_ms}},
        },
        root=tmp,
    )


@pytest.mark.parametrize("suspend", [False, True], ids=["inline", "on-the-loop"])
def test_an_adapter_raising_keyboard_interrupt_still_answers_the_worker(
    tmp_path: Path, suspend: bool
) -> None:
    # KeyboardInterrupt (or SystemExit) from an adapter propagates to the host, as it must;
    # the worker waiting for that host call's answer used to get none, so the call stayed in
    # flight until its wall-clock budget killed the worker, and every call queued behind it
    # failed. A host that catches the interrupt and carries on must find its sandbox working.
    (tmp_path / "p.py").write_text(READER)
    fs = _InterruptOnce({"data/a.bin": b"payload"}, suspend=suspend)
    loop = asyncio.new_event_loop()
    try:
        sb = loop.run_until_complete(
            create_vm_sandbox(
                plugin_module_path=tmp_path / "p.py",
                policy=_reader_policy(tmp_path),
                proxies=Adapters(fs=fs),
            )
        )
        first = loop.create_task(sb.call("read_or_code"))
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(first)
        if first.done():
            # Raised in the call's own task (the call was waiting for its answer inline):
            # that call ends with the interrupt, as any code it awaited would.
            assert isinstance(first.exception(), KeyboardInterrupt)
        else:
            # Raised in the loop's reader callback: the call goes on, and ends with the
            # plugin's own answer (the adapter failure reached it as a coded error).
            assert loop.run_until_complete(asyncio.wait_for(first, 30)) == "SAND_ADAPTER_FAILED"
        # Either way the worker was answered: the next call is served, not queued behind a
        # call left in flight until its wall-clock budget (60 s here) killed the worker.
        assert loop.run_until_complete(asyncio.wait_for(sb.call("read"), 30)) == b"payload"
        assert sb.state == "idle"
        loop.run_until_complete(sb.dispose())
    finally:
        loop.close()


FINALIZER = """
import suaveplan


class Cycle:
    def __init__(self):
        self.me = self

    def __del__(self):
        # Runs whenever the collector finds the cycle: possibly while the worker is decoding
        # the answer to another host call.
        suaveplan.db.query('SELECT 1 FROM fin_t', [])


def churn(rounds):
    total = 0
    for _ in range(rounds):
        for _ in range(50):
            Cycle()
        total += len(suaveplan.db.query('SELECT 2 FROM fin_t', []))
    return total
"""


def test_a_finalizer_calling_the_host_during_a_host_call_does_not_stall_the_call(
    tmp_path: Path,
) -> None:
    # Every answer of 3,000 rows makes the worker allocate enough to run the cyclic garbage
    # collector while it decodes, and there is always garbage with a finalizer that calls the
    # host. A host call made from inside the worker's own read re-entered the decoder: the
    # outer call's answer was taken by the inner one and the outer waited until its budget
    # ended (or the worker broke protocol). Finalizers now run in plugin code only.
    (tmp_path / "p.py").write_text(FINALIZER)
    rows = [[i] for i in range(3000)]

    def handler(sql: str, params: Sequence[WireValue]) -> QueryResult:
        return QueryResult(columns=("n",), rows=tuple(tuple(r) for r in rows), rowcount=3000)

    db = FakeDb(handler)
    policy = PermissionPolicy.from_manifest(
        {
            "name": "fin",
            "database": {"tablePrefix": "fin_"},
            "permissions": {"budgets": {"wallClockMs": 60_000}},
        },
        root=tmp_path,
    )

    async def run() -> object:
        sb = await create_vm_sandbox(
            plugin_module_path=tmp_path / "p.py", policy=policy, proxies=Adapters(db=db)
        )
        try:
            return await sb.call("churn", 40)
        finally:
            await sb.dispose()

    assert asyncio.run(run()) == 40 * 3000
    outer = [q for q in db.queries if q[0].startswith("SELECT 2")]
    assert len(outer) == 40
    assert any(q[0].startswith("SELECT 1") for q in db.queries)  # the finalizers ran


COUNTER = """
CALLS = []


def bump():
    CALLS.append(1)
    return len(CALLS)
"""


def _counter(tmp: Path) -> tuple[Path, PermissionPolicy]:
    (tmp / "p.py").write_text(COUNTER)
    return tmp / "p.py", PermissionPolicy.from_manifest({"name": "counter"}, root=tmp)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie not yet reaped by the fork server still answers signal 0: read its state.
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone between the open and the read
        return False


def test_dispose_awaited_on_another_running_loop_disposes_on_the_sandbox_loop(
    tmp_path: Path,
) -> None:
    # The socket, timers and futures are the creating loop's: dispose() awaited on another
    # loop (another thread) used to remove readers and cancel handles of a loop running in
    # a different thread. It now does its work on the sandbox's own loop and returns when
    # that is done.
    path, policy = _counter(tmp_path)
    lt = LoopThread("dispose-owner")
    try:

        async def create() -> VmSandbox:
            return await create_vm_sandbox(
                plugin_module_path=path, policy=policy, proxies=Adapters()
            )

        sb = lt.run(create())
        assert lt.run(sb.call("bump")) == 1
        ran_on: list[threading.Thread] = []
        real = sb._close_sock

        def spy() -> None:
            ran_on.append(threading.current_thread())
            real()

        sb._close_sock = spy  # type: ignore[method-assign]
        asyncio.run(sb.dispose())
        assert sb.state == "disposed"
        assert ran_on and all(t.name == "dispose-owner" for t in ran_on)
        assert not _eventually(lambda: _alive(sb.pid))
        with pytest.raises(SuaveplanError) as info:
            lt.run(sb.call("bump"))
        assert info.value.code == "SAND_VM_DISPOSED"
        asyncio.run(sb.dispose())  # a second dispose, from anywhere, is a no-op
    finally:
        lt.stop()


def test_dispose_after_the_creating_loop_closed_ends_the_worker(tmp_path: Path) -> None:
    # A script that created the sandbox under one `asyncio.run` and disposes it under
    # another: the first loop is closed, nothing can run on it, and the worker must still
    # end and the socket close.
    path, policy = _counter(tmp_path)

    async def create() -> VmSandbox:
        sb = await create_vm_sandbox(plugin_module_path=path, policy=policy, proxies=Adapters())
        assert await sb.call("bump") == 1
        return sb

    sb = asyncio.run(create())
    pid = sb.pid
    assert _alive(pid)
    asyncio.run(sb.dispose())
    assert sb.state == "disposed"
    assert not _eventually(lambda: _alive(pid))
    assert sb._sock is None


def test_dispose_when_the_creating_loop_is_stopped_ends_the_worker_now(tmp_path: Path) -> None:
    # The owning loop exists but does not turn (stopped, not closed): dispose cannot wait for
    # it for ever. The worker is ended at once; the loop-bound rest runs when it turns again.
    path, policy = _counter(tmp_path)
    owner = asyncio.new_event_loop()
    try:
        sb = owner.run_until_complete(
            create_vm_sandbox(plugin_module_path=path, policy=policy, proxies=Adapters())
        )
        pid = sb.pid
        result: list[BaseException | None] = []

        def elsewhere() -> None:
            try:
                asyncio.run(sb.dispose())
                result.append(None)
            except BaseException as exc:
                result.append(exc)

        t = threading.Thread(target=elsewhere)
        t.start()
        t.join(60)
        assert not t.is_alive()
        assert result == [None]
        assert not _eventually(lambda: _alive(pid))
        owner.run_until_complete(asyncio.sleep(0.05))  # the rest runs when the loop turns
        assert sb.state == "disposed"
        assert sb._sock is None
    finally:
        owner.close()


def _eventually(alive: object, seconds: float = 10.0) -> bool:
    """False once `alive()` is false, within `seconds`; True if it stayed true."""
    import time

    assert callable(alive)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not alive():
            return False
        time.sleep(0.01)
    return True
