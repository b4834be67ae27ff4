"""The gateway: checker first, adapter only on Allow, one translation point for failures."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from suaveplan_sandbox.adapters import Adapters, HttpRequest, HttpResponse
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.gateway import Gateway
from suaveplan_sandbox.metrics import CAPABILITY_CALLS, PERMISSION_DENIED, InMemoryMetrics
from suaveplan_sandbox.permissions import Deny, PermissionChecker, PermissionPolicy
from suaveplan_sandbox.testing import (
    DictSecrets,
    FakeDb,
    FakeFetch,
    InMemoryEvents,
    InMemoryFs,
    RecordingAudit,
)

MANIFEST: dict[str, Any] = {
    "name": "gw",
    "permissions": {"fs": ["./uploads/*", "rw:./out/*"], "fetch": ["api.example.com"]},
    "database": {"tablePrefix": "gw_"},
    "secrets": [{"name": "TOKEN"}],
    "events": {"publishes": ["gw.done"], "subscribes": ["other.*"]},
}


class _Rig:
    def __init__(self, **adapter_overrides: Any) -> None:
        self.metrics = InMemoryMetrics()
        policy = PermissionPolicy.from_manifest(MANIFEST, root="/srv/gw")
        self.checker = PermissionChecker(policy, metrics=self.metrics)
        self.fs = adapter_overrides.pop("fs", InMemoryFs({"uploads/a.txt": b"hello"}))
        self.fetch = FakeFetch({"https://api.example.com/v1": HttpResponse(status=200, body=b"{}")})
        self.db = FakeDb()
        self.secrets = DictSecrets({"TOKEN": "s3cr3t-value", "OTHER": "x"})
        self.events = InMemoryEvents()
        self.audit = RecordingAudit()
        self.denials: list[Deny] = []
        adapters = Adapters(
            fs=self.fs,
            fetch=self.fetch,
            db=self.db,
            secrets=self.secrets,
            events=self.events,
            **adapter_overrides,
        )
        self.gateway = Gateway(
            checker=self.checker,
            adapters=adapters,
            audit=self.audit,
            on_denial=lambda d, c, o: self.denials.append(d),
        )

    async def denied(self, cap: object, op: object, args: object) -> SuaveplanError:
        with pytest.raises(SuaveplanError) as info:
            await self.gateway.dispatch(cap, op, args)
        assert info.value.code == "SAND_PERM_DENIED"
        return info.value


async def test_allowed_read_reaches_the_adapter_once_with_the_normalised_path() -> None:
    rig = _Rig()
    data = await rig.gateway.dispatch("fs", "read_bytes", {"path": "/uploads/x/../a.txt"})
    assert data == b"hello"
    assert rig.fs.calls == [("read_bytes", "uploads/a.txt")]
    assert rig.metrics.value(CAPABILITY_CALLS.name, capability="fs", outcome="ok") == 1


async def test_denied_fetch_never_reaches_the_adapter_and_is_counted() -> None:
    rig = _Rig()
    err = await rig.denied("fetch", "request", {"url": "https://evil.example/"})
    assert err.details == {"capability": "fetch", "reason": "host-not-in-allowlist"}
    assert rig.fetch.requests == []
    assert rig.metrics.value(PERMISSION_DENIED.name, capability="fetch") == 1
    assert len(rig.denials) == 1


async def test_allowed_fetch_sends_the_checker_serialised_url() -> None:
    rig = _Rig()
    out = await rig.gateway.dispatch(
        "fetch", "request", {"url": "HTTPS://API.EXAMPLE.COM/v1", "headers": [["a", "b"]]}
    )
    assert out == {"status": 200, "headers": [], "body": b"{}"}
    assert rig.fetch.requests == [
        HttpRequest(
            url="https://api.example.com/v1",
            method="GET",
            headers=(("a", "b"),),
            body=b"",
            rule="api.example.com",
        )
    ]


async def test_write_needs_rw_and_denied_writes_never_reach_the_adapter() -> None:
    rig = _Rig()
    await rig.denied("fs", "write_bytes", {"path": "uploads/a.txt", "data": b"x"})
    await rig.gateway.dispatch("fs", "write_bytes", {"path": "out/r.txt", "data": b"ok"})
    assert rig.fs.calls == [("write_bytes", "out/r.txt")]


async def test_denied_secret_never_invokes_the_secrets_adapter() -> None:
    rig = _Rig()
    await rig.denied("secrets", "get", {"name": "OTHER"})
    assert rig.secrets.requested == []
    assert await rig.gateway.dispatch("secrets", "get", {"name": "TOKEN"}) == "s3cr3t-value"


async def test_db_queries_pass_the_gate_and_bind_params() -> None:
    rig = _Rig()
    await rig.denied("db", "query", {"sql": "SELECT * FROM users", "params": []})
    await rig.gateway.dispatch(
        "db", "query", {"sql": "SELECT * FROM gw_t WHERE a = ?", "params": [1]}
    )
    assert rig.db.queries == [("SELECT * FROM gw_t WHERE a = ?", (1,))]


async def test_events_publish_is_checked_against_publishes() -> None:
    rig = _Rig()
    await rig.denied("events", "publish", {"topic": "other.x", "payload": 1})
    await rig.gateway.dispatch("events", "publish", {"topic": "gw.done", "payload": {"n": 1}})
    assert rig.events.published == [("gw", "gw.done", {"n": 1})]


@pytest.mark.parametrize(
    ("cap", "op", "args", "reason"),
    [
        ("shell", "run", {}, "unknown-capability"),
        ("fs", "unlink", {"path": "uploads/a.txt"}, "malformed-payload"),
        ("fs", "read_bytes", "uploads/a.txt", "malformed-payload"),
        ("fs", "write_bytes", {"path": "out/a", "data": "text"}, "malformed-payload"),
        (
            "fetch",
            "request",
            {"url": "https://api.example.com/", "method": "TRACE"},
            "malformed-payload",
        ),
        ("db", "query", {"sql": "SELECT * FROM gw_t", "params": "1"}, "malformed-payload"),
        (None, None, None, "unknown-capability"),
    ],
)
async def test_unknown_operations_and_malformed_arguments_are_denied(
    cap: object, op: object, args: object, reason: str
) -> None:
    rig = _Rig()
    err = await rig.denied(cap, op, args)
    assert err.details["reason"] == reason
    assert rig.fs.calls == [] and rig.db.queries == []
    assert rig.metrics.value(PERMISSION_DENIED.name, reason=reason) == 1


class _ExplodingFs:
    async def read_bytes(self, path: str, *, max_bytes: int) -> bytes:
        raise OSError(f"disk error reading /srv/gw/{path}")

    async def write_bytes(self, path: str, data: bytes) -> None:
        raise OSError("disk full")

    async def list_dir(self, path: str) -> list[str]:
        return []

    async def exists(self, path: str) -> bool:
        return False


async def test_adapter_failures_are_translated_without_host_detail() -> None:
    rig = _Rig(fs=_ExplodingFs())
    with pytest.raises(SuaveplanError) as info:
        await rig.gateway.dispatch("fs", "read_bytes", {"path": "uploads/a.txt"})
    assert info.value.code == "SAND_ADAPTER_FAILED"
    assert info.value.cause is None
    assert "/srv/gw" not in repr(info.value.to_wire())
    assert rig.audit.records[-1].outcome == "error:SAND_ADAPTER_FAILED"


async def test_missing_adapter_fails_closed_with_a_coded_error() -> None:
    rig = _Rig()
    gateway = Gateway(checker=rig.checker, adapters=Adapters())
    with pytest.raises(SuaveplanError) as info:
        await gateway.dispatch("fs", "read_bytes", {"path": "uploads/a.txt"})
    assert info.value.code == "SAND_ADAPTER_MISSING"


async def test_close_cancels_in_flight_adapter_calls_and_is_idempotent() -> None:
    slow = InMemoryFs({"uploads/a.txt": b"x"}, delay=30)
    rig = _Rig(fs=slow)
    task = asyncio.ensure_future(
        rig.gateway.dispatch("fs", "read_bytes", {"path": "uploads/a.txt"})
    )
    while rig.gateway.inflight == 0:
        await asyncio.sleep(0)
    await rig.gateway.close()
    await rig.gateway.close()
    with pytest.raises(SuaveplanError) as info:
        await task
    assert info.value.code == "SAND_CANCELLED"
    with pytest.raises(SuaveplanError) as again:
        await rig.gateway.dispatch("fs", "read_bytes", {"path": "uploads/a.txt"})
    assert again.value.code == "SAND_CANCELLED"


async def test_every_decision_is_audited_with_rule_and_reason() -> None:
    rig = _Rig()
    await rig.gateway.dispatch("fs", "exists", {"path": "uploads/a.txt"})
    await rig.denied("fs", "exists", {"path": "etc/passwd"})
    ok, denied = rig.audit.records
    assert (ok.allowed, ok.rule, ok.operation) == (True, "./uploads/*", "exists")
    assert (denied.allowed, denied.reason, denied.resource) == (
        False,
        "path-not-in-allowlist",
        None,
    )


async def test_subscriptions_are_checked_and_closed_with_the_gateway() -> None:
    rig = _Rig()
    got: list[tuple[str, object]] = []

    async def handler(topic: str, payload: object) -> None:
        got.append((topic, payload))

    with pytest.raises(SuaveplanError):
        await rig.gateway.dispatch("events", "subscribe", {"topic": "gw.done"}, handler=handler)
    await rig.gateway.dispatch("events", "subscribe", {"topic": "other.*"}, handler=handler)
    await rig.events.publish("host", "other.ping", 1)
    assert got == [("other.ping", 1)]
    await rig.gateway.close()
    assert rig.events.subscriptions == []


async def test_names_a_guest_makes_up_are_labelled_unknown_in_metrics_and_audit() -> None:
    # Labels are series: a guest sending a new capability or operation name per request must
    # not add a metric series (or an audit value) per name.
    rig = _Rig()
    for i in range(20):
        await rig.denied(f"cap{i}", f"op{i}", {})
        await rig.denied("fs", f"op{i}", {"path": "uploads/a.txt"})
    series = {
        (name, labels.get("capability"), labels.get("operation"))
        for name, labels, _ in rig.metrics.samples()
    }
    assert {cap for _, cap, _ in series} == {"unknown", "fs"}
    assert rig.metrics.value(CAPABILITY_CALLS.name, capability="unknown", outcome="deny") == 20
    assert rig.metrics.value(CAPABILITY_CALLS.name, capability="fs", outcome="deny") == 20
    assert {(r.capability, r.operation) for r in rig.audit.records} == {
        ("unknown", "unknown"),
        ("fs", "unknown"),
    }
