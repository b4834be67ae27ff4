"""A compromised worker red-teaming the host: what can it make the host do?

The worker runs with the in-interpreter layer switched off (the escape corpus's test-only
`load_plugin(..., _without_interpreter_layer=True)`, through the helpers of
`test_hostile_worker_frames`), so it holds what a plugin that escaped the interpreter holds:
arbitrary Python under the process layer, and its IPC socket. Each case is one angle of the
threat model's "what the host holds or does for a worker": the real holes this pass found
(each test failed before its fix) and probes that were already blocked, pinned so they stay
that way. No wall-clock asserts: a case proves itself with counts (CPU seconds the worker
burned, bytes the host buffered, log records, adapter calls) and `HANG` only turns a hang
into a failure.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgpack
import psutil
import pytest
from test_hostile_worker_frames import (
    HANG,
    RAW_PRELUDE,
    _assert_killed,
    _escaped,
    _next_id,
    frame,
)
from test_hostile_worker_frames import other as other_fixture

from suaveplan_sandbox.adapters import Adapters
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.metrics import (
    BUDGET_EXCEEDED,
    CAPABILITY_CALLS,
    PERMISSION_DENIED,
    InMemoryMetrics,
)
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.testing import FakeClock, FakeFetch, InMemoryEvents, InMemoryFs
from suaveplan_sandbox.vm import VmSandbox, create_vm_sandbox
from suaveplan_sandbox.vm import _sandbox as vm_sandbox_module

other = other_fixture

COMPROMISED = (
    RAW_PRELUDE
    + r"""
import _thread
import ctypes
import errno
import resource
import socket

import msgpack


def _frame(obj):
    body = msgpack.packb(obj, use_bin_type=True)
    return len(body).to_bytes(4, "big") + body


def answer_then(my_id, tail):
    # Answer this call, then write `tail` while the host believes the worker idle.
    fd = _fd()
    _write(fd, _frame(["result", my_id, "answered"]) + tail)
    time.sleep(3600)


def spin_after(threads):
    # Threads that spin once the call has been answered: the host sees an idle worker.
    def spin():
        time.sleep(0.05)
        while True:
            pass

    for _ in range(threads):
        _thread.start_new_thread(spin, ())
    return "spinning"


_held = []


def grow_after(megabytes):
    # Memory the worker fills once the call has been answered (resident: every byte written).
    def grow():
        time.sleep(0.05)
        _held.append(b"\x01" * (megabytes * 1024 * 1024))

    _thread.start_new_thread(grow, ())
    return "growing"


def hostcall_then_close(frames):
    # Host calls, then the socket closed: the host's answers meet a peer that is gone.
    fd = _fd()
    for data in frames:
        _write(fd, data)
    os.close(fd)
    time.sleep(3600)


def hostcalls_unread(my_id, path, count):
    # Host calls one after another without ever reading an answer: each is answered (the
    # host writes it), so none overlaps, and the answers pile up on the host's side.
    fd = _fd()
    for i in range(count):
        _write(fd, _frame(["hostcall", i + 1, "fs", "read_bytes", {"path": path}]))
    _write(fd, _frame(["result", my_id, count]))
    time.sleep(3600)


def flood(data, times=1):
    # Frames the guest's own limiter never saw, written as one burst during the call.
    fd = _fd()
    for _ in range(times):
        _write(fd, data)
    return "flooded"


def hostcalls(data, count):
    # Host calls written as one burst, then their `count` answers read back (the serve loop
    # would take an answer it never asked for as the host breaking the protocol).
    fd = _fd()
    _write(fd, data)
    buf, codes = b"", []
    while len(codes) < count:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            raise RuntimeError("eof")
        buf += chunk
        while len(buf) >= 4 and len(buf) >= 4 + int.from_bytes(buf[:4], "big"):
            size = int.from_bytes(buf[:4], "big")
            msg = msgpack.unpackb(buf[4 : 4 + size], raw=False)
            buf = buf[4 + size :]
            codes.append(msg[2].get("code") if msg[0] == "hostfailure" else "ok")
    return codes


