"""Audit lines and their reader; the in-process event bus."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from suaveplan_sandbox.adapters._audit import JsonLinesAudit, iter_audit
from suaveplan_sandbox.adapters._events import InProcessEventBus
from suaveplan_sandbox.adapters._protocols import AuditRecord
from suaveplan_sandbox.errors import SuaveplanError, WireValue

DAY = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def _record(plugin: str, resource: str, allowed: bool = True) -> AuditRecord:
    return AuditRecord(
        plugin=plugin,
        capability="fs",
        operation="read",
        allowed=allowed,
        reason=None if allowed else "path-not-in-allowlist",
        rule="./uploads/*",
        duration_ms=1.25,
        resource=resource,
    )


def test_one_json_line_per_decision_without_resource_by_default(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="suaveplan_sandbox.audit")
    JsonLinesAudit(now=lambda: DAY).record(_record("p", "uploads/a.txt", allowed=False))
    (line,) = [r.getMessage() for r in caplog.records if r.name == "suaveplan_sandbox.audit"]
    entry = json.loads(line)
    assert entry == {
        "timestamp": DAY.isoformat(),
        "plugin": "p",
        "capability": "fs",
        "operation": "read",
        "decision": "deny",
        "reason": "path-not-in-allowlist",
        "rule": "./uploads/*",
        "duration_ms": 1.25,
        "outcome": "ok",
    }


def test_no_line_is_built_for_a_logger_that_would_not_emit_it() -> None:
    # logging's default (no handler enabled for INFO): the JSON and its timestamp would be
    # thrown away, so they are never made. Enabled again, the very next decision is logged.
    logger = logging.getLogger("test.audit.quiet")
    logger.setLevel(logging.WARNING)
    stamps: list[datetime] = []

    def now() -> datetime:
        stamps.append(DAY)
        return DAY

    audit = JsonLinesAudit(logger, now=now)
    audit.record(_record("p", "uploads/a.txt"))
    assert stamps == []
    logger.setLevel(logging.INFO)
    seen: list[str] = []

    class _Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    handler = _Keep()
    logger.addHandler(handler)
    try:
        audit.record(_record("p", "uploads/b.txt"))
    finally:
        logger.removeHandler(handler)
    assert len(stamps) == 1
    assert [json.loads(line)["plugin"] for line in seen] == ["p"]


def test_iter_audit_answers_what_a_plugin_touched_yesterday(tmp_path: Path) -> None:
    log_path = tmp_path / "audit.log"
    logger = logging.getLogger("test.audit.file")
    logger.propagate = False
    handler = logging.FileHandler(log_path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    clock = iter([DAY - timedelta(days=1), DAY, DAY, DAY + timedelta(hours=1)])
    audit = JsonLinesAudit(logger, include_resource=True, now=lambda: next(clock))
    audit.record(_record("p", "uploads/old.txt"))
    audit.record(_record("p", "uploads/a.txt"))
    audit.record(_record("q", "uploads/q.txt"))
    audit.record(_record("p", "uploads/b.txt"))
    handler.close()
    logger.removeHandler(handler)
    with log_path.open("a") as fh:
        fh.write("not json\n")
    since = DAY - timedelta(hours=12)
    touched = [e["resource"] for e in iter_audit(log_path, plugin="p", since=since)]
    assert touched == ["uploads/a.txt", "uploads/b.txt"]
    until = DAY + timedelta(minutes=1)
    assert len(list(iter_audit(log_path, since=since, until=until))) == 2


async def test_in_process_bus_delivers_to_matching_patterns_only() -> None:
    bus = InProcessEventBus()
    got: list[tuple[str, str, WireValue]] = []

    def handler_for(tag: str):  # type: ignore[no-untyped-def]
        async def handler(topic: str, payload: WireValue) -> None:
            got.append((tag, topic, payload))

        return handler

    sub_a = await bus.subscribe("a", "orders.*", handler_for("a"))
    await bus.subscribe("b", "orders.created", handler_for("b"))

    async def broken(topic: str, payload: WireValue) -> None:
        raise RuntimeError("boom")

    await bus.subscribe("c", "*", broken)
    await bus.publish("host", "orders.created", {"id": 1})
    await bus.publish("host", "users.created", None)
    assert sorted(got) == [("a", "orders.created", {"id": 1}), ("b", "orders.created", {"id": 1})]
    await sub_a.close()
    got.clear()
    await bus.publish("host", "orders.paid.eu", 2)
    assert got == []


async def test_the_audit_of_real_gateway_calls_answers_what_was_touched_yesterday(
    tmp_path: Path,
) -> None:
    from suaveplan_sandbox.adapters import Adapters
    from suaveplan_sandbox.gateway import Gateway
    from suaveplan_sandbox.permissions import PermissionChecker, PermissionPolicy
    from suaveplan_sandbox.testing import InMemoryFs

    log_path = tmp_path / "audit.jsonl"
    logger = logging.getLogger("test.audit.gateway")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    handler = logging.FileHandler(log_path)
    logger.addHandler(handler)
    moments = iter(
        [DAY - timedelta(days=2), DAY - timedelta(hours=20), DAY - timedelta(hours=14), DAY]
    )
    audit = JsonLinesAudit(logger, include_resource=True, now=lambda: next(moments))
    policy = PermissionPolicy.from_manifest(
        {"name": "p", "permissions": {"fs": ["./uploads/*"]}}, root="/srv/p"
    )
    fs = InMemoryFs({"uploads/a.txt": b"a", "uploads/b.txt": b"b"})
    gateway = Gateway(checker=PermissionChecker(policy), adapters=Adapters(fs=fs), audit=audit)
    await gateway.dispatch("fs", "read_bytes", {"path": "uploads/a.txt"})  # two days ago
    await gateway.dispatch("fs", "read_bytes", {"path": "./uploads/b.txt"})  # yesterday
    with pytest.raises(SuaveplanError):
        await gateway.dispatch("fs", "read_bytes", {"path": "/etc/passwd"})  # yesterday, denied
    await gateway.dispatch("fs", "exists", {"path": "uploads/a.txt"})  # today
    handler.close()
    logger.removeHandler(handler)
    start = (DAY - timedelta(days=1)).replace(hour=0)
    end = DAY.replace(hour=0)
    yesterday = list(iter_audit(log_path, plugin="p", since=start, until=end))
    assert [(e["operation"], e["decision"], e.get("resource")) for e in yesterday] == [
        ("read_bytes", "allow", "uploads/b.txt"),
        ("read_bytes", "deny", None),
    ]
    assert yesterday[1]["reason"] == "path-not-in-allowlist"


def test_extra_fields_join_the_line_but_never_replace_a_standard_field() -> None:
    from dataclasses import replace

    audit = JsonLinesAudit(include_resource=False)
    entry = replace(
        _record("p", "uploads/secret-name.txt", allowed=False),
        extra={"correlation_id": "abc123", "resource": "forged", "decision": "allow"},
    )
    line = json.loads(audit.line(entry))
    assert line["correlation_id"] == "abc123"
    assert line["decision"] == "deny"
    assert "resource" not in line  # only include_resource=True adds it
    with_resource = json.loads(JsonLinesAudit(include_resource=True).line(entry))
    assert with_resource["resource"] == "uploads/secret-name.txt"
