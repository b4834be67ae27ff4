"""What a host plugs in behind the gateway: one protocol per capability.

Each method may be synchronous (`def ... -> T`) or asynchronous (`async def ... -> T`): the
protocols declare `T | Awaitable[T]`, which both satisfy, so a sync adapter type-checks
without a `cast`. The gateway awaits what is awaitable; a plain `def` is called inline by
`Gateway.dispatch_sync` (the WASM guest thread) and by `dispatch` alike. Code that calls an
adapter directly must handle both shapes (the union makes mypy insist on it).

Adapters are the only code that touches the world. They receive requests the checker has
already allowed, with the *normalised* target from the `Allow` (never the guest's raw input),
and they must stay safe anyway: symlinks, DNS and SQL engines are where sandboxes escape.
"""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeAlias, TypeVar, final

from suaveplan_sandbox.errors import WireValue

_T = TypeVar("_T")
MaybeAwaitable: TypeAlias = _T | Awaitable[_T]


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

    def read_bytes(self, path: str, *, max_bytes: int) -> MaybeAwaitable[bytes]: ...

    def write_bytes(self, path: str, data: bytes) -> MaybeAwaitable[None]: ...

    def list_dir(self, path: str) -> MaybeAwaitable[list[str]]: ...

    def exists(self, path: str) -> MaybeAwaitable[bool]: ...


class FetchAdapter(Protocol):
    """Outbound network: HTTP requests and (for WASM guests) raw TCP connections."""

    def request(self, request: HttpRequest) -> MaybeAwaitable[HttpResponse]: ...

    def connect(self, host: str, port: int, *, rule: str) -> MaybeAwaitable[socket.socket]:
        """A connected blocking TCP socket to a vetted address of `host`. Only called on Allow."""
        ...


class DbAdapter(Protocol):
    """The plugin's database. `sql` has passed the SQL gate; params are always bound."""

    def query(self, sql: str, params: Sequence[WireValue]) -> MaybeAwaitable[QueryResult]: ...


class SecretsAdapter(Protocol):
    """Secret values by declared name. Raises `SAND_SECRET_UNAVAILABLE` when absent."""

    def get(self, name: str) -> MaybeAwaitable[str]: ...


EventHandler = Callable[[str, WireValue], Awaitable[None]]


class Subscription(Protocol):
    """A live subscription. Optionally it also offers `on_lost(callback)`: a backend that can
    lose its server (`RedisEventBus`) calls `callback(error)` once when it does, and the
    gateway registers one to audit, count and report the loss."""

    def close(self) -> MaybeAwaitable[None]: ...


class EventsAdapter(Protocol):
    """Publish/subscribe. `pattern` is a manifest topic rule (`*` spans any characters)."""

    def publish(self, plugin: str, topic: str, payload: WireValue) -> MaybeAwaitable[None]: ...

    def subscribe(
        self, plugin: str, pattern: str, handler: EventHandler
    ) -> MaybeAwaitable[Subscription]: ...


class AuditSink(Protocol):
    """Where audit records go. Optionally it also offers `flush()`: a sink that holds some
    records back (`JsonLinesAudit` folds denials over its rate into summaries) writes them
    there, and the gateway calls it when it closes. And optionally `is_enabled() -> bool`:
    False while the sink would drop every record (`JsonLinesAudit` with its logger off for
    INFO), so the gateway builds none for it; asked on every request, so keep it cheap."""

    def record(self, entry: AuditRecord) -> None: ...


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Adapters:
    """The host adapters for one sandbox. A capability without an adapter fails closed.

    Any of them (and the audit sink) may optionally also offer `redaction_values() ->
    Iterable[str]`: the credentials it holds itself (a DSN's password, an API token it
    sends) that must never appear in diagnostics. A plain `def`, called once when the
    gateway is built, which adds each value to its redactor; a method that raises or
    returns anything but strings fails that construction (`PostgresDb` and `RedisEventBus`
    declare their passwords this way)."""

    fs: FsAdapter | None = None
    fetch: FetchAdapter | None = None
    db: DbAdapter | None = None
    secrets: SecretsAdapter | None = None
    events: EventsAdapter | None = None