def hostcalls_drained(unit, count):
    # `count` copies of one host call as fast as the socket takes them, while a thread reads
    # the answers (so the host's write buffer never fills): the host's socket is never empty.
    fd = _fd()
    seen = [0]

    def drain():
        buf = b""
        while seen[0] < count:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return
            buf += chunk
            while len(buf) >= 4 and len(buf) >= 4 + int.from_bytes(buf[:4], "big"):
                buf = buf[4 + int.from_bytes(buf[:4], "big") :]
                seen[0] += 1

    _thread.start_new_thread(drain, ())
    blob = unit * 1000
    for _ in range(count // 1000):
        _write(fd, blob)
    while seen[0] < count:
        time.sleep(0.001)
    return seen[0]


def send_and_stall(data):
    _write(_fd(), data)
    time.sleep(3600)


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _raw(nr, *args):
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    rc = libc.syscall(ctypes.c_long(nr), *(ctypes.c_long(a) for a in args))
    if rc == -1:
        raise OSError(ctypes.get_errno(), "raw syscall")
    return rc


def _mmap(size):
    libc = _libc()
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long
    ]
    addr = libc.mmap(None, size, 3, 0x22, -1, 0)  # PROT_READ|WRITE, MAP_PRIVATE|ANONYMOUS
    if addr is None or addr == ctypes.c_void_p(-1).value:
        raise OSError(ctypes.get_errno(), "mmap")
    return addr


def process_tricks(host_pid, sibling_pid):
    out = {}

    def attempt(name, fn):
        try:
            fn()
            out[name] = "allowed"
        except OSError as exc:
            out[name] = errno.errorcode.get(exc.errno, str(exc.errno))
        except ValueError:  # resource.setrlimit's word for EPERM
            out[name] = "EPERM"

    attempt("kill_host", lambda: os.kill(host_pid, 0))
    attempt("kill_sibling", lambda: os.kill(sibling_pid, 0))
    attempt("kill_fork_server", lambda: os.kill(os.getppid(), 0))
    attempt("ptrace_host", lambda: _raw(101, 16, host_pid, 0, 0))  # PTRACE_ATTACH
    attempt("ptrace_sibling", lambda: _raw(101, 16, sibling_pid, 0, 0))
    attempt("pidfd_host", lambda: _raw(434, host_pid, 0))  # pidfd_open
    attempt("nice_up", lambda: os.setpriority(os.PRIO_PROCESS, 0, -5))
    attempt("nice_host", lambda: os.setpriority(os.PRIO_PROCESS, host_pid, 19))
    attempt("sched_fifo", lambda: os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1)))
    attempt("sched_attr", lambda: _raw(314, 0, 0, 0))  # sched_setattr
    attempt("prlimit_host", lambda: resource.prlimit(host_pid, resource.RLIMIT_NOFILE))
    attempt("affinity_host", lambda: os.sched_setaffinity(host_pid, {0}))
    attempt(
        "raise_as_hard",
        lambda: resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY,) * 2),
    )
    attempt("open_host_environ", lambda: os.close(os.open(f"/proc/{host_pid}/environ", 0)))
    attempt("open_host_fd", lambda: os.close(os.open(f"/proc/{host_pid}/fd/0", 0)))
    attempt("open_own_socket", lambda: os.close(os.open(f"/proc/self/fd/{_fd()}", 0)))
    attempt("open_host_mem", lambda: os.close(os.open(f"/proc/{host_pid}/mem", 0)))
    attempt("process_vm_readv", lambda: _raw(310, host_pid, 0, 0, 0, 0, 0))
    attempt("readlink_host_cwd", lambda: os.readlink(f"/proc/{host_pid}/cwd"))
    attempt("readlink_host_exe", lambda: os.readlink(f"/proc/{host_pid}/exe"))
    attempt("readlink_host_fd", lambda: os.readlink(f"/proc/{host_pid}/fd/0"))
    attempt("readlink_sibling_cwd", lambda: os.readlink(f"/proc/{sibling_pid}/cwd"))
    attempt("half_close", lambda: _half_close(socket.SHUT_RD))
    attempt("mmap_past_rlimit", lambda: _mmap(64 << 30))
    attempt("mmap_untouched", lambda: _mmap(256 << 20))
    attempt("thread", lambda: _thread.start_new_thread(time.sleep, (0,)))
    out["fds"] = sorted(n for n in range(1024) if _isopen(n))
    return out


