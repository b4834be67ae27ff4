"""VM host benchmarks: create, no-op call, proxied fs read, pool throughput (ratios only).

Baselines, each measured in the same run, interleaved with the figure it judges (the machine
is shared and noisy, so every figure is the median of several alternating rounds):

- **create** against a *bare fork* through the same fork server: the zygote forks a child
  that writes one byte and waits for EOF (`ForkServer.fork_bare`), so both sides pay the same
  control round trip and fork of the same process; the difference is loading, hardening and
  starting the plugin. Also against spawning a fresh `python -I -S` to the same import point.
- **call** against a *cross-process* request/reply of the same framing (4-byte length +
  msgpack array) with an echo process, driven from the same asyncio loop the sandbox uses
  (`add_reader` + one future per request). A same-process round trip (both socket ends in
  one thread, ~9 µs here) is not a baseline for a cross-process call: it has no wake-up of
  another process and no context switch, which are most of the cost on this machine. We also
  report the blocking variant (no event loop at all), the floor for any Python peer, and the
  same asyncio echo with both ends using our sans-IO codec (validated message objects), which
  isolates what the sandbox adds on top of the protocol. That peer reads into a reused buffer
  as the worker does: a fresh `recv(256 KiB)` in a new process costs an mmap/mremap/munmap
  per read, which is the allocator's bill, not the protocol's.
- **CPU per call**, host and peer, for the no-op call and the read against the asyncio echo:
  wall time here is close to the sum of both processes' CPU (they take turns; the kernel's
  wake-ups are part of each one's CPU), so these say which side a ratio comes from. The
  host's is this process's CPU time, the peer's `sum_exec_runtime` from `/proc/<pid>/schedstat`.
- **proxied read** of a 1 KiB file through the default adapter (`BeneathRootFs`, which
  answers a read the kernel's caches can serve without a thread) against the asyncio echo,
  and against two no-op calls: a read is two round trips (the call and the worker's host
  call), so the second ratio is what the gateway and adapter add. Also through the in-memory
  fake (what the IPC and gateway cost with no filesystem at all) and through the adapter's
  thread (`inline_io=False`, what every read cost before), and through an adapter whose
  inline read is its Python reference rather than the C accelerator's twin (what the C
  saves, same run). Both adapters are coroutines that
  do not suspend here: from Python 3.12 their task starts eagerly and the host call is
  answered inline; on 3.11 the task's first step and its done callback each cost a trip
  round the loop.
- **the floor of a read**: its two round trips between two processes that only exchange the
  frames (no validation, no gateway, no adapter), once blocking and once with both ends
  polling for answers as the sandbox and its worker do by default. Against one blocking echo
  they show what the round trips alone cost: about two echoes when blocking, well under one
  when polling, since polling saves the wake-ups that are most of a blocking round trip.
- **busy polling**: the default sandbox polls for answers (`busy_poll_us`); no echo peer
  does, except the polling raw read above. So every call row is also given for a sandbox
  with `busy_poll_us=0`, the like-for-like comparison of the code paths, and the read
  against the blocking echo too; the default rows are what a host gets.
- **pool** of 4 sandboxes against the absolute 15,000 calls/s target, with and without
  polling, and once more with the host's loop on uvloop (what uvicorn runs when uvloop is
  installed).
"""

from __future__ import annotations

import asyncio
import functools
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final

import msgpack
import uvloop

from benchmarks._harness import BenchRow, measure, ratio_row
from suaveplan_sandbox.adapters import Adapters, BeneathRootFs
from suaveplan_sandbox.permissions import PermissionPolicy, _accel
from suaveplan_sandbox.protocol import NEED_DATA, Call, FrameDecoder, encode
from suaveplan_sandbox.testing import InMemoryFs
from suaveplan_sandbox.vm import create_vm_sandbox
from suaveplan_sandbox.vm._worker_loop import DEFAULT_BUSY_POLL_US
from suaveplan_sandbox.vm._zygote import fork_server

