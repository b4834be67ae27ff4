"""The idle watchdog: every sandbox's worker is watched for CPU it spends between jobs.

A worker that escaped the interpreter (the escape corpus's test-only loader, through the
helpers of `test_hostile_worker_frames`) can answer a call and leave threads spinning. With a
`cpuPercent` budget the idle sampler already caught it (`test_compromised_worker_redteam`);
without one nothing did: RLIMIT_CPU is a soft limit the worker can raise. No wall-clock
asserts: a case proves itself with CPU seconds the worker burned and counts of idle samples;
`HANG` only turns a hang into a failure.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest
from test_hostile_worker_frames import HANG, RAW_PRELUDE, _assert_killed, _escaped
from test_hostile_worker_frames import other as other_fixture

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.metrics import BUDGET_EXCEEDED, InMemoryMetrics
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.vm import VmSandbox, create_vm_sandbox
from suaveplan_sandbox.vm import _sandbox as vm_sandbox_module
from suaveplan_sandbox.vm._sandbox import IDLE_CPU_LIMIT_S, THREAD_CPU_MARGIN_S
from suaveplan_sandbox.vm._worker_loop import MAX_BUSY_POLL_US

other = other_fixture

SPINNER = (
    RAW_PRELUDE
    + """
import _thread


def spin_after(threads):
    # Threads that spin once the call has been answered: the host sees an idle worker.
    def spin():
        time.sleep(0.05)
        while True:
            pass

    for _ in range(threads):
        _thread.start_new_thread(spin, ())
    return "spinning"
"""
)

# Calls a host can make back to back while the threads spin: the worker is never idle at two
# samples in a row with no job begun between them, so the idle watchdog never judges it.
# Pure-Python spinners hold the GIL, so together they keep one core at most: these hash a
# large buffer, which CPython does with the GIL released, and run on every core.
BUSY_SPINNER = (
    RAW_PRELUDE
    + """
import _thread
import hashlib


def spin_after(threads):
    data = bytes(1 << 22)

    def spin():
        time.sleep(0.05)
        while True:
            hashlib.sha256(data)

    for _ in range(threads):
        _thread.start_new_thread(spin, ())
    return "spinning"


def step():
    time.sleep(0.005)
    return "stepped"
"""
)

HONEST = """
import datetime


def f(x):
    return x + 1


def burn(seconds):
    # CPU-bound for `seconds` of wall time: one thread, always running.
    end = datetime.datetime.now() + datetime.timedelta(seconds=seconds)
    rounds = 0
    while datetime.datetime.now() < end:
        rounds += 1
    return rounds


def work(n):
    total = 0
    for i in range(n):
        total += i
    return total