def _half_close(how):
    sock = socket.socket(fileno=os.dup(_fd()))
    try:
        sock.shutdown(how)
    finally:
        sock.close()


def _isopen(fd):
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False
"""
)


def _policy(tmp: Path, permissions: dict[str, Any]) -> PermissionPolicy:
    return PermissionPolicy.from_manifest({"name": "raw", "permissions": permissions}, root=tmp)


async def _compromised(
    tmp: Path,
    monkeypatch: pytest.MonkeyPatch,
    budgets: dict[str, int] | None = None,
    fs: object = None,
    **options: Any,
) -> VmSandbox:
    return await _escaped(tmp, monkeypatch, COMPROMISED, budgets, fs, **options)


async def _until_crashed(sb: VmSandbox, done: Any) -> None:
    """Turn the loop until the sandbox has crashed, or `done()` says the worker has had more
    than enough of its chance (a count, never a time); `HANG` turns a hang into a failure."""
    for _ in range(HANG * 100):
        if sb.state == "crashed" or done():
            return
        await asyncio.sleep(0.01)


async def _fatal(sb: VmSandbox) -> SuaveplanError:
    """The error that ended the sandbox, as its next call reports it (the cause)."""
    with pytest.raises(SuaveplanError) as info:
        await sb.call("spin_after", 0)
    assert info.value.code == "SAND_VM_WORKER_CRASHED"
    assert info.value.details["why"] == "earlier-crash"
    assert isinstance(info.value.cause, SuaveplanError)
    return info.value.cause


def _worker_cpu_s(pid: int) -> float:
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.NoSuchProcess:
        return math.inf
    return float(times.user + times.system)


def _worker_rss(pid: int) -> int:
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.NoSuchProcess:
        return 1 << 62


# -- real: bytes a worker sends while idle --------------------------------------------------


async def test_a_partial_frame_sent_while_idle_ends_the_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, other: VmSandbox
) -> None:
    # An honest worker sends nothing between its answer and the next call. A hostile one
    # announced a 16 MiB frame after answering and sent most of it: with no call in flight
    # no budget runs, so the host kept the bytes (16 MiB a sandbox, for as long as the
    # sandbox lived) and decoded nothing. Complete frames sent while idle already ended the
    # worker (`log-outside-call`, ...); now any byte of one does.
    sb = await _compromised(tmp_path, monkeypatch)
    async with sb:
        size = 16 * 1024 * 1024 - 64
        tail = size.to_bytes(4, "big") + b"\xc4" * (8 * 1024 * 1024)
        assert await asyncio.wait_for(sb.call("answer_then", _next_id(sb), tail), HANG) == (
            "answered"
        )
        await _until_crashed(sb, lambda: sb._decoder.buffered >= 8 * 1024 * 1024)
        assert sb.state == "crashed", f"the host holds {sb._decoder.buffered} bytes"
        await _assert_killed(sb.pid)
        err = await _fatal(sb)
        assert err.code == "SAND_VM_WORKER_CRASHED"
        assert err.details["why"] == "data-outside-call"
        assert sb._decoder.buffered <= 256 * 1024  # one read at most, then dropped with it
    assert await other.call("f") == 2


async def test_a_reply_and_the_start_of_more_in_one_read_ends_the_worker_after_the_reply(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The call itself is answered (its reply was whole); what followed it is the breach.
    sb = await _compromised(tmp_path, monkeypatch)
    async with sb:
        tail = frame(["log", "info", "x" * 100])[:20]
        assert await asyncio.wait_for(sb.call("answer_then", _next_id(sb), tail), HANG) == (
            "answered"
        )
        await _until_crashed(sb, lambda: False)
        assert sb.state == "crashed"
        err = await _fatal(sb)
        assert err.details["why"] == "data-outside-call"


# -- real: a worker spending CPU or memory between calls ------------------------------------


async def test_threads_spinning_while_the_worker_is_idle_are_held_to_cpu_percent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, other: VmSandbox
) -> None:
    # Threads are allowed at the syscall level. The CPU/RSS sampler ran only while a job
    # was in flight, so a worker that answered at once and spun on every core afterwards was
    # never sampled (and RLIMIT_CPU is a soft limit an escaped worker raises itself): it
    # took both cores from the host and its other sandboxes for as long as it liked.
    metrics = InMemoryMetrics()
    sb = await _compromised(tmp_path, monkeypatch, {"cpuPercent": 30}, metrics=metrics)
    async with sb:
        assert await asyncio.wait_for(sb.call("spin_after", 2), HANG) == "spinning"
        # A few windows' worth of CPU is plenty; 8 s of it, and the host never looked.
        await _until_crashed(sb, lambda: _worker_cpu_s(sb.pid) > 8.0)
        assert sb.state == "crashed", f"worker burned {_worker_cpu_s(sb.pid):.1f} s idle"
        await _assert_killed(sb.pid)
        err = await _fatal(sb)
        assert err.code == "BUDGET_EXCEEDED"
        assert err.details["budget"] == "cpuPercent"
        assert metrics.value(BUDGET_EXCEEDED.name, budget="cpuPercent") == 1
    assert await other.call("f") == 2


async def test_memory_filled_while_the_worker_is_idle_is_held_to_memory_mb(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same for resident memory: RLIMIT_AS (budget + 512 MiB of slack for the
    # interpreter's mappings) was all that bounded an idle worker.
    metrics = InMemoryMetrics()
    sb = await _compromised(tmp_path, monkeypatch, {"memoryMb": 64}, metrics=metrics)
    async with sb:
        assert await asyncio.wait_for(sb.call("grow_after", 200), HANG) == "growing"
        # Resident past the budget: give the host a few of its idle samples, counted as
        # turns of the loop past the point where the worker is over.
        over = 0

        def long_over() -> bool:
            nonlocal over
            if _worker_rss(sb.pid) > 150 * 1024 * 1024:
                over += 1
            return over > 1000  # ten seconds' worth of 10 ms turns

        await _until_crashed(sb, long_over)
        assert sb.state == "crashed", f"worker holds {_worker_rss(sb.pid) >> 20} MiB idle"
        await _assert_killed(sb.pid)
        err = await _fatal(sb)
        assert err.code == "BUDGET_EXCEEDED"
        assert err.details["budget"] == "memoryMb"
        assert metrics.value(BUDGET_EXCEEDED.name, budget="memoryMb") == 1


async def test_an_honest_idle_sandbox_is_sampled_without_breaching(tmp_path: Path) -> None:
    # The idle sampler's other side: a worker that does nothing between calls stays within
    # any budget, however long it idles, and calls still work around the samples.
    (tmp_path / "p.py").write_text("def f(x):\n    return x + 1\n")
    policy = _policy(tmp_path, {"budgets": {"cpuPercent": 5, "memoryMb": 256}})
    metrics = InMemoryMetrics()
    async with await create_vm_sandbox(
        plugin_module_path=tmp_path / "p.py", policy=policy, metrics=metrics
    ) as sb:
        samples = 0
        real = sb._sample

        def counted() -> bool:
            nonlocal samples
            samples += 1
            return real()

        sb._sample = counted  # type: ignore[method-assign]
        for i in range(HANG * 100):
            if samples >= 4:
                break
            if i % 20 == 0:
                assert await sb.call("f", i) == i + 1
            await asyncio.sleep(0.01)
        assert samples >= 4
        assert sb.state == "idle"
        assert sb._sampler is not None  # still armed while idle
    assert metrics.value(BUDGET_EXCEEDED.name) == 0


# -- real: one read's worth of frames holding the shared loop -------------------------------


async def test_a_burst_of_host_calls_is_served_a_slice_per_turn_of_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, other: VmSandbox
) -> None:
    # A host call the gateway answers at once (a denial here; a synchronous adapter alike)
    # costs the loop ~50 us, and one read of 256 KiB held ~7,000 of them: every read of a
    # worker keeping its socket full held the loop every sandbox shares for about half a
    # second (measured on this 2-core machine), with one turn for everything else in
    # between, for as long as the call lasted. Now the host handles a bounded slice of
    # frames per turn and reads no more until the slice before it is handled.
    sb = await _compromised(tmp_path, monkeypatch)
    async with sb:
        turn, most_buffered = 0, 0
        per_turn: dict[int, int] = {}
        real = sb._handle

        def counted(msg: Any) -> None:
            nonlocal most_buffered
            per_turn[turn] = per_turn.get(turn, 0) + 1
            most_buffered = max(most_buffered, sb._decoder.buffered)
            real(msg)

        sb._handle = counted  # type: ignore[method-assign]
        done = False

        async def ticker() -> None:
            nonlocal turn
            while not done:
                turn += 1
                await asyncio.sleep(0)

        tick = asyncio.ensure_future(ticker())
        unit = frame(["hostcall", 1, "fs", "exists", {"path": "/etc/passwd"}])
        try:
            call = sb.call("hostcalls_drained", unit, 40_000)
            assert await asyncio.wait_for(call, HANG) == 40_000
        finally:
            done = True
            await tick
        assert sum(per_turn.values()) == 40_001  # and the result
        assert sb.denials_total == 40_000
        assert max(per_turn.values()) <= 2 * vm_sandbox_module.MAX_FRAMES_PER_TURN
        assert most_buffered <= 1024 * 1024
    assert await other.call("f") == 2


# -- real: the host's writes to a worker that went away -------------------------------------

SIGPIPE_HOST = """
import asyncio, signal, sys
from pathlib import Path