_SRC = (
    "import suaveplan\n\ndef noop():\n    return None\n\n"
    "def read():\n    return suaveplan.fs.read_bytes('./data/a.bin')\n"
)

# A fresh interpreter to the same ready point: our worker code imported.
_FRESH = (
    "import sys, json; sys.path[:0] = json.loads(sys.argv[1]); "
    "import suaveplan_sandbox.vm._worker_loop"
)

# The echo peer: same framing as the worker channel, raw msgpack, nothing else. A call named
# "read" is answered as a worker answers a proxied read: a host call first, then the result
# carrying the host's reply (two round trips, no validation, no gateway, no adapter).
_ECHO = """
import json, socket, sys
sys.path[:0] = json.loads(sys.argv[2])
import msgpack
s = socket.socket(fileno=int(sys.argv[1]))
buf = b""
while True:
    data = s.recv(262144)
    if not data:
        break
    buf += data
    while len(buf) >= 4 and len(buf) >= 4 + int.from_bytes(buf[:4], "big"):
        end = 4 + int.from_bytes(buf[:4], "big")
        req = msgpack.unpackb(buf[4:end], raw=False)
        buf = buf[end:]
        value = None
        if req[2] == "read":
            hc = msgpack.packb(["hostcall", 1, "fs", "read_bytes", {"path": "a"}])
            s.sendall(len(hc).to_bytes(4, "big") + hc)
            while len(buf) < 4 or len(buf) < 4 + int.from_bytes(buf[:4], "big"):
                buf += s.recv(262144)
            end = 4 + int.from_bytes(buf[:4], "big")
            value = msgpack.unpackb(buf[4:end], raw=False)[2]
            buf = buf[end:]
        rep = msgpack.packb(["result", req[1], value], use_bin_type=True)
        s.sendall(len(rep).to_bytes(4, "big") + rep)
"""

# The same peer waiting as a worker does: it polls the socket without blocking (yielding the
# CPU between polls) for up to `busy_poll_us` before it blocks. Driven by `polling_read`, which
# waits the same way, it is the floor of a read's two round trips when both ends poll.
_POLLING_ECHO = _ECHO.replace(
    "import msgpack",
    """import msgpack, os, time
_sock_recv = socket.socket.recv
def _recv(s, n, window=float(sys.argv[3])):
    end = time.perf_counter() + window
    while time.perf_counter() < end:
        try:
            return _sock_recv(s, n, socket.MSG_DONTWAIT)
        except BlockingIOError:
            os.sched_yield()
    return _sock_recv(s, n)
socket.socket.recv = _recv""",
)

# The same peer hardened as a worker is (seccomp allow list, Landlock, rlimits, fds closed,
# environment cleared) once its imports are done: what the hardening adds to a round trip.
# With a seccomp action cache (Linux 5.11+), a syscall the filter always allows costs no
# BPF run at all; this row checks that rather than assuming it.
_HARDENED_ECHO = _ECHO.replace(
    "import msgpack",
    """import msgpack
from suaveplan_sandbox.vm._hardening import RlimitSettings, apply_hardening, prepare_hardening
_plan = prepare_hardening(RlimitSettings(address_space_bytes=None, cpu_seconds=None))
_report = apply_hardening(_plan, keep_fds=(int(sys.argv[1]),), require=("seccomp",))""",
)

# The same echo through our sans-IO codec on both ends (validated message objects): what the
# protocol itself costs, without any sandbox machinery.
_CODEC_ECHO = """
import json, socket, sys
sys.path[:0] = json.loads(sys.argv[2])
from suaveplan_sandbox.protocol import NEED_DATA, FrameDecoder, Result, encode
s = socket.socket(fileno=int(sys.argv[1]))
decoder = FrameDecoder()
buf = bytearray(262144)
view = memoryview(buf)
while True:
    msg = decoder.next_message()
    if msg is NEED_DATA:
        n = s.recv_into(buf)
        if not n:
            break
        decoder.receive_data(view[:n])
        continue
    s.sendall(encode(Result(id=msg.id, value=None)))
"""

