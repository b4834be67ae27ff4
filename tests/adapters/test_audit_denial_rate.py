"""`JsonLinesAudit(denials_per_s=...)`: a plugin looping on denied calls writes a bounded
number of lines, every denial over the rate is counted in exactly one summary line, and
allowed requests are never held back."""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from suaveplan_sandbox.adapters import AuditRecord, JsonLinesAudit, open_standard_adapters
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.metrics import AUDIT_DENIALS_SUPPRESSED, InMemoryMetrics
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.testing import FakeClock

SUPPRESSED = AUDIT_DENIALS_SUPPRESSED.name
T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(record.getMessage()))


_counter = iter(range(10**9))


@pytest.fixture
def lines() -> Iterator[tuple[logging.Logger, list[dict[str, Any]]]]:
    logger = logging.getLogger(f"test.audit.rate.{next(_counter)}")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    handler = _Lines()
    logger.addHandler(handler)
    yield logger, handler.lines
    logger.removeHandler(handler)


def _denial(
    plugin: str = "p",
    capability: str = "fs",
    operation: str = "read_bytes",
    reason: str = "path-not-in-allowlist",
    outcome: str = "deny:SAND_PERM_DENIED",
) -> AuditRecord:
    return AuditRecord(
        plugin=plugin,
        capability=capability,
        operation=operation,
        allowed=False,
        reason=reason,
        rule=None,
        duration_ms=0.01,
        outcome=outcome,
    )


def _allowed(plugin: str = "p", resource: str = "uploads/a.txt") -> AuditRecord:
    return AuditRecord(
        plugin=plugin,
        capability="fs",
        operation="read_bytes",
        allowed=True,
        reason=None,
        rule="./uploads/*",
        duration_ms=0.2,
        resource=resource,
    )


def _denials_accounted(written: list[dict[str, Any]]) -> Counter[tuple[str, ...]]:
    """Denials per (plugin, capability, operation, reason, outcome): a line counts one, a
    summary its `suppressed`."""
    out: Counter[tuple[str, ...]] = Counter()
    for line in written:
        if line["decision"] == "deny":
            key = tuple(line[k] for k in ("plugin", "capability", "operation", "reason", "outcome"))
            out[key] += line.get("suppressed", 1)
    return out


def test_a_denial_flood_writes_the_rate_then_one_summary_that_counts_the_rest(
    lines: tuple[logging.Logger, list[dict[str, Any]]],
) -> None:
    logger, written = lines
    clock, metrics = FakeClock(), InMemoryMetrics()
    audit = JsonLinesAudit(logger, denials_per_s=5, metrics=metrics, clock=clock, now=lambda: T0)
    for _ in range(1000):
        audit.record(_denial())
        clock.advance(0.0005)  # 1000 denials in half a second: one window
    assert len(written) == 5
    assert "suppressed" not in written[-1]
    assert metrics.value(SUPPRESSED, plugin="p", capability="fs") == 995
    clock.advance(1.0)
    audit.record(_allowed())  # the next line after the window closed brings the summary
    summary, allowed = written[5:]
    assert summary == {
        "timestamp": T0.isoformat(),
        "plugin": "p",
        "capability": "fs",
        "operation": "read_bytes",
        "decision": "deny",
        "reason": "path-not-in-allowlist",
        "rule": None,
        "duration_ms": None,
        "outcome": "deny:SAND_PERM_DENIED",
        "suppressed": 995,
        "since": T0.isoformat(),
    }
    assert allowed["decision"] == "allow"
    assert _denials_accounted(written) == {
        ("p", "fs", "read_bytes", "path-not-in-allowlist", "deny:SAND_PERM_DENIED"): 1000
    }


def test_each_second_writes_the_rate_again_and_summarises_the_one_before(
    lines: tuple[logging.Logger, list[dict[str, Any]]],
) -> None:
    logger, written = lines
    clock = FakeClock()
    audit = JsonLinesAudit(logger, denials_per_s=2, clock=clock)
    for _window in range(3):
        for _ in range(10):
            audit.record(_denial())
        clock.advance(1.0)
    audit.flush()
    shape = [line.get("suppressed", "line") for line in written]
    assert shape == ["line", "line", 8, "line", "line", 8, "line", "line", 8]


