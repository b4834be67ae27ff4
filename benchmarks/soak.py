"""`make soak`: minutes of mixed calls over many sandboxes; resource use must end flat.

`python -m benchmarks.soak --seconds N --sandboxes K [--json]` drives K sandboxes (half VM
workers, half WASM instances) concurrently for N seconds, each with back-to-back calls drawn
from a seeded mix: pure calls, allowed capability calls (a file write read back and checked,
a declared secret), denied ones (a path outside the allowlist, an undeclared secret) and,
rarely, a budget breach (a loop past `wallClockMs`, an allocation past `memoryMb`). A sandbox
whose budget broke is disposed and replaced, as a host would.

Growth is measured from a warm-up baseline: the drivers run for a warm-up period, stop with
all K sandboxes idle, and the host's fds, live child processes (fork server and workers),
threads and RSS are sampled; after the measured period they stop the same way and are
sampled again. "Flat" means every growth is within `TOLERANCES` (stated below, and printed);
the command exits 1 when it is not. An outcome outside the mix (a wrong answer, an
unexpected error code) aborts the run with exit status 2: a soak never hides a failure.

`--json` prints exactly one JSON object (consumed by `scripts/security_report.py`):
`{"seconds", "sandboxes", "calls", "denied", "budget_breaches", "throughput_per_s", "p50_ms",
"p99_ms", "growth": {"fds", "processes", "threads", "rss_mb"}, "flat"}`. Latency is the wall
time of one call as its caller sees it; the machine is shared, so read it as a ratio between
runs, never as an absolute target.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import gc
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from array import array
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import psutil
import wasmtime

from suaveplan_sandbox.adapters import Adapters, BeneathRootFs, StaticSecrets
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.vm import VmSandbox, create_vm_sandbox
from suaveplan_sandbox.wasm import Errno, WasmSandbox, create_wasm_sandbox

PLUGIN: Final = """\
import suaveplan


def echo(x):
    return x


def spin(n):
    total = 0
    for i in range(n):
        total += i
    return total


def forever():
    while True:
        pass


def hog(mb):
    blocks = []
    for _ in range(mb):
        blocks.append(b"x" * (1024 * 1024))
    return len(blocks)


def roundtrip(path, data):
    suaveplan.fs.write_bytes(path, data)
    return suaveplan.fs.read_bytes(path)


def read(path):
    return suaveplan.fs.read_bytes(path)


def secret(name):
    return suaveplan.secrets.get(name)
