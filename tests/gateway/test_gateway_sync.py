"""`Gateway.dispatch_sync`: the same decisions, audit rows, metrics and errors as `dispatch`.

Every case runs three ways against fresh rigs: `await dispatch(...)` with the async fakes
(the reference), `dispatch_sync(...)` from a worker thread with the async fakes reached through
`run_coroutine`, and `dispatch_sync(...)` with synchronous adapters and no event loop at all.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import pytest

from suaveplan_sandbox.adapters import (
    Adapters,
    EventHandler,
    HttpRequest,
    HttpResponse,
)
from suaveplan_sandbox.errors import SuaveplanError, WireValue
from suaveplan_sandbox.gateway import Gateway
from suaveplan_sandbox.metrics import InMemoryMetrics
from suaveplan_sandbox.permissions import Deny, PermissionChecker, PermissionPolicy
from suaveplan_sandbox.testing import (
    DictSecrets,
    FakeClock,
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


class _Synchronous:
    """An async in-memory fake's methods as plain functions (the fakes never suspend)."""

    def __init__(self, inner: object) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Callable[..., object]:
        method = getattr(self.inner, name)

        def call(*args: object, **kwargs: object) -> object:
            coro = method(*args, **kwargs)
            try:
                coro.send(None)
            except StopIteration as stop:
                return stop.value
            coro.close()
            raise AssertionError(f"{name} suspended")

        return call


class _ExplodingSecrets:
    def get(self, name: str) -> str:
        raise OSError(f"vault at /srv/vault refused {name}")


@dataclass
class _Rig:
    sync_adapters: bool = False
    omit: str | None = None
    metrics: InMemoryMetrics = field(default_factory=InMemoryMetrics)
    audit: RecordingAudit = field(default_factory=RecordingAudit)
    denials: list[tuple[str, str, str]] = field(default_factory=list)
    fs: InMemoryFs = field(default_factory=lambda: InMemoryFs({"uploads/a.txt": b"hello"}))
    fetch: FakeFetch = field(
        default_factory=lambda: FakeFetch({"https://api.example.com/v1": HttpResponse(status=200)})
    )
    db: FakeDb = field(default_factory=FakeDb)
    secrets: DictSecrets = field(default_factory=lambda: DictSecrets({"TOKEN": "t", "OTHER": "x"}))
    events: InMemoryEvents = field(default_factory=InMemoryEvents)

    def __post_init__(self) -> None:
        policy = PermissionPolicy.from_manifest(MANIFEST, root="/srv/gw")
        checker = PermissionChecker(policy, metrics=self.metrics)
        wrap: Callable[[object], Any] = _Synchronous if self.sync_adapters else (lambda a: a)
        given: dict[str, Any] = {
            "fs": wrap(self.fs),
            "fetch": self.fetch,  # always async: exercises run_coroutine next to sync adapters
            "db": wrap(self.db),
            "secrets": wrap(self.secrets),
            "events": wrap(self.events),
        }
        if self.omit is not None:
            given[self.omit] = None
        self.gateway = Gateway(
            checker=checker,
            adapters=Adapters(**given),
            audit=self.audit,
            clock=FakeClock(),
            max_write_bytes=8,
            on_denial=self._denied,
        )

    def _denied(self, deny: Deny, cap: str, op: str) -> None:
        self.denials.append((deny.reason.value, cap, op))

    def observed(self, outcome: object) -> tuple[object, ...]:
        return (
            outcome,
            self.audit.records,
            self.metrics.samples(),
            self.denials,
            self.fs.calls,
            self.fetch.requests,
            self.db.queries,
            self.secrets.requested,
            self.events.published,
        )


def _outcome(fn: Callable[[], object]) -> object:
    try:
        return ("ok", fn())
    except SuaveplanError as exc:
        return ("error", exc.code, exc.details)


async def _outcome_async(coro: Coroutine[Any, Any, object]) -> object:
    try:
        return ("ok", await coro)
    except SuaveplanError as exc:
        return ("error", exc.code, exc.details)


