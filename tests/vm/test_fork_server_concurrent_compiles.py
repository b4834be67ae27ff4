"""One tenant's expensive upload must not stall everyone's sandbox creation: the fork server
keeps serving forks, pings and other loads while compile children run, runs at most
`_MAX_COMPILING` of them and queues further loads, shares one child between loads of one
bundle, remembers refusals that depend on the source alone, and a fork server that dies
with loads outstanding fails every one of them and is restarted on next use.

A "held" compile is a compile child stopped in a test-only hook until the test releases it
(SIGUSR1): the fork server is started by a bootstrap that wraps `compile_bundle` so that a
bundle whose source contains `HOLD` waits there. The zygote and everything it forks keep
SIGUSR1 blocked, so a release sent early is kept pending, never fatal. Ordering is proved by
what has and has not finished when the hold is released, never by timing; `WAIT` only turns
a hang (the old, serialised fork server) into a failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final, TypeVar

import msgpack
import psutil
import pytest

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.vm import _zygote, _zygote_main, create_vm_sandbox, create_vm_sandbox_sync
from suaveplan_sandbox.vm._guest import PluginBundle, load_plugin
from suaveplan_sandbox.vm._zygote import ForkServer

_T = TypeVar("_T")

WAIT: Final = 60.0  # a hang detector, not a measurement
HOLD: Final = "# HOLD this compile until SIGUSR1\n"

_HOOK = """
import signal
from suaveplan_sandbox.vm import _compile_child

_real = _compile_child.compile_bundle

def _held(bundle):
    if any("# HOLD" in m.source for m in bundle.modules):
        signal.sigwait({signal.SIGUSR1})
    return _real(bundle)

_compile_child.compile_bundle = _held
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
"""
_HELD_BOOTSTRAP: Final = (
    "import sys, json; sys.path[:0] = json.loads(sys.argv[2]); "
    f"exec({_HOOK!r}); "
    "from suaveplan_sandbox.vm._zygote_main import main; main(int(sys.argv[1]))"
)


class Held:
    """A private fork server (installed as the process-wide one) whose compiles of `HOLD`
    sources wait for `release`, and a thread pool to call it from."""

    def __init__(self) -> None:
        self.server = ForkServer(bootstrap=_HELD_BOOTSTRAP)
        self.pool = ThreadPoolExecutor(max_workers=8)

    def start(self, fn: Callable[..., _T], *args: Any) -> Future[_T]:
        return self.pool.submit(fn, *args)

    def soon(self, fn: Callable[..., _T], *args: Any) -> _T:
        """`fn(*args)` on another thread; one still blocked after `WAIT` fails the test."""
        return self.start(fn, *args).result(timeout=WAIT)

    def ping_until(self, ready: Callable[[ForkServer], bool], what: str) -> None:
        deadline = time.monotonic() + WAIT
        while True:
            self.soon(self.server.ping)
            if ready(self.server):
                return
            if time.monotonic() > deadline:
                raise AssertionError(what)
            time.sleep(0.01)

    def compile_children(self) -> set[int]:
        """The zygote's children that are not workers: its compile children."""
        pid = self.server.pid
        assert pid is not None
        out = set()
        for child in psutil.Process(pid).children():
            try:
                if child.status() != psutil.STATUS_ZOMBIE and child.pid not in self.server.live:
                    out.add(child.pid)
            except psutil.NoSuchProcess:
                continue
        return out

    def wait_for_compile_children(self, n: int) -> set[int]:
        deadline = time.monotonic() + WAIT
        while len(found := self.compile_children()) < n:
            if time.monotonic() > deadline:
                raise AssertionError(f"{n} compile children never started")
            time.sleep(0.01)
        return found

    def release(self, pid: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGUSR1)

    def release_all(self) -> None:
        if self.server.pid is None:
            return
        try:
            children = psutil.Process(self.server.pid).children()
        except psutil.NoSuchProcess:
            return
        for child in children:
            self.release(child.pid)


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> Iterator[Held]:
    h = Held()
    monkeypatch.setattr(_zygote, "_server", h.server)  # creates go through it
    h.server.ping()
    try:
        yield h
    finally:
        h.release_all()  # a failed test leaves nothing held
        h.server.shutdown()
        h.pool.shutdown(wait=True, cancel_futures=True)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _create(path: Path) -> object:
    policy = PermissionPolicy.from_manifest({"name": "concurrent"}, root=path.parent)

    async def main() -> object:
        async with await create_vm_sandbox(plugin_module_path=path, policy=policy) as sb:
            return await sb.call("f")

    return asyncio.run(main())


def _refused(fn: Callable[..., object], *args: Any) -> SuaveplanError:
    with pytest.raises(SuaveplanError) as info:
        fn(*args)
    return info.value


