"""In-memory adapters for all five capabilities, recording every call they receive, and an
audit sink that keeps every record.

Hosts use them to test their integration without a filesystem, network or database; our
own suite uses them to prove that a denied request never reaches an adapter.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import final

from suaveplan_sandbox.adapters._events import decode_payload, encode_payload
from suaveplan_sandbox.adapters._protocols import (
    AuditRecord,
    EventHandler,
    HttpRequest,
    HttpResponse,
    QueryResult,
)
from suaveplan_sandbox.errors import SuaveplanError, WireValue
from suaveplan_sandbox.permissions._topic_rules import topic_matches


@final
class InMemoryFs:
    """Files in a dict keyed by root-relative path (`uploads/a.txt`). `delay` simulates slow I/O."""

    def __init__(self, files: Mapping[str, bytes] | None = None, *, delay: float = 0.0) -> None:
        self.files: dict[str, bytes] = dict(files or {})
        self.delay = delay
        self.calls: list[tuple[str, str]] = []

    async def _pause(self) -> None:
        if self.delay:
            await asyncio.sleep(self.delay)

    async def read_bytes(self, path: str, *, max_bytes: int) -> bytes:
        self.calls.append(("read_bytes", path))
        await self._pause()
        if path not in self.files:
            raise SuaveplanError("SAND_FS_NOT_FOUND", "no such file")
        data = self.files[path]
        if len(data) > max_bytes:
            raise SuaveplanError("SAND_FS_TOO_LARGE", "file exceeds the read limit")
        return data

    async def write_bytes(self, path: str, data: bytes) -> None:
        self.calls.append(("write_bytes", path))
        await self._pause()
        self.files[path] = bytes(data)

    async def list_dir(self, path: str) -> list[str]:
        self.calls.append(("list_dir", path))
        await self._pause()
        prefix = "" if path == "." else path.rstrip("/") + "/"
        names = {p[len(prefix) :].split("/", 1)[0] for p in self.files if p.startswith(prefix)}
        if not names:
            raise SuaveplanError("SAND_FS_NOT_FOUND", "no such directory")
        return sorted(names)

    async def exists(self, path: str) -> bool:
        self.calls.append(("exists", path))
        await self._pause()
        prefix = path.rstrip("/") + "/"
        return path in self.files or any(p.startswith(prefix) for p in self.files)


FetchHandler = Callable[[HttpRequest], HttpResponse]


@final
class FakeFetch:
    """Answers from a `{url: HttpResponse}` map or a handler; `connect` returns a socketpair end."""

    def __init__(
        self,
        responses: Mapping[str, HttpResponse] | None = None,
        *,
        handler: FetchHandler | None = None,
        delay: float = 0.0,
    ) -> None:
        self.responses = dict(responses or {})
        self.handler = handler
        self.delay = delay
        self.requests: list[HttpRequest] = []
        self.connects: list[tuple[str, int]] = []
        self.peers: list[socket.socket] = []

    async def request(self, request: HttpRequest) -> HttpResponse:
        self.requests.append(request)
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.handler is not None:
            return self.handler(request)
        response = self.responses.get(request.url)
        if response is None:
            return HttpResponse(status=404, headers=(("content-type", "text/plain"),), body=b"")
        return response

    async def connect(self, host: str, port: int, *, rule: str) -> socket.socket:
        """Record the connect and return one end of a socketpair; the other is in `peers`."""
        self.connects.append((host, port))
        ours, theirs = socket.socketpair()
        self.peers.append(theirs)
        return ours

    def close(self) -> None:
        for peer in self.peers:
            peer.close()
        self.peers.clear()


QueryHandler = Callable[[str, Sequence[WireValue]], QueryResult]


@final
class FakeDb:
    """Records queries and answers them with `handler` (default: no rows)."""

    def __init__(self, handler: QueryHandler | None = None, *, delay: float = 0.0) -> None:
        self.handler = handler
        self.delay = delay
        self.queries: list[tuple[str, tuple[WireValue, ...]]] = []

    async def query(self, sql: str, params: Sequence[WireValue]) -> QueryResult:
        self.queries.append((sql, tuple(params)))
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.handler is not None:
            return self.handler(sql, params)
        return QueryResult(columns=(), rows=(), rowcount=0)


@final
class DictSecrets:
    """Secrets from a dict. `requested` records names asked for (never values)."""

    def __init__(self, values: Mapping[str, str] | None = None) -> None:
        self._values = dict(values or {})
        self.requested: list[str] = []

    def __repr__(self) -> str:
        return f"DictSecrets(names={sorted(self._values)!r})"

    async def get(self, name: str) -> str:
        self.requested.append(name)
        try:
            return self._values[name]
        except KeyError:
            raise SuaveplanError(
                "SAND_SECRET_UNAVAILABLE", "the host has no value for this secret"
            ) from None


@dataclass(eq=False)
class _FakeSubscription:
    bus: InMemoryEvents
    plugin: str
    pattern: str
    handler: EventHandler
    closed: bool = field(default=False)

    async def close(self) -> None:
        self.closed = True
        if self in self.bus.subscriptions:
            self.bus.subscriptions.remove(self)


@final
class InMemoryEvents:
    """An in-process bus recording publishes; delivers to matching subscribers in order."""

    def __init__(self) -> None:
        self.published: list[tuple[str, str, WireValue]] = []
        self.subscriptions: list[_FakeSubscription] = []

    async def publish(self, plugin: str, topic: str, payload: WireValue) -> None:
        # The same payload rule as the real buses: strict JSON or SAND_INVALID_ARGUMENT, and
        # every subscriber (and the record) gets its own copy, so a host tested against this
        # fake meets the production behaviour.
        data = encode_payload(payload)
        self.published.append((plugin, topic, decode_payload(data)))
        for sub in list(self.subscriptions):
            if topic_matches(sub.pattern, topic):
                await sub.handler(topic, decode_payload(data))

    async def subscribe(
        self, plugin: str, pattern: str, handler: EventHandler
    ) -> _FakeSubscription:
        sub = _FakeSubscription(self, plugin, pattern, handler)
        self.subscriptions.append(sub)
        return sub


@final
class RecordingAudit:
    """An `AuditSink` that keeps every record it is given, in order, in `records`."""

    def __init__(self) -> None:
        self.records: list[AuditRecord] = []

    def record(self, entry: AuditRecord) -> None:
        self.records.append(entry)