from suaveplan_sandbox.adapters import Adapters
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.testing import InMemoryFs
from suaveplan_sandbox.vm import _sandbox, create_vm_sandbox
from suaveplan_sandbox.vm._guest import load_plugin

# What many programs do (and what an embedded interpreter starts with): a write to a closed
# pipe or socket kills the process unless the write says otherwise.
signal.signal(signal.SIGPIPE, signal.SIG_DFL)
_sandbox.load_plugin = lambda path: load_plugin(path, _without_interpreter_layer=True)
root = Path(sys.argv[1])
frames = [bytes.fromhex(h) for h in sys.argv[2:]]


async def main():
    policy = PermissionPolicy.from_manifest(
        {"name": "raw", "permissions": {"fs": ["./data/*"]}}, root=root
    )
    fs = InMemoryFs({"data/a": b"a"})
    async with await create_vm_sandbox(
        plugin_module_path=root / "raw.py", policy=policy, proxies=Adapters(fs=fs)
    ) as sb:
        try:
            await asyncio.wait_for(sb.call("hostcall_then_close", frames), 30)
        except SuaveplanError as exc:
            print("coded", exc.code, exc.details.get("why"), flush=True)


asyncio.run(main())
print("host alive", flush=True)
"""


def test_a_worker_closing_its_socket_under_a_host_reply_cannot_sigpipe_the_host(
    tmp_path: Path,
) -> None:
    # The worker sends a host call and closes its socket; the host reads the call (the bytes
    # outlive the close), answers it, and its `send` meets a peer that is gone. Without
    # MSG_NOSIGNAL that send raised SIGPIPE, which a host whose SIGPIPE is the default
    # action (set back by many programs, and the state an embedded interpreter starts in)
    # died of: one hostile worker ended every sandbox of the host.
    (tmp_path / "raw.py").write_text(COMPROMISED)
    hostcalls = [frame(["hostcall", 1, "fs", "exists", {"path": "./data/a"}]).hex()]
    done = subprocess.run(
        [sys.executable, "-c", SIGPIPE_HOST, str(tmp_path), *hostcalls],
        capture_output=True,
        text=True,
        timeout=HANG * 2,
        check=False,
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert "coded SAND_VM_WORKER_CRASHED" in done.stdout
    assert "host alive" in done.stdout


# -- real: a host call the VM wire cannot answer --------------------------------------------


async def test_a_forged_fetch_connect_opens_no_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `fetch.connect` is the WASM guests' raw TCP socket; no VM guest API makes it and no
    # socket can cross the VM channel. A worker forging it had the host dial the granted
    # host (a TCP connection per request, at whatever rate it liked), fail to encode the
    # socket, and leave the open connection to the garbage collector.
    fetch = FakeFetch()
    metrics = InMemoryMetrics()
    sb = await _escaped(
        tmp_path,
        monkeypatch,
        COMPROMISED,
        policy=_policy(tmp_path, {"fetch": ["api.example.com"]}),
        proxies=Adapters(fetch=fetch),
        metrics=metrics,
    )
    async with sb:
        connect = ["hostcall", 1, "fetch", "connect", {"host": "api.example.com", "port": 443}]
        codes = await asyncio.wait_for(sb.call("hostcalls", frame(connect), 1), HANG)
        assert codes == ["SAND_PERM_DENIED"]
        for _ in range(20):
            await asyncio.sleep(0)
        assert fetch.connects == []
        assert fetch.peers == []
        assert metrics.value(PERMISSION_DENIED.name, capability="fetch") == 1
        assert sb.denials[-1].reason.value == "malformed-payload"
        assert sb.state == "idle"


# -- probes already blocked: pinned ---------------------------------------------------------


async def test_a_frame_announced_at_the_maximum_holds_only_what_arrived_until_the_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, other: VmSandbox
) -> None:
    # Slow loris inside a call: a 16 MiB length prefix and a few bytes (the worker's own
    # reply then disappears into the announced body). The decoder buffers what arrived,
    # never the announced size, and the wall-clock budget ends the call.
    sb = await _compromised(tmp_path, monkeypatch, {"wallClockMs": 300})
    async with sb:
        prefix = (16 * 1024 * 1024).to_bytes(4, "big") + b"\xc6\x00\xff"
        call = asyncio.ensure_future(sb.call("flood", prefix))
        while not sb._decoder.buffered and not call.done():
            await asyncio.sleep(0.01)
        assert await other.call("f") == 2  # the loop serves others meanwhile
        with pytest.raises(SuaveplanError) as info:
            await asyncio.wait_for(call, HANG)
        assert 0 < sb._decoder.buffered < 1024  # the prefix and the reply it swallowed
        await _assert_killed(sb.pid)
    assert info.value.code == "BUDGET_EXCEEDED"
    assert info.value.details["budget"] == "wallClockMs"
    assert await other.call("f") == 2


async def test_a_log_flood_that_skips_the_guests_limiter_is_held_by_the_hosts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # 5,000 lines of 64 KiB written as one burst during a call (320 MB through the host's
    # decoder): the host logs at most its allowance (a clock that stands still refills
    # none), keeps at most MAX_RECORDED_LOGS lines and MAX_RECORDED_LOG_CHARS characters,
    # and counts every line, logged or suppressed.
    line = frame(["log", "warning", "\x1b[31m" + "y" * (64 * 1024 - 5)])
    caplog.set_level(logging.DEBUG, logger="suaveplan_sandbox.vm")
    sb = await _compromised(tmp_path, monkeypatch, log_lines_per_s=5, clock=FakeClock())
    async with sb:
        before, suppressed = sb.logs_total, sb.logs_suppressed  # the layer-off warning
        for _ in range(10):
            assert await asyncio.wait_for(sb.call("flood", line, 500), HANG) == "flooded"
        assert sb.logs_total == before + 5000
        assert len(sb.logs) <= vm_sandbox_module.MAX_RECORDED_LOGS
        assert sum(len(text) for _, text in sb.logs) <= vm_sandbox_module.MAX_RECORDED_LOG_CHARS
        forwarded = [r for r in caplog.records if "yyyy" in r.getMessage()]
        assert 1 <= len(forwarded) <= 5
        assert len(forwarded) + sb.logs_suppressed - suppressed == 5000
        assert all("\x1b" not in r.getMessage() for r in forwarded)
        assert all(len(r.getMessage()) < 5000 for r in forwarded)
        assert sb.state == "idle"


async def test_answers_a_worker_never_reads_end_it_at_the_outbound_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, other: VmSandbox
) -> None:
    # Host calls answered one after another while the worker never reads: the answers pile
    # up in the host's write buffer until MAX_OUTBOUND_BYTES, and the worker is ended there.
    monkeypatch.setattr(vm_sandbox_module, "MAX_OUTBOUND_BYTES", 8 * 1024 * 1024)
    fs = InMemoryFs({"data/big": b"z" * (1024 * 1024)})
    sb = await _compromised(tmp_path, monkeypatch, fs=fs)
    async with sb:
        call = sb.call("hostcalls_unread", _next_id(sb), "./data/big", 200)
        with pytest.raises(SuaveplanError) as info:
            await asyncio.wait_for(call, HANG)
        assert info.value.code == "SAND_VM_WORKER_CRASHED"
        assert info.value.details["why"] == "backpressure"
        assert len(sb._out) == 0  # dropped with the worker
    assert await other.call("f") == 2


async def test_subscriptions_forged_at_runtime_are_denied_and_never_reach_the_bus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A worker may subscribe only in its ready report (bounded, no duplicates); an
    # `events.subscribe` host call has no handler to deliver to and is denied, however many
    # it sends, so the bus gains nothing and the denial series stay fixed.
    bus = InMemoryEvents()
    metrics = InMemoryMetrics()
    sb = await _escaped(
        tmp_path,
        monkeypatch,
        COMPROMISED,
        policy=PermissionPolicy.from_manifest(
            {"name": "raw", "events": {"subscribes": ["*"]}}, root=tmp_path
        ),
        proxies=Adapters(events=bus),
        metrics=metrics,
    )
    async with sb:
        frames = b"".join(
            frame(["hostcall", i + 1, "events", "subscribe", {"topic": f"t{i}"}])
            for i in range(300)
        )
        codes = await asyncio.wait_for(sb.call("hostcalls", frames, 300), HANG)
        assert codes == ["SAND_PERM_DENIED"] * 300
        assert bus.subscriptions == []
        assert sb.denials_total == 300
        series = {
            tuple(sorted(labels.items()))
            for name, labels, _ in metrics.samples()
            if name in (CAPABILITY_CALLS.name, PERMISSION_DENIED.name)
        }
        assert len(series) == 2
        assert sb.state == "idle"


async def test_operation_names_a_worker_makes_up_never_become_label_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    metrics = InMemoryMetrics()
    sb = await _compromised(tmp_path, monkeypatch, metrics=metrics)
    async with sb:
        frames = b"".join(
            frame(["hostcall", i + 1, "fs", f"op-{i}-{'z' * 200}", {"path": "./data/a"}])
            for i in range(300)
        )
        codes = await asyncio.wait_for(sb.call("hostcalls", frames, 300), HANG)
        assert codes == ["SAND_PERM_DENIED"] * 300
        labels = {value for _, labels, _ in metrics.samples() for value in labels.values()}
        assert not any(value.startswith("op-") for value in labels)
        assert sb.denials_total == 300


@pytest.mark.parametrize(
    "details",
    [
        {"budget": "cpuPercent", "limit": math.nan, "observed": math.nan},
        {"budget": "memoryMb", "limit": math.inf, "observed": -math.inf},
        {"budget": "wallClockMs", "observed": 2**64 - 1},
    ],
    ids=["nan", "inf", "past-64-bits"],
)
async def test_a_forged_budget_breach_counts_in_no_budget_metric(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, details: dict[str, object]
) -> None:
    metrics = InMemoryMetrics()
    sb = await _compromised(tmp_path, monkeypatch, {"cpuPercent": 50}, metrics=metrics)
    async with sb:
        error = {"code": "BUDGET_EXCEEDED", "message": "m", "details": details}
        failure = frame(["failure", _next_id(sb), error])
        with pytest.raises(SuaveplanError) as info:
            await asyncio.wait_for(sb.call("send_and_stall", failure), HANG)
        assert info.value.code == "SAND_VM_PLUGIN_ERROR"
        assert info.value.details["claimed_code"] == "BUDGET_EXCEEDED"
        assert metrics.value(BUDGET_EXCEEDED.name) == 0
        assert sb._tracker.breached == frozenset()


async def test_the_process_layer_holds_against_a_worker_aiming_at_the_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, other: VmSandbox
) -> None:
    sb = await _compromised(tmp_path, monkeypatch, {"memoryMb": 64})
    async with sb:
        if sb.hardening.missing:
            pytest.skip(f"hardening layers missing here: {sb.hardening.missing}")
        rss = _worker_rss(sb.pid)
        out = await asyncio.wait_for(sb.call("process_tricks", os.getpid(), other.pid), HANG)
        assert isinstance(out, dict)
        denied = {name: value for name, value in out.items() if value != "allowed"}
        refused = [
            "kill_host",
            "kill_sibling",
            "kill_fork_server",
            "ptrace_host",
            "ptrace_sibling",
            "pidfd_host",
            "nice_up",
            "nice_host",
            "sched_fifo",
            "sched_attr",
            "prlimit_host",
            "affinity_host",
            "raise_as_hard",
            "open_host_environ",
            "open_host_fd",
            "open_own_socket",
            "open_host_mem",
            "process_vm_readv",
            "readlink_host_cwd",
            "readlink_host_exe",
            "readlink_host_fd",
            "readlink_sibling_cwd",
            "half_close",  # `shutdown` is not on the allow list: a worker can only close
        ]
        assert set(refused) <= set(denied), out
        assert out["mmap_past_rlimit"] == "ENOMEM"  # RLIMIT_AS, whose hard limit is fixed
        # Known and documented: threads, and untouched mappings (RSS, not address space, is
        # what memoryMb counts; RLIMIT_AS bounds the rest).
        assert out["thread"] == "allowed"
        assert out["mmap_untouched"] == "allowed"
        assert _worker_rss(sb.pid) - rss < 64 * 1024 * 1024
        # Its socket and the lifeline's read end: nothing inherited from the fork server.
        fds = out["fds"]
        assert isinstance(fds, list)
        assert len(fds) <= 3, fds
        assert sb.state == "idle"
    assert await other.call("f") == 2


@pytest.fixture
async def two(tmp_path: Path) -> AsyncIterator[tuple[VmSandbox, VmSandbox]]:
    root = tmp_path / "two"
    root.mkdir()
    (root / "o.py").write_text("def f():\n    return 2\n")
    policy = PermissionPolicy.from_manifest({"name": "two"}, root=root)
    a = await create_vm_sandbox(plugin_module_path=root / "o.py", policy=policy)
    b = await create_vm_sandbox(plugin_module_path=root / "o.py", policy=policy)
    async with a, b:
        yield a, b


async def test_call_ids_are_per_channel_so_no_worker_can_answer_anothers_call(
    two: tuple[VmSandbox, VmSandbox],
) -> None:
    # Each sandbox numbers its own calls, so ids repeat across sandboxes; a worker holds
    # only its own channel, and a reply is matched on that channel alone.
    a, b = two
    assert await a.call("f") == 2
    assert await b.call("f") == 2
    assert a._next_id == b._next_id
    forged = msgpack.packb(["result", a._next_id + 1, 99])
    b._on_readable_data(len(forged).to_bytes(4, "big") + forged)
    assert b.state == "crashed"
    assert a.state == "idle"
    assert await a.call("f") == 2


def test_the_hostile_source_is_valid_python() -> None:
    compile(textwrap.dedent(COMPROMISED), "compromised.py", "exec")