def _gone(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


@pytest.mark.timeout(300)
def test_a_held_compile_blocks_neither_a_create_of_a_loaded_plugin_nor_another_load(
    held: Held, tmp_path: Path
) -> None:
    ready = _write(tmp_path / "ready.py", "def f():\n    return 1\n")
    assert _create(ready) == 1  # loaded, so the create below only forks
    hostile = _write(tmp_path / "hostile.py", HOLD + "def f():\n    return 2\n")
    small = _write(tmp_path / "small.py", "def f():\n    return 3\n")

    stalled = held.start(load_plugin, hostile)
    held.wait_for_compile_children(1)
    created = held.start(_create, ready)
    loaded = held.start(load_plugin, small)
    try:
        assert created.result(timeout=WAIT) == 1
        assert loaded.result(timeout=WAIT).name == "small"
        assert not stalled.done()  # both finished while the hostile compile was held
    finally:
        held.release_all()
    assert stalled.result(timeout=WAIT).name == "hostile"
    assert held.soon(_create, hostile) == 2
    assert held.server.starts == 1


@pytest.mark.timeout(300)
def test_concurrent_loads_of_one_bundle_share_one_compile_child(held: Held, tmp_path: Path) -> None:
    hostile = _write(tmp_path / "shared.py", HOLD + "def f():\n    return 4\n")
    before = held.server.compiles
    first = held.start(load_plugin, hostile)
    second = held.start(load_plugin, hostile)
    held.ping_until(lambda s: s.waiting == 2, "both loads never reached the fork server")
    assert held.server.compiles == before + 1
    assert len(held.compile_children()) == 1
    held.release_all()
    assert first.result(timeout=WAIT).digest == second.result(timeout=WAIT).digest
    held.soon(held.server.ping)
    assert (held.server.compiles, held.server.waiting) == (before + 1, 0)
    assert held.soon(_create, hostile) == 4


@pytest.mark.timeout(300)
def test_beyond_the_cap_a_load_waits_for_a_free_compile_child_then_completes(
    held: Held, tmp_path: Path
) -> None:
    cap = _zygote_main._MAX_COMPILING
    before = held.server.compiles
    hostiles = [
        _write(tmp_path / f"busy{i}.py", HOLD + f"def f():\n    return {i}\n") for i in range(cap)
    ]
    stalled = [held.start(load_plugin, path) for path in hostiles]
    busy = held.wait_for_compile_children(cap)
    small = _write(tmp_path / "next.py", "def f():\n    return 9\n")
    queued = held.start(load_plugin, small)
    held.ping_until(lambda s: s.queued == 1, "the load beyond the cap was never queued")
    assert (held.server.compiles, held.server.compiling) == (before + cap, cap)
    assert not queued.done()

    held.release(min(busy))  # one slot frees up: the queued load takes it
    assert queued.result(timeout=WAIT).name == "next"
    assert not all(f.done() for f in stalled)  # the others are still held
    held.soon(held.server.ping)
    assert (held.server.compiles, held.server.queued) == (before + cap + 1, 0)

    held.release_all()
    assert sorted(f.result(timeout=WAIT).name for f in stalled) == [p.stem for p in hostiles]
    held.soon(held.server.ping)
    assert not busy & set(held.server.exited)  # compile children are never reported exited


@pytest.mark.timeout(300)
def test_a_fork_server_killed_with_loads_outstanding_fails_each_and_the_next_create_works(
    held: Held, tmp_path: Path
) -> None:
    cap = _zygote_main._MAX_COMPILING
    ready = _write(tmp_path / "ready.py", "def f():\n    return 7\n")
    load_plugin(ready)
    paths = [
        _write(tmp_path / f"doomed{i}.py", HOLD + f"def f():\n    return {i}\n")
        for i in range(cap + 1)
    ]
    # `cap` compiling, one queued, and one more sharing the first's child.
    outstanding = [held.start(load_plugin, path) for path in [*paths, paths[0]]]
    held.ping_until(
        lambda s: s.waiting == len(outstanding), "the loads never reached the fork server"
    )
    children = held.compile_children()
    assert len(children) == cap
    # A worker forked meanwhile outlives the fork server and must not keep the compile
    # children alive with it (it holds none of their pipes).
    policy = PermissionPolicy.from_manifest({"name": "survivor"}, root=tmp_path)
    survivor = create_vm_sandbox_sync(plugin_module_path=ready, policy=policy)
    zygote = held.server.pid
    assert zygote is not None
    os.kill(zygote, signal.SIGKILL)

    for future in outstanding:
        err = future.exception(timeout=WAIT)
        assert isinstance(err, SuaveplanError)
        assert err.code == "SAND_VM_FORK_SERVER_FAILED"
    # The compile children die with their fork server (their lifeline), held or not.
    deadline = time.monotonic() + WAIT
    while not all(_gone(pid) for pid in children):
        assert time.monotonic() < deadline, "a compile child outlived its fork server"
        time.sleep(0.01)
    with survivor:
        assert survivor.call("f") == 7
    ok = _write(tmp_path / "after.py", "def f():\n    return 5\n")
    assert held.soon(_create, ok) == 5
    assert held.server.starts == 2


def test_a_refusal_is_remembered_and_its_next_create_forks_no_compile_child(
    held: Held, tmp_path: Path
) -> None:
    bad = _write(tmp_path / "bad.py", "import socket\n\ndef f():\n    return 1\n")
    before = held.server.compiles
    first = _refused(_create, bad)
    assert (first.code, first.details) == (
        "SAND_VM_MODULE_IMPORT_FORBIDDEN",
        {"module": "socket", "file": "bad.py", "line": 1},
    )
    held.server.ping()
    assert held.server.compiles == before + 1
    for _ in range(2):
        again = _refused(_create, bad)
        assert (again.code, again.details) == (first.code, first.details)
    held.server.ping()
    assert held.server.compiles == before + 1


def test_a_refusal_that_depends_on_the_compile_limits_is_not_remembered(
    held: Held, tmp_path: Path
) -> None:
    # About 200 KB of `[f,f,...]`: well within the default memory, not within 64 MB.
    body = "def f():\n    return 1\n\nx = [" + "f," * 100_000 + "]\n"
    bundle = load_plugin(_write(tmp_path / "dense.py", body), _without_interpreter_layer=True)
    server = held.server
    before = server.compiles
    for n in (1, 2):
        err = _refused(lambda: server.load(bundle, compile_memory_mb=64))
        assert (err.code, err.details["reason"], err.details["resource"]) == (
            "SAND_VM_SYNTAX_FORBIDDEN",
            "too-complex-to-compile",
            "memory",
        )
        server.ping()
        assert server.compiles == before + n  # each checked again, in a child of its own
    server.load(bundle)
    assert server.holds(bundle.digest)


def _raw_load(server: ForkServer, bundle: PluginBundle) -> None:
    ctl = server._ctl
    assert ctl is not None
    socket.send_fds(ctl, [msgpack.packb({"op": "load", "id": 1, "bundle": bundle.to_wire()})], [])


@pytest.mark.timeout(300)
def test_a_host_gone_mid_compile_takes_the_fork_server_and_its_compile_child_with_it(
    held: Held, tmp_path: Path
) -> None:
    hostile = _write(tmp_path / "orphan.py", HOLD + "def f():\n    return 6\n")
    bundle = load_plugin(hostile, _without_interpreter_layer=True)  # not loaded by this
    server = held.server
    proc, ctl = server._proc, server._ctl
    assert proc is not None
    assert ctl is not None
    _raw_load(server, bundle)
    (child,) = held.wait_for_compile_children(1)
    ctl.close()  # what the kernel does for a host that exits or is SIGKILLed
    assert proc.wait(timeout=WAIT) == 0  # the zygote saw EOF mid-compile and ended
    deadline = time.monotonic() + WAIT
    while not _gone(child):
        assert time.monotonic() < deadline, "the compile child outlived its host"
        time.sleep(0.01)


def test_requests_from_many_threads_each_get_their_own_answer(held: Held) -> None:
    server = held.server
    zygote = server.pid

    def bare() -> int:
        ours, theirs = socket.socketpair()
        try:
            pid = server.fork_bare(theirs)
            theirs.close()
            ours.settimeout(WAIT)
            assert ours.recv(1) == b"r"
            return pid
        finally:
            ours.close()
            theirs.close()

    def work(n: int) -> list[int]:
        return [bare() if (n + i) % 2 else server.ping() for i in range(10)]

    results = [held.start(work, n) for n in range(8)]
    answers = [pid for future in results for pid in future.result(timeout=WAIT)]
    forked = [pid for pid in answers if pid != zygote]
    assert len(forked) == 40
    assert len(set(forked)) == 40  # each fork got its own worker's pid, not another's
    assert server.ping() == zygote
    assert server.starts == 1


def test_a_host_not_reading_its_replies_never_stops_the_zygote_reading_requests(
    held: Held,
) -> None:
    # More requests than both directions of the control socket hold unread: a zygote that
    # blocked sending replies nobody reads would stop reading, and the sends would block too.
    server = held.server
    ctl = server._ctl
    assert ctl is not None
    ids = range(10_000, 12_000)

    def send_all() -> None:
        for req_id in ids:
            ctl.send(msgpack.packb({"op": "ping", "id": req_id}))

    held.soon(send_all)  # every request went out before a single reply was read
    answered: set[int] = set()
    while len(answered) < len(ids):
        rep = msgpack.unpackb(ctl.recv(65536), raw=False)
        if rep.get("op") == "pong":
            answered.add(rep["id"])
    assert answered == set(ids)
    assert server.ping() == server.pid