CASES: list[tuple[str, object, object, object, str | None]] = [
    ("allowed read", "fs", "read_bytes", {"path": "/uploads/x/../a.txt"}, None),
    ("read of a missing file", "fs", "read_bytes", {"path": "uploads/none"}, None),
    ("allowed write", "fs", "write_bytes", {"path": "out/r.txt", "data": b"ok"}, None),
    ("write without rw", "fs", "write_bytes", {"path": "uploads/a.txt", "data": b"x"}, None),
    ("write over the limit", "fs", "write_bytes", {"path": "out/r", "data": b"x" * 9}, None),
    ("list dir", "fs", "list_dir", {"path": "uploads"}, None),
    ("exists", "fs", "exists", {"path": "uploads/a.txt"}, None),
    ("escaping path", "fs", "exists", {"path": "../etc/passwd"}, None),
    ("allowed fetch", "fetch", "request", {"url": "https://API.example.com/v1"}, None),
    ("denied fetch", "fetch", "request", {"url": "https://evil.example/"}, None),
    ("bad method", "fetch", "request", {"url": "https://api.example.com/", "method": "X"}, None),
    ("allowed db", "db", "query", {"sql": "SELECT * FROM gw_t WHERE a = ?", "params": [1]}, None),
    ("denied db", "db", "query", {"sql": "SELECT * FROM users"}, None),
    ("allowed secret", "secrets", "get", {"name": "TOKEN"}, None),
    ("undeclared secret", "secrets", "get", {"name": "OTHER"}, None),
    ("allowed publish", "events", "publish", {"topic": "gw.done", "payload": {"n": 1}}, None),
    ("denied publish", "events", "publish", {"topic": "other.x", "payload": 1}, None),
    ("subscribe without a handler", "events", "subscribe", {"topic": "other.x"}, None),
    ("unknown capability", "shell", "run", {}, None),
    ("non-mapping args", "fs", "read_bytes", "uploads/a.txt", None),
    ("non-str capability", None, None, None, None),
    ("missing adapter", "secrets", "get", {"name": "TOKEN"}, "secrets"),
]


