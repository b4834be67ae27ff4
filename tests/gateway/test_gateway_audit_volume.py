"""A plugin looping on denied calls through the gateway writes a bounded number of audit
lines; every denial is still accounted for (lines plus summaries), and the summaries a
sandbox's last window holds are written when its gateway closes."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from suaveplan_sandbox.adapters import Adapters, AuditSink, JsonLinesAudit
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.gateway import Gateway
from suaveplan_sandbox.metrics import (
    AUDIT_DENIALS_SUPPRESSED,
    CAPABILITY_CALLS,
    PERMISSION_DENIED,
    InMemoryMetrics,
)
from suaveplan_sandbox.permissions import PermissionChecker, PermissionPolicy
from suaveplan_sandbox.testing import FakeClock, InMemoryFs

MANIFEST: dict[str, Any] = {"name": "loopy", "permissions": {"fs": ["./uploads/*"]}}


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(record.getMessage()))


@pytest.fixture
def audit_lines() -> Iterator[tuple[logging.Logger, list[dict[str, Any]]]]:
    logger = logging.getLogger("test.gateway.audit_volume")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    handler = _Lines()
    logger.addHandler(handler)
    yield logger, handler.lines
    logger.removeHandler(handler)


def _gateway(audit: AuditSink, metrics: InMemoryMetrics) -> Gateway:
    policy = PermissionPolicy.from_manifest(MANIFEST, root="/srv/loopy")
    return Gateway(
        checker=PermissionChecker(policy, metrics=metrics),
        adapters=Adapters(fs=InMemoryFs({"uploads/a.txt": b"a"})),
        audit=audit,
    )


async def test_a_loop_of_denied_calls_writes_the_rate_and_a_summary_at_close(
    audit_lines: tuple[logging.Logger, list[dict[str, Any]]],
) -> None:
    logger, lines = audit_lines
    metrics, clock = InMemoryMetrics(), FakeClock()
    audit = JsonLinesAudit(logger, denials_per_s=10, metrics=metrics, clock=clock)
    gateway = _gateway(audit, metrics)
    for _ in range(5000):
        with pytest.raises(SuaveplanError) as info:
            await gateway.dispatch("fs", "read_bytes", {"path": "/etc/shadow"})
        assert info.value.code == "SAND_PERM_DENIED"
    await gateway.dispatch("fs", "read_bytes", {"path": "uploads/a.txt"})
    assert len(lines) == 11  # ten denials, then the allowed read: the window is still open
    assert lines[-1]["decision"] == "allow"
    await gateway.close()
    (summary,) = lines[11:]
    assert (summary["capability"], summary["operation"], summary["reason"]) == (
        "fs",
        "read_bytes",
        "path-not-in-allowlist",
    )
    assert summary["suppressed"] == 4990
    assert sum(line.get("suppressed", 1) for line in lines if line["decision"] == "deny") == 5000
    # The checker still counts every denial; the audit counts the ones it folded.
    assert metrics.value(PERMISSION_DENIED.name, plugin="loopy") == 5000
    assert metrics.value(AUDIT_DENIALS_SUPPRESSED.name, plugin="loopy", capability="fs") == 4990


async def test_denials_through_dispatch_sync_are_bounded_and_flushed_by_close_nowait(
    audit_lines: tuple[logging.Logger, list[dict[str, Any]]],
) -> None:
    logger, lines = audit_lines
    metrics = InMemoryMetrics()
    audit = JsonLinesAudit(logger, denials_per_s=2, metrics=metrics, clock=FakeClock())
    gateway = _gateway(audit, metrics)
    for _ in range(100):
        with pytest.raises(SuaveplanError):
            gateway.dispatch_sync("fs", "write_bytes", {"path": "uploads/a.txt", "data": b"x"})
        with pytest.raises(SuaveplanError):
            gateway.dispatch_sync("nonsense", "op", {})
    assert len(lines) == 4  # two per capability: fs and unknown
    gateway.close_nowait()
    summaries = {(s["capability"], s["reason"]): s["suppressed"] for s in lines[4:]}
    assert summaries == {("fs", "mode-not-permitted"): 98, ("unknown", "unknown-capability"): 98}


async def test_closing_a_gateway_whose_sink_cannot_flush_is_still_a_clean_close(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class BrokenFlush:
        def record(self, entry: object) -> None:
            pass

        def flush(self) -> None:
            raise OSError("disk gone")

    policy = PermissionPolicy.from_manifest(MANIFEST, root="/srv/loopy")
    gateway = Gateway(checker=PermissionChecker(policy), adapters=Adapters(), audit=BrokenFlush())
    await gateway.close()
    assert gateway.closed
    warnings = [r for r in caplog.records if r.name == "suaveplan_sandbox.gateway"]
    assert [r.__dict__["suaveplan"]["error_type"] for r in warnings] == ["OSError"]
    assert all("disk gone" not in r.getMessage() for r in warnings)


class _Switchable:
    """A sink that says when it would drop records (`is_enabled`), and counts what it gets."""

    def __init__(self) -> None:
        self.on = False
        self.records: list[str] = []
        self.asked = 0

    def is_enabled(self) -> bool:
        self.asked += 1
        return self.on

    def record(self, entry: Any) -> None:
        self.records.append(entry.outcome)


async def test_a_sink_that_would_drop_records_is_handed_none_and_the_metrics_still_count() -> None:
    sink, metrics = _Switchable(), InMemoryMetrics()
    gateway = _gateway(sink, metrics)
    assert await gateway.dispatch("fs", "read_bytes", {"path": "uploads/a.txt"}) == b"a"
    with pytest.raises(SuaveplanError):
        await gateway.dispatch("fs", "read_bytes", {"path": "/etc/shadow"})
    assert sink.records == []
    assert sink.asked == 2  # asked per request: a sink may be switched on at any time
    assert metrics.value(PERMISSION_DENIED.name, plugin="loopy") == 1
    assert metrics.value(CAPABILITY_CALLS.name, plugin="loopy", outcome="ok") == 1
    assert metrics.value(CAPABILITY_CALLS.name, plugin="loopy", outcome="deny") == 1
    sink.on = True
    assert await gateway.dispatch("fs", "read_bytes", {"path": "uploads/a.txt"}) == b"a"
    assert sink.records == ["ok"]


def test_json_lines_audit_is_enabled_exactly_while_its_logger_writes_info(
    audit_lines: tuple[logging.Logger, list[dict[str, Any]]],
) -> None:
    logger, _ = audit_lines
    audit = JsonLinesAudit(logger)
    assert audit.is_enabled() is True
    logger.setLevel(logging.WARNING)
    assert audit.is_enabled() is False
    logger.setLevel(logging.INFO)
    assert audit.is_enabled() is True


async def test_a_sink_whose_is_enabled_is_not_callable_gets_every_record() -> None:
    class Odd:
        is_enabled = False  # not the optional method: ignored, never called

        def __init__(self) -> None:
            self.records: list[str] = []

        def record(self, entry: Any) -> None:
            self.records.append(entry.outcome)

    sink = Odd()
    gateway = _gateway(sink, InMemoryMetrics())
    assert await gateway.dispatch("fs", "read_bytes", {"path": "uploads/a.txt"}) == b"a"
    assert sink.records == ["ok"]
