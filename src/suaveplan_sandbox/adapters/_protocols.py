"""What a host plugs in behind the gateway: one async protocol per capability.

Adapters are the only code that touches the world. They receive requests the checker has
already allowed, with the *normalised* target from the `Allow` (never the guest's raw input),
and they must stay safe anyway: symlinks, DNS and SQL engines are where sandboxes escape.
"""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, final

from suaveplan_sandbox.errors import WireValue


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class HttpRequest:
    """An allowed outbound HTTP request. `url` is the checker's serialised URL."""

    url: str
    method: str = "GET"
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""
    rule: str = ""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class HttpResponse:
    status: int
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class QueryResult:
    columns: tuple[str, ...] = ()
    rows: tuple[tuple[WireValue, ...], ...] = ()
    rowcount: int = -1


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class AuditRecord:
    """One capability decision, for the audit log. `resource` is only logged when enabled."""

    plugin: str
    capability: str
    operation: str
    allowed: bool
    reason: str | None
    rule: str | None
    duration_ms: float
    resource: str | None = None
    outcome: str = "ok"
    extra: dict[str, WireValue] = field(default_factory=dict)


class FsAdapter(Protocol):
    """Files beneath the policy root. `path` is root-relative and normalised (`uploads/a.txt`)."""

    async def read_bytes(self, path: str, *, max_bytes: int) -> bytes: ...

    async def write_bytes(self, path: str, data: bytes) -> None: ...

    async def list_dir(self, path: str) -> list[str]: ...

    async def exists(self, path: str) -> bool: ...


class FetchAdapter(Protocol):
    """Outbound network: HTTP requests and (for WASM guests) raw TCP connections."""

    async def request(self, request: HttpRequest) -> HttpResponse: ...

    async def connect(self, host: str, port: int, *, rule: str) -> socket.socket:
        """A connected blocking TCP socket to a vetted address of `host`. Only called on Allow."""
        ...


class DbAdapter(Protocol):
    """The plugin's database. `sql` has passed the SQL gate; params are always bound."""

    async def query(self, sql: str, params: Sequence[WireValue]) -> QueryResult: ...


class SecretsAdapter(Protocol):
    """Secret values by declared name. Raises `SAND_SECRET_UNAVAILABLE` when absent."""

    async def get(self, name: str) -> str: ...


EventHandler = Callable[[str, WireValue], Awaitable[None]]


class Subscription(Protocol):
    async def close(self) -> None: ...


class EventsAdapter(Protocol):
    """Publish/subscribe. `pattern` is a manifest topic rule (`*` spans any characters)."""

    async def publish(self, plugin: str, topic: str, payload: WireValue) -> None: ...

    async def subscribe(self, plugin: str, pattern: str, handler: EventHandler) -> Subscription: ...


class AuditSink(Protocol):
    def record(self, entry: AuditRecord) -> None: ...


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Adapters:
    """The host adapters for one sandbox. A capability without an adapter fails closed."""

    fs: FsAdapter | None = None
    fetch: FetchAdapter | None = None
    db: DbAdapter | None = None
    secrets: SecretsAdapter | None = None
    events: EventsAdapter | None = None