"""


def _cpu_s(pid: int) -> float:
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.NoSuchProcess:
        return math.inf
    return float(times.user + times.system)


async def _until(done: object) -> None:
    """Turn the loop until `done()` (a count, never a time); `HANG` turns a hang into a
    failure of the assertion that follows."""
    assert callable(done)
    for _ in range(HANG * 100):
        if done():
            return
        await asyncio.sleep(0.01)


async def _spun_down(sb: VmSandbox, metrics: InMemoryMetrics) -> None:
    """Two threads spin after the answer: the watchdog must end the worker long before it
    has had 12 s of CPU (with 2 threads on 2 cores that is about three times the two idle
    intervals it needs), and the next call gets the coded error."""
    assert await asyncio.wait_for(sb.call("spin_after", 2), HANG) == "spinning"
    await _until(lambda: sb.state == "crashed" or _cpu_s(sb.pid) > 12.0)
    assert sb.state == "crashed", f"worker burned {_cpu_s(sb.pid):.1f} s idle"
    await _assert_killed(sb.pid)
    with pytest.raises(SuaveplanError) as info:
        await sb.call("spin_after", 0)
    assert info.value.code == "SAND_VM_WORKER_CRASHED"
    assert info.value.details["why"] == "earlier-crash"
    cause = info.value.cause
    assert isinstance(cause, SuaveplanError)
    assert cause.code == "SAND_VM_WORKER_CRASHED"
    assert cause.details["why"] == "cpu-while-idle"
    assert metrics.value("plugin.worker_crashed_total", cause="cpu-while-idle") == 1
    assert metrics.value(BUDGET_EXCEEDED.name) == 0  # not a budget the manifest set


async def test_threads_spinning_after_an_answer_end_a_worker_without_budgets_while_idle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, other: VmSandbox
) -> None:
    # Failed before the watchdog: no budget, so no sampler, and the worker spun on.
    metrics = InMemoryMetrics()
    sb = await _escaped(tmp_path, monkeypatch, SPINNER, metrics=metrics)
    async with sb:
        await _spun_down(sb, metrics)
    assert await other.call("f") == 2


async def test_threads_spinning_under_only_a_memory_budget_end_the_worker_while_idle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Sampled between calls for its RSS, but `memoryMb` says nothing about CPU: the same
    # watchdog judges the same sample (one /proc read an interval).
    metrics = InMemoryMetrics()
    sb = await _escaped(tmp_path, monkeypatch, SPINNER, {"memoryMb": 256}, metrics=metrics)
    async with sb:
        await _spun_down(sb, metrics)


@pytest.fixture(params=[None, MAX_BUSY_POLL_US], ids=["default-poll", "max-poll"])
async def honest(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[VmSandbox]:
    (tmp_path / "p.py").write_text(HONEST)
    policy = PermissionPolicy.from_manifest({"name": "honest"}, root=tmp_path)
    options = {} if request.param is None else {"busy_poll_us": request.param}
    metrics = InMemoryMetrics()
    async with await create_vm_sandbox(
        plugin_module_path=tmp_path / "p.py", policy=policy, metrics=metrics, **options
    ) as sb:
        sb.test_metrics = metrics  # type: ignore[attr-defined]
        yield sb


async def test_an_honest_idle_sandbox_without_budgets_is_never_ended(honest: VmSandbox) -> None:
    # Hundreds of calls, each ending in the worker's busy poll (up to 10 ms at the maximum
    # window), then idle stretches of several judged samples each, twice. What the worker
    # really spends while idle is measured here: it must stay far under the limit (/proc
    # counts in 10 ms ticks, so one tick of slack).
    sb = honest
    for _round in range(2):
        for i in range(300):
            assert await sb.call("f", i) == i + 1
            if i % 50 == 0:
                assert await sb.call("work", 20000) == 20000 * 19999 // 2
        checks = sb.idle_checks
        start = _cpu_s(sb.pid)
        await _until(lambda: sb.idle_checks >= checks + 3)  # noqa: B023 - awaited at once
        assert sb.idle_checks >= checks + 3
        idle_spent = _cpu_s(sb.pid) - start
        assert idle_spent < IDLE_CPU_LIMIT_S / 3, f"an honest idle worker spent {idle_spent:.3f} s"
        assert sb.state == "idle"
    metrics = sb.test_metrics  # type: ignore[attr-defined]
    assert metrics.value("plugin.worker_crashed_total") == 0
    assert await sb.call("f", 1) == 2


async def test_samples_taken_while_a_job_runs_never_count_as_idle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A worker busy on calls spends far more than the idle limit between samples: those
    # samples find a job in flight, or a job begun since, and start no stretch. A short
    # interval gives many samples; the count proves they landed during jobs.
    monkeypatch.setattr(vm_sandbox_module, "IDLE_SAMPLE_INTERVAL_S", 0.05)
    (tmp_path / "p.py").write_text(HONEST)
    policy = PermissionPolicy.from_manifest({"name": "honest"}, root=tmp_path)
    async with await create_vm_sandbox(plugin_module_path=tmp_path / "p.py", policy=policy) as sb:
        in_flight = 0
        real = sb._on_sample

        def counted() -> None:
            nonlocal in_flight
            in_flight += sb._job is not None
            real()

        sb._on_sample = counted  # type: ignore[method-assign]
        await _until(lambda: sb.idle_checks >= 1)  # the wrapper is armed from here on
        start = _cpu_s(sb.pid)
        for _ in range(HANG * 100):
            if in_flight >= 5 and _cpu_s(sb.pid) - start > 10 * IDLE_CPU_LIMIT_S:
                break
            await sb.call("work", 200000)
        assert in_flight >= 5
        assert _cpu_s(sb.pid) - start > 10 * IDLE_CPU_LIMIT_S
        assert sb.state == "idle"
        checks = sb.idle_checks
        await _until(lambda: sb.idle_checks >= checks + 2)
        assert sb.state == "idle"


# The loop below may wait a long while on a loaded machine (see there): its own bound, not
# the suite's per-test timeout, must be what ends a case whose threads never had the cores.
@pytest.mark.timeout(300)
@pytest.mark.parametrize("budgets", [None, {"memoryMb": 256}], ids=["no-budget", "memory-only"])
async def test_threads_spinning_while_the_host_keeps_the_worker_busy_end_it_beyond_one_thread(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    other: VmSandbox,
    budgets: dict[str, int] | None,
) -> None:
    # Failed before the one-thread watchdog: back-to-back calls leave no idle stretch of two
    # samples, no `cpuPercent` bounds the threads, and the worker spun on every core (the
    # loop below ran out). A span of two 1 s intervals allows
    # 2 s + THREAD_CPU_MARGIN_S; four threads on two cores spend up to 4 s in it. The
    # threads need more than one core for a span to be seen: on a machine whose other load
    # holds them to less, they spend no more than an honest call would, and the case waits
    # for a span where they get it.
    metrics = InMemoryMetrics()
    sb = await _escaped(tmp_path, monkeypatch, BUSY_SPINNER, budgets, metrics=metrics)
    async with sb:
        assert await asyncio.wait_for(sb.call("spin_after", 4), HANG) == "spinning"
        idle_checks = sb.idle_checks
        calls = 0
        ended: SuaveplanError | None = None
        # Other load on the machine can hold the threads to one core or less for a while, and
        # then the watchdog rightly lets them be: a CPU count alone cannot tell that from a
        # watchdog that failed. The loop gives up only once the worker has spent so much
        # beyond one core since the threads began (its CPU less the wall time passed) that
        # some span the watchdog judged must have held more than its margin: the spans it
        # judges tile the time in pieces of a second or more (two steps of at least half an
        # idle interval), each allowed the margin (0.2 s a second here, twice it, for the
        # readings' error), plus 6 s for the pieces under way where the loop began and where
        # it stops. The clock is read for this bound only, never asserted on.
        start_cpu, start_wall = _cpu_s(sb.pid), time.monotonic()
        beyond = 0.0
        for _ in range(HANG * 200):
            # A worker the watchdog ended between two calls reads as infinite CPU (it is
            # gone): the next call reports it, so only a live worker stops the loop.
            cpu, elapsed = _cpu_s(sb.pid), time.monotonic() - start_wall
            if cpu < math.inf:
                beyond = cpu - start_cpu - elapsed
                if beyond > 6.0 + 2 * THREAD_CPU_MARGIN_S * elapsed:
                    break
            try:
                assert await asyncio.wait_for(sb.call("step"), HANG) == "stepped"
            except SuaveplanError as exc:
                ended = exc
                break
            calls += 1
        assert ended is not None, (
            f"worker burned {_cpu_s(sb.pid) - start_cpu:.1f} s kept busy, {beyond:.1f} s of it"
            " beyond one core"
        )
        assert sb.state == "crashed"
        await _assert_killed(sb.pid)
        # Kept busy throughout: the idle watchdog never judged a stretch.
        assert calls >= 10
        assert sb.idle_checks == idle_checks
        assert sb.thread_checks >= 1
        if ended.details["why"] == "earlier-crash":  # it ended between two calls
            assert isinstance(ended.cause, SuaveplanError)
            ended = ended.cause
        assert ended.code == "SAND_VM_WORKER_CRASHED"
        assert ended.details["why"] == "cpu-beyond-one-thread"
        with pytest.raises(SuaveplanError) as later:
            await sb.call("step")
        assert later.value.details["why"] == "earlier-crash"
        assert later.value.cause is ended
    assert metrics.value("plugin.worker_crashed_total", cause="cpu-beyond-one-thread") == 1
    assert metrics.value("plugin.worker_crashed_total") == 1
    assert metrics.value(BUDGET_EXCEEDED.name) == 0  # not a budget the manifest set
    assert await other.call("f") == 2


@pytest.mark.parametrize(
    "budgets",
    [None, {"cpuPercent": 200, "memoryMb": 256, "wallClockMs": 60000}],
    ids=["no-budget", "budgets"],
)
async def test_an_honest_cpu_bound_call_of_seconds_is_never_ended(
    tmp_path: Path, budgets: dict[str, int] | None
) -> None:
    # One thread always running for about three seconds: its CPU time grows as fast as the
    # wall clock, never faster, and several samples judge it while the call runs (every
    # 20 ms with budgets, every second without). The worker keeps one thread throughout:
    # the guest has no API that makes another.
    (tmp_path / "p.py").write_text(HONEST)
    policy = PermissionPolicy.from_manifest(
        {"name": "honest", "permissions": {"budgets": budgets or {}}}, root=tmp_path
    )
    metrics = InMemoryMetrics()
    async with await create_vm_sandbox(
        plugin_module_path=tmp_path / "p.py", policy=policy, metrics=metrics
    ) as sb:
        await _until(lambda: sb.thread_checks >= 1)  # spans are judged from here on
        # A loaded machine gives the one thread only part of a core for part of a call: such a
        # call proves less (it never nears the limit), so it must pass but does not count. Two
        # calls that had most of a core must pass; a few more calls are allowed for them.
        spent: list[float] = []
        for _round in range(10):
            checks = sb.thread_checks
            start = _cpu_s(sb.pid)
            call = asyncio.ensure_future(sb.call("burn", 1.5))
            threads = 0
            while not call.done():
                threads = max(threads, psutil.Process(sb.pid).num_threads())
                await asyncio.sleep(0.05)
            rounds = await call
            assert isinstance(rounds, int) and rounds > 0
            spent.append(_cpu_s(sb.pid) - start)
            assert threads == 1
            assert sb.thread_checks >= checks + 1  # judged while it ran, or just after
            if sum(s > 0.75 for s in spent) == 2:
                break
        assert sum(s > 0.75 for s in spent) == 2, f"calls spent only {spent} s: not CPU-bound"
        assert sb.state == "idle"
        assert await sb.call("f", 1) == 2
    assert metrics.value("plugin.worker_crashed_total") == 0
    assert metrics.value(BUDGET_EXCEEDED.name) == 0
    assert THREAD_CPU_MARGIN_S < 0.5  # the margin is a few ticks, not a core