@pytest.mark.parametrize(
    ("cap", "op", "args", "omit"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
async def test_dispatch_sync_matches_dispatch_for_the_same_request(
    cap: object, op: object, args: object, omit: str | None
) -> None:
    loop = asyncio.get_running_loop()

    def on_loop(coro: Coroutine[Any, Any, object]) -> object:
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    reference = _Rig(omit=omit)
    expected = reference.observed(await _outcome_async(reference.gateway.dispatch(cap, op, args)))

    via_loop = _Rig(omit=omit)
    got = await asyncio.to_thread(
        _outcome, lambda: via_loop.gateway.dispatch_sync(cap, op, args, run_coroutine=on_loop)
    )
    assert via_loop.observed(got) == expected

    inline = _Rig(sync_adapters=True, omit=omit)
    needs_loop = cap == "fetch"
    got = await asyncio.to_thread(
        _outcome,
        lambda: inline.gateway.dispatch_sync(
            cap, op, args, run_coroutine=on_loop if needs_loop else None
        ),
    )
    assert inline.observed(got) == expected


def test_sync_adapter_is_called_on_the_calling_thread_without_an_event_loop() -> None:
    rig = _Rig(sync_adapters=True)
    threads: list[int] = []
    original = rig.secrets.get

    async def get(name: str) -> str:
        threads.append(threading.get_ident())
        return await original(name)

    rig.secrets.get = get  # type: ignore[method-assign]
    assert rig.gateway.dispatch_sync("secrets", "get", {"name": "TOKEN"}) == "t"
    assert threads == [threading.get_ident()]
    assert rig.audit.records[-1].outcome == "ok"


def test_async_adapter_without_run_coroutine_fails_closed_and_is_never_invoked() -> None:
    rig = _Rig()
    with pytest.raises(SuaveplanError) as info:
        rig.gateway.dispatch_sync("secrets", "get", {"name": "TOKEN"})
    assert info.value.code == "SAND_ADAPTER_FAILED"
    assert rig.secrets.requested == []
    assert rig.audit.records[-1].outcome == "error:SAND_ADAPTER_FAILED"


def test_sync_adapter_failure_is_translated_without_host_detail() -> None:
    rig = _Rig()
    gateway = Gateway(
        checker=rig.gateway.checker,
        adapters=Adapters(secrets=_ExplodingSecrets()),
        audit=rig.audit,
    )
    with pytest.raises(SuaveplanError) as info:
        gateway.dispatch_sync("secrets", "get", {"name": "TOKEN"})
    assert info.value.code == "SAND_ADAPTER_FAILED"
    assert info.value.cause is None
    assert "/srv/vault" not in repr(info.value.to_wire())
    assert rig.audit.records[-1].outcome == "error:SAND_ADAPTER_FAILED"


def test_denied_request_never_reaches_a_sync_adapter() -> None:
    rig = _Rig(sync_adapters=True)
    with pytest.raises(SuaveplanError) as info:
        rig.gateway.dispatch_sync("secrets", "get", {"name": "OTHER"})
    assert info.value.code == "SAND_PERM_DENIED"
    assert info.value.details == {"capability": "secrets", "reason": "secret-not-declared"}
    assert rig.secrets.requested == []
    assert rig.denials == [("secret-not-declared", "secrets", "get")]


def test_socket_from_a_sync_connect_is_closed_when_the_gateway_closed_meanwhile() -> None:
    made: list[socket.socket] = []
    rig = _Rig()

    class ClosingFetch:
        def request(self, request: HttpRequest) -> HttpResponse:
            raise AssertionError("not called")

        def connect(self, host: str, port: int, *, rule: str) -> socket.socket:
            ours, theirs = socket.socketpair()
            theirs.close()
            made.append(ours)
            gateway.close_nowait()  # the host disposes while the adapter is connecting
            return ours

    gateway = Gateway(
        checker=rig.gateway.checker,
        adapters=Adapters(fetch=ClosingFetch()),
        audit=rig.audit,
    )
    with pytest.raises(SuaveplanError) as info:
        gateway.dispatch_sync("fetch", "connect", {"host": "api.example.com", "port": 443})
    assert info.value.code == "SAND_CANCELLED"
    assert made[0].fileno() == -1, "the socket handed back after close was left open"
    assert rig.audit.records[-1].outcome == "error:SAND_CANCELLED"


async def test_close_cancels_an_async_adapter_call_made_through_dispatch_sync() -> None:
    loop = asyncio.get_running_loop()
    rig = _Rig(fs=InMemoryFs({"uploads/a.txt": b"x"}, delay=30))

    def on_loop(coro: Coroutine[Any, Any, object]) -> object:
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    call = asyncio.ensure_future(
        asyncio.to_thread(
            _outcome,
            lambda: rig.gateway.dispatch_sync(
                "fs", "read_bytes", {"path": "uploads/a.txt"}, run_coroutine=on_loop
            ),
        )
    )
    while rig.gateway.inflight == 0:
        await asyncio.sleep(0.001)
    await rig.gateway.close()
    assert await asyncio.wait_for(call, 5) == ("error", "SAND_CANCELLED", {})
    assert _outcome(lambda: rig.gateway.dispatch_sync("fs", "exists", {"path": "uploads"})) == (
        "error",
        "SAND_CANCELLED",
        {},
    )


async def test_async_dispatch_also_accepts_a_sync_adapter() -> None:
    rig = _Rig(sync_adapters=True)
    assert await rig.gateway.dispatch("secrets", "get", {"name": "TOKEN"}) == "t"
    assert await rig.gateway.dispatch("fs", "list_dir", {"path": "uploads"}) == ["a.txt"]
    assert [r.outcome for r in rig.audit.records] == ["ok", "ok"]


async def test_plain_def_events_adapter_and_subscription_type_check_and_close(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Sync `subscribe` and sync `Subscription.close` satisfy the protocols (no `cast`) and
    the gateway's `close()` closes such a subscription without awaiting it."""
    rig = _Rig()
    closed: list[str] = []

    class SyncSubscription:
        def close(self) -> None:
            closed.append("closed")

    class SyncBus:
        def publish(self, plugin: str, topic: str, payload: WireValue) -> None:
            raise AssertionError("not called")

        def subscribe(self, plugin: str, pattern: str, handler: EventHandler) -> SyncSubscription:
            return SyncSubscription()

    async def handler(topic: str, payload: WireValue) -> None:
        return None

    gateway = Gateway(
        checker=rig.gateway.checker, adapters=Adapters(events=SyncBus()), audit=rig.audit
    )
    assert (
        await gateway.dispatch("events", "subscribe", {"topic": "other.x"}, handler=handler) is None
    )
    assert closed == []
    await gateway.close()
    assert closed == ["closed"]
    assert [r.getMessage() for r in caplog.records if r.name.startswith("suaveplan")] == []
    assert rig.audit.records[-1].outcome == "ok"