ROUNDS: Final = 5
POOL_CALLS: Final = 4000  # per measured round of a pool of 4 (sandboxes or echo peers)


def _frame(name: str = "noop") -> bytes:
    req = msgpack.packb(["call", 1, name, [], {}], use_bin_type=True)
    return bytes(len(req).to_bytes(4, "big") + req)


def _recv_frame(sock: socket.socket) -> object:
    """One whole frame's message, blocking."""
    data = sock.recv(65536)
    while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:4], "big"):
        data += sock.recv(65536)
    return msgpack.unpackb(data[4:], raw=False)


class _Echo:
    """A second process answering framed msgpack requests over a socketpair."""

    def __init__(self, source: str = _ECHO) -> None:
        self.sock, theirs = socket.socketpair()
        fd, path = str(theirs.fileno()), json.dumps(sys.path)
        window = str(DEFAULT_BUSY_POLL_US / 1e6)  # read by `_POLLING_ECHO` only
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", source, fd, path, window],
            pass_fds=(theirs.fileno(),),
        )
        theirs.close()
        self.frame = _frame()

    def blocking(self, n: int) -> float:
        sock, frame = self.sock, self.frame
        t = time.perf_counter()
        for _ in range(n):
            sock.sendall(frame)
            msgpack.unpackb(sock.recv(65536)[4:], raw=False)
        return (time.perf_counter() - t) / n

    def blocking_read(self, n: int) -> float:
        """A proxied read's two round trips with no sandbox at all: the call, the peer's host
        call, a 1 KiB reply from here, the result carrying it. Blocking, like `blocking`."""
        sock, frame = self.sock, _frame("read")
        reply = msgpack.packb(["hostreply", 1, b"x" * 1024], use_bin_type=True)
        reply = len(reply).to_bytes(4, "big") + reply
        t = time.perf_counter()
        for _ in range(n):
            sock.sendall(frame)
            _recv_frame(sock)  # the host call
            sock.sendall(reply)
            _recv_frame(sock)  # the result
        return (time.perf_counter() - t) / n

    def polling_read(self, n: int) -> float:
        """`blocking_read` with both ends polling as a sandbox and its worker do (the peer is
        `_POLLING_ECHO`); waits here poll without a yield, as the host's loop does."""
        sock, frame = self.sock, _frame("read")
        reply = msgpack.packb(["hostreply", 1, b"x" * 1024], use_bin_type=True)
        reply = len(reply).to_bytes(4, "big") + reply

        def recv_frame() -> None:
            data = b""
            while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:4], "big"):
                try:
                    data += sock.recv(65536, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    continue
            msgpack.unpackb(data[4:], raw=False)

        t = time.perf_counter()
        for _ in range(n):
            sock.sendall(frame)
            recv_frame()  # the host call
            sock.sendall(reply)
            recv_frame()  # the result
        return (time.perf_counter() - t) / n

    async def asyncio_driven(self, n: int) -> float:
        loop = asyncio.get_running_loop()
        sock, frame = self.sock, self.frame
        sock.setblocking(False)
        waiter: list[asyncio.Future[object]] = []

        def readable() -> None:
            data = sock.recv(65536)
            waiter.pop().set_result(msgpack.unpackb(data[4:], raw=False))

        loop.add_reader(sock.fileno(), readable)
        try:
            t = time.perf_counter()
            for _ in range(n):
                fut = loop.create_future()
                waiter.append(fut)
                sock.send(frame)
                await fut
            return (time.perf_counter() - t) / n
        finally:
            loop.remove_reader(sock.fileno())
            sock.setblocking(True)

    async def codec_driven(self, n: int) -> float:
        """The host half through our codec too: `encode(Call)` out, `FrameDecoder` in."""
        loop = asyncio.get_running_loop()
        sock, decoder = self.sock, FrameDecoder()
        sock.setblocking(False)
        waiter: list[asyncio.Future[object]] = []

        def readable() -> None:
            decoder.receive_data(sock.recv(65536))
            while (msg := decoder.next_message()) is not NEED_DATA:
                waiter.pop().set_result(msg)

        loop.add_reader(sock.fileno(), readable)
        try:
            t = time.perf_counter()
            for i in range(n):
                fut = loop.create_future()
                waiter.append(fut)
                sock.send(encode(Call(id=i, name="noop", args=[], kwargs={})))
                await fut
            return (time.perf_counter() - t) / n
        finally:
            loop.remove_reader(sock.fileno())
            sock.setblocking(True)

    def close(self) -> None:
        self.sock.close()
        self.proc.wait()


async def _per_call(fn: Callable[[], Awaitable[object]], n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        await fn()
    return (time.perf_counter() - t) / n


def _cpu_of(pid: int) -> float:
    """Seconds of CPU the process `pid` has run (the scheduler's nanosecond count)."""
    with open(f"/proc/{pid}/schedstat", encoding="ascii") as f:  # noqa: PTH123
        return int(f.read().split()[0]) / 1e9


class _Cpu:
    """CPU per call of this process (the host) and of a peer, one sample per measured round;
    the median of the rounds, like every other figure here (one disturbed round is noise)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.host: list[float] = []
        self.peer: list[float] = []

    async def run(self, batch: Awaitable[float], n: int) -> float:
        host, peer = time.process_time(), _cpu_of(self.pid)
        wall = await batch
        self.host.append((time.process_time() - host) / n)
        self.peer.append((_cpu_of(self.pid) - peer) / n)
        return wall

    def per_call(self) -> tuple[float, float]:
        return statistics.median(self.host), statistics.median(self.peer)


def _bare_fork() -> None:
    ours, theirs = socket.socketpair()
    try:
        fork_server().fork_bare(theirs)
        theirs.close()
        if ours.recv(1) != b"r":
            raise RuntimeError("bare fork did not report ready")
    finally:
        ours.close()
        theirs.close()


def run() -> list[BenchRow]:
    root = Path(tempfile.mkdtemp(prefix="bench-vm-"))
    (root / "p.py").write_text(_SRC)
    (root / "data").mkdir()
    (root / "data" / "a.bin").write_bytes(b"x" * 1024)
    policy = PermissionPolicy.from_manifest(
        {"name": "bench", "version": "1.0.0", "permissions": {"fs": ["./data/*"]}}, root=root
    )
    fs = InMemoryFs({"data/a.bin": b"x" * 1024})
    rows: list[BenchRow] = []

    async def pool(poll_us: int, *, in_sequence: bool = False) -> float:
        """Seconds per call across 4 sandboxes: `POOL_CALLS` calls made at once (a task
        each), or with `in_sequence` one task per sandbox making its share one after another,
        the shape of `echo_pool`."""
        boxes = [
            await create_vm_sandbox(
                plugin_module_path=str(root / "p.py"), policy=policy, busy_poll_us=poll_us
            )
            for _ in range(4)
        ]

        try:
            total = POOL_CALLS
            await asyncio.gather(*(boxes[i % 4].call("noop") for i in range(400)))
            samples = []
            for _ in range(3):
                t = time.perf_counter()
                if in_sequence:
                    await asyncio.gather(
                        *(
                            _per_call(functools.partial(box.call, "noop"), total // 4)
                            for box in boxes
                        )
                    )
                else:
                    await asyncio.gather(*(boxes[i % 4].call("noop") for i in range(total)))
                samples.append((time.perf_counter() - t) / total)
        finally:
            for b in boxes:
                await b.dispose()
        return statistics.median(samples)

    async def echo_pool() -> float:
        """`pool(in_sequence=True)` with raw echo peers for sandboxes: the most a single
        asyncio loop does here with four peers and nothing else to do per message."""
        peers = [_Echo() for _ in range(4)]
        try:
            await asyncio.gather(*(peer.asyncio_driven(100) for peer in peers))
            samples = []
            for _ in range(3):
                t = time.perf_counter()
                await asyncio.gather(*(peer.asyncio_driven(POOL_CALLS // 4) for peer in peers))
                samples.append((time.perf_counter() - t) / POOL_CALLS)
        finally:
            for peer in peers:
                peer.close()
        return statistics.median(samples)

    async def main() -> None:
        async def create() -> None:
            sb = await create_vm_sandbox(
                plugin_module_path=str(root / "p.py"), policy=policy, proxies=Adapters(fs=fs)
            )
            await sb.dispose()

        await create()  # start the zygote, compile the plugin there once
        _bare_fork()
        creates, bares = [], []
        for _ in range(ROUNDS):
            creates.append(await _per_call(create, 10))
            t = time.perf_counter()
            for _ in range(10):
                _bare_fork()
            bares.append((time.perf_counter() - t) / 10)
        create_s, bare_s = statistics.median(creates), statistics.median(bares)
        rows.append(ratio_row("vm.create", create_s, "bare fork, same zygote", bare_s, at_most=3))
        fresh = measure(
            lambda: subprocess.run(
                [sys.executable, "-I", "-S", "-c", _FRESH, json.dumps(sys.path)], check=False
            ),
            number=3,
        )
        rows.append(
            ratio_row("vm.create", create_s, "fresh python -I -S", fresh, at_least_faster=4)
        )

        # The default sandbox polls for answers (busy_poll_us) and reads through the default
        # fs adapter; the second does not poll, so its rows show what polling buys and its
        # CPU rows what the sandbox's code costs. The last two read through the in-memory
        # fake and through the default adapter's thread.
        threaded = BeneathRootFs(root, inline_io=False)
        with _accel.pure_python():  # the inline read's Python reference, not its C twin
            python_read = BeneathRootFs(root)
        sb, sb0, sbm, sbt, sbp = [
            await create_vm_sandbox(
                plugin_module_path=str(root / "p.py"),
                policy=policy,
                proxies=proxies,
                busy_poll_us=poll_us,
            )
            for poll_us, proxies in (
                (DEFAULT_BUSY_POLL_US, None),
                (0, None),
                (DEFAULT_BUSY_POLL_US, Adapters(fs=fs)),
                (DEFAULT_BUSY_POLL_US, Adapters(fs=threaded)),
                (DEFAULT_BUSY_POLL_US, Adapters(fs=python_read)),
            )
        ]
        echo, codec_echo, polling_echo = _Echo(), _Echo(_CODEC_ECHO), _Echo(_POLLING_ECHO)
        hardened_echo = _Echo(_HARDENED_ECHO)
        try:
            await _per_call(lambda: sb.call("noop"), 200)
            await _per_call(lambda: sb0.call("noop"), 200)
            await echo.asyncio_driven(200)
            await codec_echo.codec_driven(200)
            calls, reads, calls0, reads0, reads_mem, reads_thread = [], [], [], [], [], []
            reads_python: list[float] = []
            xp_async, xp_block, xp_codec, xp_read, xp_polled = [], [], [], [], []
            xp_hardened: list[float] = []
            echo_cpu, call_cpu, read_cpu = _Cpu(echo.proc.pid), _Cpu(sb.pid), _Cpu(sb.pid)
            call0_cpu, read0_cpu = _Cpu(sb0.pid), _Cpu(sb0.pid)
            for _ in range(ROUNDS):
                xp_async.append(await echo_cpu.run(echo.asyncio_driven(1000), 1000))
                calls.append(await call_cpu.run(_per_call(lambda: sb.call("noop"), 1000), 1000))
                calls0.append(await call0_cpu.run(_per_call(lambda: sb0.call("noop"), 1000), 1000))
                xp_codec.append(await codec_echo.codec_driven(1000))
                # The blocking echo and the raw read alternate in small batches: on this VM
                # a blocking round trip's cost drifts with how idle the other vCPU is, and
                # one long batch of each measured the floor anywhere from 2x to 4x.
                block_t = raw_t = polled_t = hardened_t = 0.0
                for _ in range(10):
                    block_t += echo.blocking(100)
                    hardened_t += hardened_echo.blocking(100)
                    raw_t += echo.blocking_read(50)
                    polling_echo.polling_read(5)  # its peer has stopped polling meanwhile
                    polled_t += polling_echo.polling_read(50)
                xp_block.append(block_t / 10)
                xp_read.append(raw_t / 10)
                xp_polled.append(polled_t / 10)
                xp_hardened.append(hardened_t / 10)
                reads.append(await read_cpu.run(_per_call(lambda: sb.call("read"), 300), 300))
                reads0.append(await read0_cpu.run(_per_call(lambda: sb0.call("read"), 300), 300))
                reads_mem.append(await _per_call(lambda: sbm.call("read"), 300))
                reads_thread.append(await _per_call(lambda: sbt.call("read"), 300))
                reads_python.append(await _per_call(lambda: sbp.call("read"), 300))
                fs.calls.clear()  # the fake adapter records every call
        finally:
            echo.close()
            codec_echo.close()
            polling_echo.close()
            hardened_echo.close()
            for box in (sb, sb0, sbm, sbt, sbp):
                await box.dispose()
            threaded.close()
            python_read.close()
        call_s, read_s = statistics.median(calls), statistics.median(reads)
        call0_s, read0_s = statistics.median(calls0), statistics.median(reads0)
        base_async, base_block = statistics.median(xp_async), statistics.median(xp_block)
        cross = "cross-process msgpack echo (asyncio)"
        rows.append(ratio_row("vm.call noop", call_s, cross, base_async, at_most=1.5))
        # The hardening's share of a round trip: the same blocking echo with its peer hardened.
        rows.append(
            ratio_row(
                "cross-process msgpack echo (blocking), peer hardened",
                statistics.median(xp_hardened),
                "cross-process msgpack echo (blocking)",
                base_block,
                info=True,
            )
        )
        rows.append(
            ratio_row("vm.call noop, busy_poll_us=0", call0_s, cross, base_async, info=True)
        )
        rows.append(
            ratio_row(
                "vm.call noop",
                call_s,
                "cross-process msgpack echo (blocking)",
                base_block,
                at_most=1.5,
            )
        )
        rows.append(
            ratio_row(
                "vm.call noop",
                call_s,
                "cross-process echo, our codec (asyncio)",
                statistics.median(xp_codec),
                at_most=1.5,
            )
        )
        rows.append(ratio_row("vm.call fs.read_bytes 1KiB", read_s, cross, base_async, at_most=2))
        rows.append(
            ratio_row(
                "vm.call fs.read_bytes 1KiB, busy_poll_us=0", read0_s, cross, base_async, info=True
            )
        )
        # The inline read's system calls in C (`_speedups.read_cached`, when built) against
        # its Python reference, through the same sandbox machinery.
        rows.append(
            ratio_row(
                "vm.call fs.read_bytes 1KiB",
                read_s,
                "the same, inline read in Python",
                statistics.median(reads_python),
                info=True,
            )
        )
        for label, samples in (
            ("in-memory fake", reads_mem),
            ("adapter's thread (inline_io=False)", reads_thread),
        ):
            rows.append(
                ratio_row(
                    f"vm.call fs.read_bytes 1KiB, {label}",
                    statistics.median(samples),
                    cross,
                    base_async,
                    info=True,
                )
            )
        rows.append(
            ratio_row(
                "vm.call fs.read_bytes 1KiB",
                read_s,
                "cross-process msgpack echo (blocking)",
                base_block,
                info=True,
            )
        )
        # The floor for any proxied read: its two round trips between two processes that do
        # nothing else. Blocking, against one blocking echo, it shows how much of a "2x the
        # echo" budget the round trips alone take. With both ends polling for answers, as the
        # sandbox and its worker do by default, the round trips cost no wake-ups, and what a
        # read costs beyond that is the Python each side runs per message.
        for how, samples in (("blocking", xp_read), ("both ends polling", xp_polled)):
            floor_name, floor = (
                f"raw read: 2 round trips, {how}, no sandbox",
                statistics.median(samples),
            )
            rows.append(
                ratio_row(
                    floor_name,
                    floor,
                    "cross-process msgpack echo (blocking)",
                    base_block,
                    info=True,
                )
            )
            rows.append(
                ratio_row("vm.call fs.read_bytes 1KiB", read_s, floor_name, floor, info=True)
            )
        # A proxied read is two round trips (call/result and hostcall/hostreply): against two
        # no-op calls it shows what serving the host call adds (the gateway, the adapter),
        # independent of the round-trip cost the baseline above includes twice.
        rows.append(
            ratio_row(
                "vm.call fs.read_bytes 1KiB",
                read_s,
                "two vm.call noop round trips",
                2 * call_s,
                at_most=1.25,
            )
        )

        # CPU per call. Without polling it is the sandbox's own cost (the targets); with it,
        # each side also spends the time it polls, up to the whole round trip.
        echo_host, echo_peer = echo_cpu.per_call()
        for label, cpu, at_most in (
            ("noop, busy_poll_us=0", call0_cpu, 1.5),
            ("read, busy_poll_us=0", read0_cpu, 2.0),
            ("noop", call_cpu, None),
            ("read", read_cpu, None),
        ):
            host, worker = cpu.per_call()
            for side, value, base, base_name in (
                ("host", host, echo_host, "echo: host CPU"),
                ("worker", worker, echo_peer, "echo: peer CPU"),
            ):
                rows.append(
                    ratio_row(
                        f"vm.call {label}: {side} CPU",
                        value,
                        base_name,
                        base,
                        at_most=at_most,
                        info=at_most is None,
                    )
                )

        for poll_us in (DEFAULT_BUSY_POLL_US, 0):
            rows.append(
                ratio_row(
                    "vm.pool throughput (s/call, 4 sandboxes)"
                    + ("" if poll_us else ", busy_poll_us=0"),
                    await pool(poll_us),
                    "15,000 calls/s",
                    1 / 15000,
                    at_most=1,
                    info=not poll_us,
                )
            )
        # The absolute rate moves with the machine; the ratio to the same loop driving raw
        # echo peers (the loop's own cost per message, with peers that do nothing else) moves
        # far less. On a slow machine that baseline itself is near 15,000 calls/s.
        echo_pool_s = await echo_pool()
        rows.append(
            ratio_row(
                "raw echo pool (s/call, 4 peers)",
                echo_pool_s,
                "15,000 calls/s",
                1 / 15000,
                info=True,
            )
        )
        rows.append(
            ratio_row(
                "vm.pool throughput (s/call, 4 sandboxes, a task each)",
                await pool(DEFAULT_BUSY_POLL_US, in_sequence=True),
                "raw echo pool (s/call, 4 peers)",
                echo_pool_s,
                info=True,
            )
        )

    asyncio.run(main())
    # The same pool with the host's loop on uvloop, which uvicorn runs when it is installed.
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        on_uvloop = runner.run(pool(DEFAULT_BUSY_POLL_US))
    rows.append(
        ratio_row(
            "vm.pool throughput (s/call, 4 sandboxes), host on uvloop",
            on_uvloop,
            "15,000 calls/s",
            1 / 15000,
            info=True,
        )
    )
    return rows


if __name__ == "__main__":
    for row in run():
        print(
            f"{row.name:42} {row.value_s * 1e6:9.1f} us {row.ratio:6.2f}x"
            f" vs {row.baseline_name:38} {row.baseline_s * 1e6:9.1f} us {row.target} ok={row.ok}"
        )