"""

GUEST_WAT: Final = """
(module
  (import "suaveplan" "secrets_get" (func $sg (param i32 i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "API_KEY")
  (data (i32.const 16) "OTHER_KEY")
  (func (export "add") (param i32 i32) (result i32)
    (i32.add (local.get 0) (local.get 1)))
  (func (export "sum") (param $n i32) (result i32)
    (local $acc i32)
    (block $done
      (loop $next
        (br_if $done (i32.eqz (local.get $n)))
        (local.set $acc (i32.add (local.get $acc) (local.get $n)))
        (local.set $n (i32.sub (local.get $n) (i32.const 1)))
        (br $next)))
    (local.get $acc))
  (func (export "secret") (result i32)
    (call $sg (i32.const 0) (i32.const 7) (i32.const 256) (i32.const 64) (i32.const 512)))
  (func (export "secret_denied") (result i32)
    (call $sg (i32.const 16) (i32.const 9) (i32.const 256) (i32.const 64) (i32.const 512)))
  (func (export "forever") (loop $l (br $l)))
  (func (export "grow") (result i32)
    (loop $again
      (br_if $again (i32.ne (memory.grow (i32.const 1)) (i32.const -1))))
    unreachable))
"""

WALL_CLOCK_MS: Final = 500
VM_MEMORY_MB: Final = 96
WASM_MEMORY_MB: Final = 8
BREACH_RATE: Final = 0.003  # per call; each breach costs a budget's worth of time
DENY_RATE: Final = 0.2


@dataclass(frozen=True, slots=True)
class Growth:
    """Resource growth from the warm-up baseline (or, for `TOLERANCES`, the allowed growth)."""

    fds: int
    processes: int
    threads: int
    rss_mb: float

    def within(self, limit: Growth) -> bool:
        return (
            self.fds <= limit.fds
            and self.processes <= limit.processes
            and self.threads <= limit.threads
            and self.rss_mb <= limit.rss_mb
        )


# Sampled with every sandbox idle at both ends, so a healthy host returns to the same fd
# and process counts exactly. The loop's default executor (the fs adapter's `to_thread`) is
# started at full size before the baseline, so its threads are no growth; the slack of 2
# covers a replaced WASM sandbox's worker thread still unwinding when the sample is taken.
# RSS grows a little as allocator arenas and wasmtime's caches settle; a per-call leak of
# even 1 KiB exceeds this within a minute of calls.
TOLERANCES: Final = Growth(fds=0, processes=0, threads=2, rss_mb=48.0)
EXECUTOR_THREADS: Final = 8


async def _start_default_executor() -> None:
    """Give the loop a default executor and start every one of its threads now.

    `ThreadPoolExecutor` starts workers lazily, up to its size: left alone, the first busy
    minute adds threads that look like growth but are the pool filling up.
    """
    loop = asyncio.get_running_loop()
    pool = concurrent.futures.ThreadPoolExecutor(EXECUTOR_THREADS, thread_name_prefix="asyncio")
    loop.set_default_executor(pool)
    barrier = threading.Barrier(EXECUTOR_THREADS)  # each waiter holds a thread of its own
    await asyncio.gather(
        *(loop.run_in_executor(None, barrier.wait) for _ in range(EXECUTOR_THREADS))
    )


@dataclass(frozen=True, slots=True)
class Sample:
    fds: int
    processes: int
    threads: int
    rss_bytes: int

    def growth_since(self, base: Sample) -> Growth:
        return Growth(
            fds=self.fds - base.fds,
            processes=self.processes - base.processes,
            threads=self.threads - base.threads,
            rss_mb=round((self.rss_bytes - base.rss_bytes) / (1024 * 1024), 2),
        )


def sample() -> Sample:
    """This process's open fds, live (non-zombie) descendants, threads and RSS."""
    gc.collect()  # garbage in reference cycles is late, not leaked
    me = psutil.Process()
    live = 0
    for child in me.children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                live += 1
        except psutil.NoSuchProcess:
            continue
    return Sample(
        fds=len(os.listdir("/proc/self/fd")),  # noqa: PTH208 - a count, not paths
        processes=live,
        threads=threading.active_count(),
        rss_bytes=me.memory_info().rss,
    )


class SoakFailure(Exception):
    """An outcome outside the mix: a wrong answer or an unexpected error."""


@dataclass
class Tally:
    calls: int = 0
    denied: int = 0
    breaches: int = 0
    # 8 bytes a call: the harness's own bookkeeping must not pass for host growth.
    latencies: array[float] = field(default_factory=lambda: array("d"))
    recording: bool = False

    def record(self, seconds: float, *, denied: bool = False, breach: bool = False) -> None:
        if not self.recording:
            return
        self.calls += 1
        self.denied += denied
        self.breaches += breach
        self.latencies.append(seconds)


@dataclass(frozen=True, slots=True)
class SoakResult:
    seconds: float
    sandboxes: int
    calls: int
    denied: int
    budget_breaches: int
    throughput_per_s: float
    p50_ms: float
    p99_ms: float
    growth: Growth
    flat: bool

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["growth"] = asdict(self.growth)
        return out


class _LeakySecrets:
    """Test-only: a secrets adapter that leaks one fd per call (proves `flat` can fail)."""

    def __init__(self, inner: StaticSecrets) -> None:
        self._inner = inner
        self.leaked: list[int] = []

    async def get(self, name: str) -> str:
        self.leaked.append(os.open(os.devnull, os.O_RDONLY))
        return await self._inner.get(name)


class _Soak:
    def __init__(self, root: Path, *, seed: int, leak_fds: bool) -> None:
        self.root = root
        self.rng = random.Random(seed)
        (root / "data").mkdir()
        self.plugin = root / "soak_plugin.py"
        self.plugin.write_text(PLUGIN)
        self.wasm = root / "soak_guest.wasm"
        self.wasm.write_bytes(wasmtime.wat2wasm(GUEST_WAT))
        self.fs = BeneathRootFs(root)
        secrets = StaticSecrets({"API_KEY": "k-123"})
        self.leaky = _LeakySecrets(secrets) if leak_fds else None
        self.adapters = Adapters(fs=self.fs, secrets=self.leaky or secrets)
        self.tally = Tally()
        self.running = True

    def policy(self, memory_mb: int) -> PermissionPolicy:
        return PermissionPolicy.from_manifest(
            {
                "name": "soak",
                "version": "1.0.0",
                "permissions": {
                    "fs": ["rw:./data/*"],
                    "budgets": {"wallClockMs": WALL_CLOCK_MS, "memoryMb": memory_mb},
                },
                "secrets": [{"name": "API_KEY"}],
            },
            root=self.root,
        )

    async def new_vm(self) -> VmSandbox:
        return await create_vm_sandbox(
            plugin_module_path=self.plugin, policy=self.policy(VM_MEMORY_MB), proxies=self.adapters
        )

    async def new_wasm(self) -> WasmSandbox:
        return await create_wasm_sandbox(
            wasm_module_path=self.wasm, policy=self.policy(WASM_MEMORY_MB), proxies=self.adapters
        )

    async def _timed(self, call: Callable[[], Awaitable[object]]) -> tuple[object, float]:
        start = time.perf_counter()
        value = await call()
        return value, time.perf_counter() - start

    async def step(self, sb: Any, index: int, rng: random.Random) -> bool:
        """One call; False when the sandbox broke a budget (planned, or a call the shared
        machine slowed past `wallClockMs` — either way the host's answer is to replace it)."""
        start = time.perf_counter()
        try:
            if index % 2 == 0:
                return await self.vm_step(sb, index, rng)
            return await self.wasm_step(sb, index, rng)
        except SuaveplanError as exc:
            if exc.code != "BUDGET_EXCEEDED":
                raise SoakFailure(f"sandbox {index}: unexpected {exc!r}") from exc
            self.tally.record(time.perf_counter() - start, breach=True)
            return False

    async def _expect_error(self, call: Callable[[], Awaitable[object]], codes: set[str]) -> str:
        start = time.perf_counter()
        try:
            value = await call()
        except SuaveplanError as exc:
            if exc.code == "BUDGET_EXCEEDED" and exc.code not in codes:
                raise  # a slowed call: `step` replaces the sandbox
            if exc.code not in codes:
                raise SoakFailure(f"expected one of {sorted(codes)}, got {exc!r}") from exc
            self.tally.record(
                time.perf_counter() - start,
                denied=exc.code == "SAND_PERM_DENIED",
                breach=exc.code == "BUDGET_EXCEEDED",
            )
            return exc.code
        raise SoakFailure(f"expected one of {sorted(codes)}, got the value {value!r}")

    async def vm_step(self, sb: VmSandbox, index: int, rng: random.Random) -> bool:
        roll = rng.random()
        if roll < BREACH_RATE:
            call: Callable[[], Awaitable[object]]
            if rng.random() < 0.5:
                call = lambda: sb.call("forever")  # noqa: E731
            else:
                call = lambda: sb.call("hog", 4 * VM_MEMORY_MB)  # noqa: E731
            await self._expect_error(call, {"BUDGET_EXCEEDED"})
            return False
        if roll < BREACH_RATE + DENY_RATE:
            if rng.random() < 0.5:
                await self._expect_error(
                    lambda: sb.call("read", "/private/x"), {"SAND_PERM_DENIED"}
                )
            else:
                await self._expect_error(lambda: sb.call("secret", "OTHER"), {"SAND_PERM_DENIED"})
            return True
        kind = rng.randrange(4)
        if kind == 0:
            payload = [index, rng.random(), "x" * rng.randrange(64)]
            value, took = await self._timed(lambda: sb.call("echo", payload))
            ok = value == payload
        elif kind == 1:
            n = rng.randrange(1000, 20_000)
            value, took = await self._timed(lambda: sb.call("spin", n))
            ok = value == n * (n - 1) // 2
        elif kind == 2:
            data = rng.randbytes(rng.randrange(1, 16 * 1024))
            value, took = await self._timed(
                lambda: sb.call("roundtrip", f"/data/vm{index}.bin", data)
            )
            ok = value == data  # the acknowledged write is what reads back
        else:
            value, took = await self._timed(lambda: sb.call("secret", "API_KEY"))
            ok = value == "k-123"
        if not ok:
            raise SoakFailure(f"VM sandbox {index}: wrong answer {value!r}")
        self.tally.record(took)
        return True

    async def wasm_step(self, sb: WasmSandbox, index: int, rng: random.Random) -> bool:
        roll = rng.random()
        if roll < BREACH_RATE:
            export = "forever" if rng.random() < 0.5 else "grow"
            await self._expect_error(lambda: sb.call(export), {"BUDGET_EXCEEDED"})
            return False
        if roll < BREACH_RATE + DENY_RATE:
            value, took = await self._timed(lambda: sb.call("secret_denied"))
            if value != Errno.ACCES:
                raise SoakFailure(f"WASM sandbox {index}: a denied import returned {value!r}")
            self.tally.record(took, denied=True)
            return True
        kind = rng.randrange(3)
        if kind == 0:
            a, b = rng.randrange(1 << 20), rng.randrange(1 << 20)
            value, took = await self._timed(lambda: sb.call("add", a, b))
            ok = value == a + b
        elif kind == 1:
            n = rng.randrange(1000, 50_000)  # the sum stays below 2**31: no i32 wrap
            value, took = await self._timed(lambda: sb.call("sum", n))
            ok = value == n * (n + 1) // 2
        else:
            value, took = await self._timed(lambda: sb.call("secret"))
            ok = value == Errno.SUCCESS
        if not ok:
            raise SoakFailure(f"WASM sandbox {index}: wrong answer {value!r}")
        self.tally.record(took)
        return True

    async def drive(self, index: int, until: Callable[[], bool], holder: list[Any]) -> None:
        """Back-to-back calls on sandbox `index` until `until()`; replaces it after a breach."""
        rng = random.Random(self.rng.random())
        is_vm = index % 2 == 0
        while not until():
            sb = holder[index]
            if not await self.step(sb, index, rng):
                await sb.dispose()
                holder[index] = await (self.new_vm() if is_vm else self.new_wasm())

    async def phase(self, seconds: float, holder: list[Any]) -> None:
        deadline = time.monotonic() + seconds
        await asyncio.gather(
            *(
                self.drive(i, lambda: time.monotonic() >= deadline, holder)
                for i in range(len(holder))
            )
        )

    async def started(self, holder: list[Any]) -> None:
        """One call on every WASM sandbox before a sample. A WASM sandbox starts its guest
        thread at its first call, so a sandbox that replaced a breached one just before the
        drivers stopped has none yet: without this, how many of those there happen to be at
        the baseline and at the end showed as thread growth (or shrinkage) of a few."""
        for sb in holder:
            if isinstance(sb, WasmSandbox) and await sb.call("add", 1, 1) != 2:
                raise SoakFailure("a WASM sandbox answered add(1, 1) wrongly")

    async def settle(self, base: Sample | None, timeout_s: float = 5.0) -> Sample:
        """Sample once the host is quiet: workers reaped, replaced sandboxes' threads gone."""
        deadline = time.monotonic() + timeout_s
        previous: Sample | None = None
        while True:
            await asyncio.sleep(0.1)
            now = sample()
            if time.monotonic() > deadline:
                return now
            if base is None:
                # The baseline: counts that held still for one interval.
                steady = previous is not None and (now.fds, now.processes, now.threads) == (
                    previous.fds,
                    previous.processes,
                    previous.threads,
                )
                if steady:
                    return now
                previous = now
            elif now.growth_since(base).within(TOLERANCES):
                return now


async def run_soak(
    *,
    seconds: float,
    sandboxes: int,
    warmup_s: float | None = None,
    seed: int = 7,
    settle_s: float = 5.0,
    _leak_fds: bool = False,
) -> SoakResult:
    """Run the soak in this process and judge it; `_leak_fds` is for the soak's own tests."""
    if sandboxes < 2 or seconds <= 0:
        raise ValueError("need at least 2 sandboxes (one VM, one WASM) and a positive duration")
    warm = warmup_s if warmup_s is not None else min(5.0, max(1.0, seconds / 6))
    await _start_default_executor()
    with tempfile.TemporaryDirectory(prefix="suaveplan-soak-") as tmp:
        soak = _Soak(Path(tmp), seed=seed, leak_fds=_leak_fds)
        holder: list[Any] = []
        try:
            for i in range(sandboxes):
                holder.append(await (soak.new_vm() if i % 2 == 0 else soak.new_wasm()))
            await soak.phase(warm, holder)
            await soak.started(holder)
            base = await soak.settle(None)
            soak.tally.recording = True
            started = time.perf_counter()
            await soak.phase(seconds, holder)
            elapsed = time.perf_counter() - started
            soak.tally.recording = False
            await soak.started(holder)
            end = await soak.settle(base, settle_s)
        finally:
            for sb in holder:
                await sb.dispose()
            soak.fs.close()
            if soak.leaky is not None:
                for fd in soak.leaky.leaked:
                    os.close(fd)
    tally = soak.tally
    growth = end.growth_since(base)
    lat = sorted(tally.latencies)
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else 0.0
    return SoakResult(
        seconds=round(elapsed, 3),
        sandboxes=sandboxes,
        calls=tally.calls,
        denied=tally.denied,
        budget_breaches=tally.breaches,
        throughput_per_s=round(tally.calls / elapsed, 1) if elapsed > 0 else 0.0,
        p50_ms=round(statistics.median(lat) * 1000, 3) if lat else 0.0,
        p99_ms=round(p99 * 1000, 3),
        growth=growth,
        flat=growth.within(TOLERANCES),
    )


def _print_table(result: SoakResult) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"soak: {result.seconds:g} s over {result.sandboxes} sandboxes")
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_column("tolerance", justify="right")
    for name, value in (
        ("calls", result.calls),
        ("denied", result.denied),
        ("budget breaches (sandbox replaced)", result.budget_breaches),
        ("throughput", f"{result.throughput_per_s:g}/s"),
        ("latency p50", f"{result.p50_ms:g} ms"),
        ("latency p99", f"{result.p99_ms:g} ms"),
    ):
        table.add_row(name, str(value), "")
    for name in ("fds", "processes", "threads", "rss_mb"):
        table.add_row(
            f"growth: {name}",
            f"{getattr(result.growth, name):+g}",
            f"≤ {getattr(TOLERANCES, name):g}",
        )
    table.add_row("flat", "yes" if result.flat else "NO", "")
    Console().print(table)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.soak", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--sandboxes", type=int, default=16)
    parser.add_argument("--warmup", type=float, default=None, help="seconds before the baseline")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    try:
        result = asyncio.run(
            run_soak(
                seconds=args.seconds, sandboxes=args.sandboxes, warmup_s=args.warmup, seed=args.seed
            )
        )
    except SoakFailure as exc:
        print(f"soak failed: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result.to_json(), sort_keys=True))
    else:
        _print_table(result)
    return 0 if result.flat else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