def test_summaries_group_by_operation_reason_and_outcome_and_windows_by_capability(
    lines: tuple[logging.Logger, list[dict[str, Any]]],
) -> None:
    logger, written = lines
    clock = FakeClock()
    audit = JsonLinesAudit(logger, denials_per_s=1, clock=clock)
    audit.record(_denial(capability="fs"))
    audit.record(_denial(capability="fetch", operation="request", reason="host-not-in-allowlist"))
    for _ in range(3):
        audit.record(_denial(capability="fs"))
        audit.record(_denial(capability="fs", operation="list_dir"))
        audit.record(_denial(capability="fs", outcome="deny:SAND_WASM_OUTBOUND_DENIED"))
        audit.record(_denial(capability="fs", reason="mode-not-permitted"))
    assert len(written) == 2  # one line per (plugin, capability) window
    audit.flush()
    summaries = {(s["operation"], s["reason"], s["outcome"]): s["suppressed"] for s in written[2:]}
    assert summaries == {
        ("read_bytes", "path-not-in-allowlist", "deny:SAND_PERM_DENIED"): 3,
        ("list_dir", "path-not-in-allowlist", "deny:SAND_PERM_DENIED"): 3,
        ("read_bytes", "path-not-in-allowlist", "deny:SAND_WASM_OUTBOUND_DENIED"): 3,
        ("read_bytes", "mode-not-permitted", "deny:SAND_PERM_DENIED"): 3,
    }


def test_one_plugins_flood_does_not_use_another_plugins_allowance(
    lines: tuple[logging.Logger, list[dict[str, Any]]],
) -> None:
    logger, written = lines
    audit = JsonLinesAudit(logger, denials_per_s=3, clock=FakeClock())
    for _ in range(100):
        audit.record(_denial(plugin="noisy"))
    for _ in range(3):
        audit.record(_denial(plugin="quiet"))
    assert Counter(line["plugin"] for line in written) == {"noisy": 3, "quiet": 3}


def test_allowed_requests_are_always_written(
    lines: tuple[logging.Logger, list[dict[str, Any]]],
) -> None:
    # Each names what the plugin touched: folding them would let a flood of harmless
    # calls hide the one that matters.
    logger, written = lines
    audit = JsonLinesAudit(logger, denials_per_s=1, include_resource=True, clock=FakeClock())
    for i in range(500):
        audit.record(_allowed(resource=f"uploads/{i}.txt"))
    audit.record(_allowed(resource="uploads/secret.txt"))
    assert len(written) == 501
    assert written[-1]["resource"] == "uploads/secret.txt"


def test_an_allowed_record_reads_no_clock_while_no_summary_is_pending(
    lines: tuple[logging.Logger, list[dict[str, Any]]],
) -> None:
    # The allowed path is the gateway's hot path: with nothing held it does no more than
    # before (no clock, no lock).
    logger, _written = lines

    class CountingClock:
        reads = 0

        def now(self) -> float:
            self.reads += 1
            return 0.0

    clock = CountingClock()
    audit = JsonLinesAudit(logger, denials_per_s=1, clock=clock)
    for _ in range(100):
        audit.record(_allowed())
    assert clock.reads == 0
    audit.record(_denial())
    audit.record(_denial())  # held: now allowed records look at the clock for its window
    reads = clock.reads
    audit.record(_allowed())
    assert clock.reads > reads


def test_a_summary_is_written_before_the_first_line_after_its_window(
    lines: tuple[logging.Logger, list[dict[str, Any]]],
) -> None:
    logger, written = lines
    clock = FakeClock()
    audit = JsonLinesAudit(logger, denials_per_s=1, clock=clock)
    audit.record(_denial(plugin="a"))
    audit.record(_denial(plugin="a"))
    clock.advance(0.999)
    audit.record(_allowed(plugin="b"))  # the window is still open: nothing to summarise
    clock.advance(0.001)
    audit.record(_denial(plugin="b"))  # another plugin's line closes it
    assert [(line["plugin"], line.get("suppressed")) for line in written] == [
        ("a", None),
        ("b", None),
        ("a", 1),
        ("b", None),
    ]


def test_flush_writes_what_an_open_window_holds_and_nothing_twice(
    lines: tuple[logging.Logger, list[dict[str, Any]]],
) -> None:
    logger, written = lines
    clock = FakeClock()
    audit = JsonLinesAudit(logger, denials_per_s=1, clock=clock)
    for _ in range(4):
        audit.record(_denial())
    audit.flush()
    audit.flush()
    clock.advance(5.0)
    audit.record(_allowed())
    assert [line.get("suppressed") for line in written] == [None, 3, None]


def test_no_limit_writes_every_denial_and_zero_writes_only_summaries(
    lines: tuple[logging.Logger, list[dict[str, Any]]],
) -> None:
    logger, written = lines
    unlimited = JsonLinesAudit(logger, denials_per_s=None, clock=FakeClock())
    for _ in range(50):
        unlimited.record(_denial())
    assert len(written) == 50
    written.clear()
    metrics = InMemoryMetrics()
    summaries_only = JsonLinesAudit(logger, denials_per_s=0, metrics=metrics, clock=FakeClock())
    for _ in range(50):
        summaries_only.record(_denial())
    assert written == []
    summaries_only.flush()
    assert [line["suppressed"] for line in written] == [50]
    assert metrics.value(SUPPRESSED) == 50


def test_the_default_rate_is_ten_denial_lines_a_second(
    lines: tuple[logging.Logger, list[dict[str, Any]]],
) -> None:
    logger, written = lines
    audit = JsonLinesAudit(logger, clock=FakeClock())
    for _ in range(25):
        audit.record(_denial())
    assert len(written) == 10


@pytest.mark.parametrize("rate", [-1, True, 1.5, "10"])
def test_a_rate_that_is_not_a_count_is_refused(rate: object) -> None:
    with pytest.raises(SuaveplanError) as info:
        JsonLinesAudit(denials_per_s=rate)  # type: ignore[arg-type]
    assert info.value.code == "SAND_INVALID_ARGUMENT"
    assert info.value.details == {"argument": "denials_per_s"}


def test_nothing_is_counted_for_a_logger_that_writes_nothing() -> None:
    logger = logging.getLogger("test.audit.rate.quiet")
    logger.setLevel(logging.WARNING)
    metrics = InMemoryMetrics()
    audit = JsonLinesAudit(logger, denials_per_s=0, metrics=metrics, clock=FakeClock())
    for _ in range(10):
        audit.record(_denial())
    assert metrics.value(SUPPRESSED) == 0


def test_a_records_extra_fields_cannot_forge_a_summary(
    lines: tuple[logging.Logger, list[dict[str, Any]]],
) -> None:
    from dataclasses import replace

    logger, written = lines
    audit = JsonLinesAudit(logger, denials_per_s=None)
    audit.record(replace(_denial(), extra={"suppressed": 10**6, "since": "forged", "x": 1}))
    assert "suppressed" not in written[0] and "since" not in written[0]
    assert written[0]["x"] == 1


STEP = st.tuples(
    st.sampled_from(["p", "q"]),
    st.sampled_from(["fs", "fetch", "unknown"]),
    st.sampled_from(["read_bytes", "unknown"]),
    st.sampled_from(["path-not-in-allowlist", "malformed-payload"]),
    st.booleans(),  # an allowed record instead
    st.sampled_from([0.0, 0.0, 0.01, 0.3, 1.0, 2.5]),  # then the clock moves this much
)


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(STEP, max_size=300), rate=st.integers(0, 4), flush=st.booleans())
def test_every_denial_is_a_line_or_counted_in_exactly_one_summary(
    steps: list[tuple[str, str, str, str, bool, float]], rate: int, flush: bool
) -> None:
    logger = logging.getLogger("test.audit.rate.property")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    handler = _Lines()
    logger.addHandler(handler)
    try:
        clock, metrics = FakeClock(), InMemoryMetrics()
        audit = JsonLinesAudit(logger, denials_per_s=rate, metrics=metrics, clock=clock)
        expected: Counter[tuple[str, ...]] = Counter()
        # (plugin, capability) -> FakeClock times of the denial lines written one by one
        line_times: dict[tuple[str, str], list[float]] = {}
        for plugin, capability, operation, reason, allowed, advance in steps:
            if allowed:
                audit.record(_allowed(plugin=plugin))
            else:
                before = len(handler.lines)
                audit.record(_denial(plugin, capability, operation, reason))
                key = (plugin, capability, operation, reason, "deny:SAND_PERM_DENIED")
                expected[key] += 1
                if any("suppressed" not in line for line in handler.lines[before:]):
                    line_times.setdefault((plugin, capability), []).append(clock.now())
            clock.advance(advance)
        if flush:
            audit.flush()
        else:
            clock.advance(1.0)  # every window closed: the next line brings the summaries
            audit.record(_allowed())
        assert _denials_accounted(handler.lines) == expected
        summarised = sum(line.get("suppressed", 0) for line in handler.lines)
        assert metrics.value(SUPPRESSED) == summarised
        # Never more than the rate of denial lines per (plugin, capability) and window, so
        # never more than twice the rate in any second (two windows can meet within one).
        for stamps in line_times.values():
            for start in stamps:
                assert sum(1 for t in stamps if start <= t < start + 1.0) <= 2 * rate
    finally:
        logger.removeHandler(handler)


def test_denials_from_many_threads_add_up(
    lines: tuple[logging.Logger, list[dict[str, Any]]],
) -> None:
    # Sandboxes on several threads (blocking facades, WASM guests) may share one sink.
    logger, written = lines
    metrics = InMemoryMetrics()
    audit = JsonLinesAudit(logger, denials_per_s=7, metrics=metrics, now=lambda: T0)
    per_thread, threads = 2000, 4

    def flood(plugin: str) -> None:
        for _ in range(per_thread):
            audit.record(_denial(plugin=plugin))

    workers = [threading.Thread(target=flood, args=(f"p{i % 2}",)) for i in range(threads)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often, so unguarded state would show
    try:
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    finally:
        sys.setswitchinterval(interval)
    audit.flush()
    totals = Counter[str]()
    for line in written:
        totals[line["plugin"]] += line.get("suppressed", 1)
    assert totals == {"p0": 2 * per_thread, "p1": 2 * per_thread}
    assert metrics.value(SUPPRESSED) == sum(line.get("suppressed", 0) for line in written)


def test_since_is_the_time_of_the_first_denial_a_summary_counts(
    lines: tuple[logging.Logger, list[dict[str, Any]]],
) -> None:
    logger, written = lines
    moments = iter(T0 + timedelta(seconds=s) for s in range(100))
    audit = JsonLinesAudit(logger, denials_per_s=1, clock=FakeClock(), now=lambda: next(moments))
    audit.record(_denial())  # written: timestamp T0
    audit.record(_denial())  # folded: since T0 + 1 s
    audit.record(_denial())  # folded into the same summary
    audit.flush()  # summary's own timestamp: T0 + 2 s
    assert written[1]["since"] == (T0 + timedelta(seconds=1)).isoformat()
    assert written[1]["timestamp"] == (T0 + timedelta(seconds=2)).isoformat()
    assert written[1]["suppressed"] == 2


async def test_the_standard_adapters_audit_takes_the_rate_and_the_metrics_sink(
    tmp_path: Path, lines: tuple[logging.Logger, list[dict[str, Any]]]
) -> None:
    logger, written = lines
    policy = PermissionPolicy.from_manifest({"name": "std"}, root=tmp_path)
    metrics = InMemoryMetrics()
    async with await open_standard_adapters(
        policy, audit_logger=logger, audit_denials_per_s=1, audit_metrics=metrics
    ) as standard:
        for _ in range(3):
            standard.audit.record(_denial(plugin="std"))
        standard.audit.flush()
    assert [line.get("suppressed") for line in written] == [None, 2]
    assert metrics.value(SUPPRESSED, plugin="std") == 2


async def test_the_standard_adapters_refuse_a_bad_audit_rate_before_opening_anything(
    tmp_path: Path,
) -> None:
    (tmp_path / "uploads").mkdir()
    policy = PermissionPolicy.from_manifest(
        {"name": "std", "permissions": {"fs": ["./uploads/*"]}}, root=tmp_path
    )
    fds_before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(SuaveplanError) as info:
        await open_standard_adapters(policy, audit_denials_per_s=-1)
    assert info.value.code == "SAND_INVALID_ARGUMENT"
    assert len(os.listdir("/proc/self/fd")) == fds_before  # no root fd left open
