"""The one choke point: every guest capability request, from any host, goes through `dispatch`.

Theory of operation: `dispatch(capability, operation, args)` validates the operation against
a closed table, asks the `PermissionChecker` (which counts every denial), and only on `Allow`
calls the adapter with the checker's normalised target. Adapter failures are translated here
into coded errors that carry no host detail outward. The failure is logged redaction-safe
(`_log_failure`): exception type, plugin, capability, operation and a correlation id (also in
the error's details and the audit row), never the exception's text; the traceback goes, as
scrubbed text, only to the `suaveplan_sandbox.gateway.traceback` logger at DEBUG, which an
operator enables. Every secret value the gateway has handed out is scrubbed from that text,
and no log record holds the exception or its frames (which for WASM run through the guest
thread and would keep a disposed sandbox alive). So is every credential the host holds
itself: what its adapters and audit sink declare with `redaction_values()` (collected once,
at construction) and what it passes as `redact=`. `close()` cancels every in-flight adapter
call, makes later dispatches fail with `SAND_CANCELLED` and has the audit sink write what it
held back (`flush()`, for a sink that has one); it is idempotent.

`dispatch_sync` is the same request without a task: validation, the decision, the audit
record, metrics and `on_denial` run inline on the calling thread, and so does the adapter when
its method is synchronous (a plain `def`). Only an async adapter needs the event loop; the
caller says how to reach it with `run_coroutine` (the WASM host blocks its guest thread on
the loop). `dispatch_eager` is the VM host's: the same request started inline on the loop,
finished inline when the adapter never suspends (no task at all) and in a task otherwise.
All entry points share `_admit` and `_finish`, so for the same inputs they produce the same
results, errors, audit rows and metrics.

An `fs.list_dir` result is filtered to the names the plugin may read. A listing longer than
`_INLINE_LIST_ENTRIES` is filtered on a worker thread (`_OffLoop`), never on the loop, which
every sandbox of the host shares; `dispatch_eager` then finishes it in a task, and
`dispatch_sync`, whose thread may block, filters it in place. The filter is the same function
everywhere (`FsRuleSet.readable_entries`), so where it runs never changes the names.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import socket
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence, Sized
from types import CoroutineType, MappingProxyType
from typing import TYPE_CHECKING, Any, Final, NamedTuple, TypeGuard, final

from suaveplan_sandbox.adapters._protocols import (
    Adapters,
    AuditRecord,
    AuditSink,
    EventHandler,
    HttpRequest,
    HttpResponse,
    QueryResult,
    Subscription,
)
from suaveplan_sandbox.adapters._ready import Ready
from suaveplan_sandbox.errors import SuaveplanError, WireValue
from suaveplan_sandbox.errors._failure_log import log_failure
from suaveplan_sandbox.errors._redact import SecretRedactor
from suaveplan_sandbox.gateway._eager import Finished, start_eagerly
from suaveplan_sandbox.metrics import CAPABILITY_CALLS
from suaveplan_sandbox.permissions._clock import Clock, MonotonicClock
from suaveplan_sandbox.permissions._decision import Allow, Deny, DenyReason

if TYPE_CHECKING:
    from suaveplan_sandbox.permissions._checker import PermissionChecker

_log = logging.getLogger("suaveplan_sandbox.gateway")
# Operator-enabled (DEBUG): scrubbed traceback text of adapter failures.
_trace_log = logging.getLogger("suaveplan_sandbox.gateway.traceback")

DEFAULT_MAX_READ_BYTES: Final = 16 * 1024 * 1024
DEFAULT_MAX_WRITE_BYTES: Final = 16 * 1024 * 1024
_MAX_HEADERS: Final = 128
# A listing of at most this many names is filtered on the calling thread; a longer one on a
# worker thread (`_OffLoop`). Filtering costs 0.3-2.5 us a name (a `dir/*` rule covers every
# name at once; a per-name rule is a match each), so this many hold the loop ~2.5 ms at worst,
# while a thread hop costs ~50 us: small listings, the common ones, stay inline.
_INLINE_LIST_ENTRIES: Final = 1024
_MAX_PARAMS: Final = 999
_METHODS: Final = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

# (capability, operation) -> fs mode. The table is the allowlist: anything else is denied.
_OPERATIONS: Final = frozenset(
    {
        ("fs", "read_bytes"),
        ("fs", "write_bytes"),
        ("fs", "list_dir"),
        ("fs", "exists"),
        ("fetch", "request"),
        ("fetch", "connect"),
        ("db", "query"),
        ("secrets", "get"),
        ("events", "publish"),
        ("events", "subscribe"),
    }
)

_CAPABILITIES: Final = frozenset(c for c, _ in _OPERATIONS)

DenialListener = Callable[[Deny, str, str], None]
# (the subscribed topic rule, the coded error) when a subscription's backend is lost.
SubscriptionLostListener = Callable[[str, SuaveplanError], None]
RunCoroutine = Callable[[Coroutine[Any, Any, object]], object]


class _Malformed(Exception):
    """Internal: the request's arguments have the wrong shape."""


class _NeedsLoop(Exception):
    """Internal: `dispatch_sync` met an async adapter and has no `run_coroutine`."""


class _AdapterCancelled(Exception):
    """Internal: the adapter raised CancelledError itself, with nobody cancelling it."""


def _plain(raw: object) -> object:
    return raw


@final
class _OffLoop:
    """What a `shape` returns when its result costs too much to compute on the event loop:
    `work()` computes it. The async paths run it on a worker thread (`asyncio.to_thread`);
    `dispatch_sync`, on a thread that may block anyway, runs it in place. Either way the
    result is `work()`'s, so where it runs changes latency, never the answer."""

    __slots__ = ("work",)

    def __init__(self, work: Callable[[], object]) -> None:
        self.work = work


_NO_KWARGS: Final[Mapping[str, object]] = MappingProxyType({})
_CALLS: Final = CAPABILITY_CALLS.name
# Adapter results that are never awaitable: skips the ABC check on the hot path.
_PLAIN_RESULTS: Final = (str, bytes, bool, int, float, list, dict, tuple, type(None))


def _awaitable(raw: object) -> TypeGuard[Awaitable[object]]:
    return not isinstance(raw, _PLAIN_RESULTS) and inspect.isawaitable(raw)


def _always() -> bool:
    return True


def _host_values(redact: object) -> list[str]:
    """`redact=` as a list of str, or `SAND_INVALID_ARGUMENT` (never echoing a value)."""
    if isinstance(redact, str | bytes | bytearray) or not isinstance(redact, Iterable):
        # One string would be taken character by character: refused, not guessed at.
        raise SuaveplanError(
            "SAND_INVALID_ARGUMENT",
            "redact= is an iterable of str (the values to keep out of diagnostics)",
            {"argument": "redact", "type": type(redact).__name__},
        )
    values = []
    for index, item in enumerate(redact):
        if not isinstance(item, str):
            raise SuaveplanError(
                "SAND_INVALID_ARGUMENT",
                "every redact= item is a str",
                {"argument": "redact", "index": index, "type": type(item).__name__},
            )
        values.append(str.__str__(item))  # a plain str: the redactor ignores subclasses
    return values


def _adapter_slots(adapters: Adapters) -> tuple[tuple[str, object], ...]:
    return (
        ("fs", adapters.fs),
        ("fetch", adapters.fetch),
        ("db", adapters.db),
        ("secrets", adapters.secrets),
        ("events", adapters.events),
    )


def _str_items(values: object) -> list[str] | None:
    """`values` as a list of plain str; None unless it is an iterable of str (one str is not)."""
    if isinstance(values, str | bytes | bytearray) or not isinstance(values, Iterable):
        return None
    items = list(values)
    if not all(isinstance(item, str) for item in items):
        return None
    return [str.__str__(item) for item in items]  # plain str: the redactor ignores subclasses


def _declared_values(name: str, adapter: object) -> list[str]:
    """The credentials `adapter` declares with its optional `redaction_values()`.

    Fails closed: a host whose adapter declares credentials expects them scrubbed, and a
    sandbox running without them would write them, unnoticed, into the first traceback that
    holds one. So a method that raises, or returns anything but an iterable of str (a
    coroutine, one str), fails the gateway's construction: a `SuaveplanError` as it is,
    anything else as `SAND_ADAPTER_FAILED` naming the exception's type only (its text may
    hold the very credential that could not be collected, and nothing can scrub that yet).
    """
    method = getattr(adapter, "redaction_values", None)
    if adapter is None or not callable(method):
        return []
    details: dict[str, WireValue] = {"capability": name, "operation": "redaction_values"}
    try:
        values = method()
        if _awaitable(values):
            if inspect.iscoroutine(values):
                values.close()  # refused unawaited: no "never awaited" warning
            details["reason"] = "not-synchronous"
        else:
            declared = _str_items(values)
            if declared is not None:
                return declared
            details["reason"] = "not-an-iterable-of-str"
    except SuaveplanError:
        raise
    except Exception as exc:
        details["error_type"] = type(exc).__name__
    raise SuaveplanError(
        "SAND_ADAPTER_FAILED",
        f"the host's {name} adapter could not state the credentials it holds",
        details,
    )


class _AdapterCall(NamedTuple):
    """One allowed adapter invocation: `adapters.<capability>.<method>(*args, **kwargs)`.

    `shape` turns the adapter's return value into the plain data the guest gets (or into an
    `_OffLoop`, when that is too costly for the loop). Building the call is separate from
    running it so one decision can run inline or as a task.
    (A NamedTuple: it is built on every request, and a frozen dataclass costs more.)
    """

    capability: str
    method: str
    args: tuple[object, ...]
    kwargs: Mapping[str, object] = _NO_KWARGS
    shape: Callable[[Any], object] = _plain


@final
class Gateway:
    """Checker first, adapter only on Allow. One instance per sandbox.

    `redact`: credentials the host holds itself (an iterable of str; anything else is
    `SAND_INVALID_ARGUMENT`), scrubbed with those its adapters state (`Adapters`)."""

    def __init__(
        self,
        *,
        checker: PermissionChecker,
        adapters: Adapters,
        audit: AuditSink | None = None,
        clock: Clock | None = None,
        max_read_bytes: int = DEFAULT_MAX_READ_BYTES,
        max_write_bytes: int = DEFAULT_MAX_WRITE_BYTES,
        on_denial: DenialListener | None = None,
        on_subscription_lost: SubscriptionLostListener | None = None,
        redact: Iterable[str] = (),
    ) -> None:
        self._checker = checker
        # Both fixed for the checker's lifetime; read on every request.
        self._plugin = checker.plugin
        self._metrics = checker.metrics
        self._adapters = adapters
        self._audit = audit
        # A sink may say it would drop every record now (`is_enabled()`: JsonLinesAudit
        # whose logger is off for INFO); then no record is built for it.
        probe = getattr(audit, "is_enabled", None)
        self._audit_on: Callable[[], bool] = probe if callable(probe) else _always
        self._clock = clock or MonotonicClock()
        self._max_read = max_read_bytes
        self._max_write = max_write_bytes
        self._on_denial = on_denial
        self._on_subscription_lost = on_subscription_lost
        self._inflight: set[asyncio.Future[object]] = set()
        self._subscriptions: list[Subscription] = []
        self._async_methods: dict[object, bool] = {}
        # Every secret value handed out, and every credential the host declared: scrubbed
        # from tracebacks and audit resources, and (through `redactor`) from the VM host's
        # plugin errors and log lines.
        self._secrets = SecretRedactor()
        for value in _host_values(redact):
            self._secrets.add(value)
        for name, adapter in (*_adapter_slots(adapters), ("audit", audit)):
            for value in _declared_values(name, adapter):
                self._secrets.add(value)
        self._closed = False

    @property
    def redactor(self) -> SecretRedactor:
        """The secret values this gateway has handed out, to keep out of diagnostics."""
        return self._secrets

    @property
    def checker(self) -> PermissionChecker:
        return self._checker

    @property
    def plugin(self) -> str:
        return self._plugin

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    async def dispatch(
        self,
        capability: object,
        operation: object,
        args: object,
        *,
        handler: EventHandler | None = None,
    ) -> object:
        """Run one capability request. Returns plain data (or a socket for `fetch.connect`).

        Raises `SuaveplanError`: `SAND_PERM_DENIED` on deny, `SAND_ADAPTER_MISSING`,
        `SAND_ADAPTER_FAILED`, `SAND_CANCELLED`, or a coded error the adapter raised itself.
        """
        started, cap, op, decision, call = self._admit(capability, operation, args, handler)
        return await self._settle(cap, op, decision, started, lambda: self._run(self._invoke, call))

    def dispatch_sync(
        self,
        capability: object,
        operation: object,
        args: object,
        *,
        run_coroutine: RunCoroutine | None = None,
    ) -> object:
        """`dispatch` without a task, for callers on a thread that may block.

        The checker, audit sink, metrics and `on_denial` run on the calling thread, and a
        synchronous adapter method is called right here. An async adapter is run by
        `run_coroutine(coro)` (which must run the coroutine on the gateway's event loop and
        return its result or raise its exception); without one it fails closed with
        `SAND_ADAPTER_FAILED`. Raises what `dispatch` raises for the same inputs. There is
        no `handler`, so `events.subscribe` is denied `malformed-payload`, as it is by
        `dispatch` without one. A synchronous adapter call cannot be cancelled by `close()`;
        if the gateway was closed meanwhile its result is dropped (a socket is closed) and
        `SAND_CANCELLED` is raised.
        """
        started, cap, op, decision, call = self._admit(capability, operation, args, None)
        try:
            result = self._run_sync(call, run_coroutine)
        except SuaveplanError as exc:
            self._finish(cap, op, decision, started, outcome="error", code=exc.code)
            raise
        except Exception as exc:
            raise self._adapter_failed(cap, op, decision, started, exc) from None
        self._finish(cap, op, decision, started, outcome="ok", code=None)
        return result

    def dispatch_eager(
        self, capability: object, operation: object, args: object
    ) -> tuple[bool, object]:
        """`dispatch` started inline, for a caller running on the gateway's event loop.

        Validation, the decision and `on_denial` run right here, with no task; so does a
        synchronous adapter method. A coroutine adapter always runs inside an `asyncio.Task`,
        because `asyncio.timeout`, task groups and anyio cancel scopes (httpx) need a current
        task and the VM host calls this from a socket callback, where none is running. That
        task starts eagerly (`start_eagerly`: `eager_start=True` from Python 3.12, the same
        done by hand on 3.11): its first step runs here, so an adapter that never suspends is
        answered without a trip round the loop.
        `(True, result)`: the request completed here (its audit row and metrics are written;
        errors are raised here, as `dispatch` raises them). `(False, task)`: the `asyncio.Task`
        finishes the same request with the same result, errors, audit row and metrics as
        `dispatch`, and `close()` cancels it (`SAND_CANCELLED`). No `handler`:
        `events.subscribe` is denied `malformed-payload`, as by `dispatch` without one.
        """
        started, cap, op, decision, call = self._admit(capability, operation, args, None)
        task: asyncio.Task[object] | Finished | None = None
        result: object = None
        try:
            try:
                raw = self._method(call)(*call.args, **call.kwargs)
                if type(raw) is Ready:
                    result = call.shape(raw.value)  # answered already: no task needed
                elif type(raw) is CoroutineType or _awaitable(raw):
                    # The task settles the request itself (audit row, metrics, errors).
                    task = start_eagerly(
                        self._settle(cap, op, decision, started, lambda: self._in_task(call, raw))
                    )
                else:
                    result = call.shape(raw)
                if type(result) is _OffLoop:
                    # Too long to shape on the loop (a big listing): a task waits for the
                    # worker thread, and settles the request as above.
                    off_loop = functools.partial(self._off_loop, call, result)
                    task = start_eagerly(self._settle(cap, op, decision, started, off_loop))
            except asyncio.CancelledError:
                raise _AdapterCancelled from None  # nobody can have cancelled an inline call
        except SuaveplanError as exc:
            self._finish(cap, op, decision, started, outcome="error", code=exc.code)
            raise
        except Exception as exc:
            raise self._adapter_failed(cap, op, decision, started, exc) from None
        if type(task) is Finished:
            return True, task.result()  # `_settle` wrote its audit row and metrics
        if task is not None:
            return False, task
        self._finish(cap, op, decision, started, outcome="ok", code=None)
        return True, result

    async def _in_task(self, call: _AdapterCall, raw: Awaitable[object]) -> object:
        """Await an adapter's awaitable in the current task, which `close()` can cancel."""
        task = asyncio.current_task()
        assert task is not None  # only ever awaited by the task `start_eagerly` made
        if self._closed:  # closed before this task first ran: the adapter never starts
            if inspect.iscoroutine(raw):
                raw.close()
            raise SuaveplanError("SAND_CANCELLED", "the sandbox was disposed")
        self._inflight.add(task)
        try:
            result = call.shape(await raw)
            if type(result) is _OffLoop:  # inline, not a helper: this is every request's path
                result = await asyncio.to_thread(result.work)
            return result
        except asyncio.CancelledError:
            if self._closed:
                task.uncancel()  # the cancellation was ours, and it is answered as an error
                raise SuaveplanError("SAND_CANCELLED", "the sandbox was disposed") from None
            if not task.cancelling():
                raise _AdapterCancelled from None  # the adapter's own CancelledError
            raise
        finally:
            self._inflight.discard(task)

    def _off_loop(self, call: _AdapterCall, shaped: _OffLoop) -> Coroutine[Any, Any, object]:
        """Compute an `_OffLoop` result on a worker thread, in a task `close()` can cancel."""
        return self._in_task(call._replace(shape=_plain), asyncio.to_thread(shaped.work))

    async def close(self) -> None:
        """Cancel in-flight adapter calls and drop subscriptions. Idempotent."""
        # After `close_nowait` (a crashed sandbox) the subscriptions are still on the host's
        # bus: they are dropped here, or the bus keeps the dead sandbox and calls it for ever.
        if self._closed and not self._subscriptions:
            return
        self._closed = True
        for fut in list(self._inflight):
            fut.cancel()
        subs, self._subscriptions = self._subscriptions, []
        for sub in subs:
            try:
                closing = sub.close()
                if _awaitable(closing):
                    await closing
            except Exception as exc:
                self._log_failure("closing a subscription failed", "events", "subscribe", exc)
        self._flush_audit()

    def close_nowait(self) -> None:
        """Synchronous close for blocking facades: cancels in-flight calls. Subscriptions
        stay until `close()`, which drops them."""
        self._closed = True
        for fut in list(self._inflight):
            fut.cancel()
        self._flush_audit()

    def _flush_audit(self) -> None:
        """A sink that folds records (`JsonLinesAudit`'s denial summaries) writes what it
        holds: the sandbox is ending, and its last window may never see another record."""
        flush = getattr(self._audit, "flush", None)
        if callable(flush):
            try:
                flush()
            except Exception as exc:
                self._log_failure("flushing the audit sink failed", "audit", "flush", exc)

    # -- internals -------------------------------------------------------------------------

    def _admit(
        self,
        capability: object,
        operation: object,
        args: object,
        handler: EventHandler | None,
    ) -> tuple[float, str, str, Allow, _AdapterCall]:
        """Validate and decide; on Deny record it and raise. Shared by both entry points."""
        if self._closed:
            raise SuaveplanError("SAND_CANCELLED", "the sandbox was disposed")
        started = self._clock.now()
        cap = capability if type(capability) is str or isinstance(capability, str) else "unknown"
        op = operation if type(operation) is str or isinstance(operation, str) else "unknown"
        if (cap, op) not in _OPERATIONS or not (type(args) is dict or isinstance(args, Mapping)):
            # Names the guest made up are labelled `unknown` in metrics and audit rows: a
            # guest-chosen label would be a new metric series per name it sends.
            if cap not in _CAPABILITIES:
                reason, cap, op = DenyReason.UNKNOWN_CAPABILITY, "unknown", "unknown"
            else:
                reason = DenyReason.MALFORMED_PAYLOAD
                op = op if (cap, op) in _OPERATIONS else "unknown"
            self._denied(self._checker.deny(cap, reason), cap, op, started)
        assert isinstance(args, dict | Mapping)
        try:
            decision, call = self._decide(cap, op, args, handler)
        except _Malformed:
            decision, call = self._checker.deny(cap, DenyReason.MALFORMED_PAYLOAD), None
        if type(decision) is not Allow:  # Allow is final: anything else is refused
            assert isinstance(decision, Deny)
            self._denied(decision, cap, op, started)
        assert call is not None
        return started, cap, op, decision, call  # type: ignore[return-value]

    async def _settle(
        self,
        cap: str,
        op: str,
        decision: Allow,
        started: float,
        work: Callable[[], Awaitable[object]],
    ) -> object:
        """Run an admitted request's adapter work and write its audit row and metrics: the
        coded error it raised, `SAND_ADAPTER_FAILED` for anything else, or ok. `work` is
        called here, so a task cancelled before it ran leaves no never-awaited coroutine."""
        try:
            result = await work()
        except SuaveplanError as exc:
            self._finish(cap, op, decision, started, outcome="error", code=exc.code)
            raise
        except Exception as exc:
            raise self._adapter_failed(cap, op, decision, started, exc) from None
        self._finish(cap, op, decision, started, outcome="ok", code=None)
        return result

    def _adapter_failed(
        self, cap: str, op: str, decision: Allow, started: float, exc: Exception
    ) -> SuaveplanError:
        correlation = self._log_failure("adapter failed", cap, op, exc)
        self._finish(
            cap,
            op,
            decision,
            started,
            outcome="error",
            code="SAND_ADAPTER_FAILED",
            extra={"correlation_id": correlation},
        )
        return SuaveplanError(
            "SAND_ADAPTER_FAILED",
            f"the host's {cap} adapter failed",
            {"capability": cap, "operation": op, "correlation_id": correlation},
        )

    def _log_failure(self, what: str, cap: str, op: str, exc: BaseException) -> str:
        """Log `exc` without its text, its frames or any secret value (`log_failure`); returns
        the correlation id. The traceback goes to `suaveplan_sandbox.gateway.traceback`."""
        return log_failure(
            _log,
            _trace_log,
            exc,
            self._secrets,
            level=logging.WARNING,
            message="%s: %s.%s for plugin %s raised",
            args=(what, cap, op, self.plugin),
            fields={"plugin": self.plugin, "capability": cap, "operation": op},
        )

    def _subscription_lost(self, topic: str, decision: Allow, error: object) -> None:
        """A subscription's backend went away: log, count and audit it, tell the host."""
        if self._closed:
            return
        if not isinstance(error, SuaveplanError):
            error = SuaveplanError("SAND_EVENTS_ERROR", "the events backend failed")
        correlation = uuid.uuid4().hex[:16]
        _log.warning(
            "events subscription lost for plugin %s: %s (correlation_id=%s)",
            self.plugin,
            error.code,
            correlation,
            extra={
                "suaveplan": {
                    "plugin": self.plugin,
                    "capability": "events",
                    "operation": "subscription_lost",
                    "error_code": error.code,
                    "correlation_id": correlation,
                }
            },
        )
        self._finish(
            "events",
            "subscription_lost",
            decision,
            self._clock.now(),
            outcome="error",
            code=error.code,
            extra={"correlation_id": correlation},
        )
        if self._on_subscription_lost is not None:
            try:
                self._on_subscription_lost(topic, error)
            except Exception as exc:
                self._log_failure("on_subscription_lost failed", "events", "subscribe", exc)

    def _scrub(self, text: str) -> str:
        # Also the value's encoded forms (a URL's %3D for `=`, repr and JSON escapes).
        return self._secrets.scrub(text)

    def _remember_secret(self, raw: object) -> object:
        if isinstance(raw, str) and raw:
            self._secrets.add(raw)
        return raw

    def _is_async(self, method: Callable[..., object]) -> bool:
        # Keyed by the underlying function (a bound method is a new object on every getattr).
        key = getattr(method, "__func__", method)
        known = self._async_methods.get(key)
        if known is None:
            known = self._async_methods[key] = inspect.iscoroutinefunction(method)
        return known

    def _method(self, call: _AdapterCall) -> Callable[..., object]:
        method: Callable[..., object] = getattr(self._adapter(call.capability), call.method)
        return method

    async def _invoke(self, call: _AdapterCall) -> object:
        raw = self._method(call)(*call.args, **call.kwargs)
        if type(raw) is Ready:
            raw = raw.value
        elif _awaitable(raw):
            raw = await raw
        result = call.shape(raw)
        if type(result) is _OffLoop:
            result = await asyncio.to_thread(result.work)
        return result

    async def _finish_awaitable(self, call: _AdapterCall, raw: Awaitable[object]) -> object:
        result = call.shape(await raw)
        if type(result) is _OffLoop:
            result = await asyncio.to_thread(result.work)
        return result

    def _run_sync(self, call: _AdapterCall, run_coroutine: RunCoroutine | None) -> object:
        method = self._method(call)
        if self._is_async(method):
            if run_coroutine is None:
                raise _NeedsLoop
            return run_coroutine(self._run(self._invoke, call))
        raw = method(*call.args, **call.kwargs)
        if type(raw) is Ready:
            raw = raw.value  # answered on this thread: no hop to the loop
        elif _awaitable(raw):
            if run_coroutine is None:
                if inspect.iscoroutine(raw):
                    raw.close()
                raise _NeedsLoop
            return run_coroutine(self._run(self._finish_awaitable, call, raw))
        result = call.shape(raw)
        if type(result) is _OffLoop:
            result = result.work()  # this thread may block: no hop to a worker thread
        if self._closed:
            if isinstance(result, socket.socket):
                result.close()
            raise SuaveplanError("SAND_CANCELLED", "the sandbox was disposed")
        return result

    async def _run(
        self,
        work: Callable[..., Coroutine[Any, Any, object]],
        call: _AdapterCall,
        *more: Any,
    ) -> object:
        # `work` is started here, not by the caller: a `_run` closed before it ran (its loop
        # is unreachable) leaves no never-awaited adapter coroutine behind.
        fut: asyncio.Future[object] = asyncio.ensure_future(work(call, *more))
        self._inflight.add(fut)
        try:
            return await fut
        except asyncio.CancelledError:
            if self._closed:
                raise SuaveplanError("SAND_CANCELLED", "the sandbox was disposed") from None
            task = asyncio.current_task()
            if task is not None and not task.cancelling():
                # Nobody cancelled this call: the adapter's own code raised CancelledError
                # (a library's internal cancellation). Passing it on would read as "the caller
                # was cancelled", and the VM host would never answer the waiting guest.
                raise _AdapterCancelled from None
            raise
        finally:
            self._inflight.discard(fut)

    def _denied(self, deny: Deny, cap: str, op: str, started: float) -> None:
        self._finish(cap, op, deny, started, outcome="deny", code="SAND_PERM_DENIED")
        if self._on_denial is not None:
            self._on_denial(deny, cap, op)
        deny.raise_for_denial()

    def _finish(
        self,
        cap: str,
        op: str,
        decision: Allow | Deny,
        started: float,
        *,
        outcome: str,
        code: str | None,
        extra: dict[str, WireValue] | None = None,
    ) -> None:
        self._metrics.inc(_CALLS, {"plugin": self._plugin, "capability": cap, "outcome": outcome})
        if self._audit is None or not self._audit_on():
            return
        allowed = type(decision) is Allow  # final: no subclass to miss
        resource = decision.target if allowed else None  # type: ignore[union-attr]
        if resource and self._secrets.active:
            # A plugin may put a secret value it was handed in a URL, a path or SQL text.
            resource = self._secrets.scrub(resource)
        self._audit.record(
            AuditRecord(
                plugin=self._plugin,
                capability=cap,
                operation=op,
                allowed=allowed,
                reason=None if allowed else decision.reason.value,  # type: ignore[union-attr]
                rule=decision.rule if allowed else None,  # type: ignore[union-attr]
                duration_ms=(self._clock.now() - started) * 1000.0,
                resource=resource,
                outcome=outcome if code is None else f"{outcome}:{code}",
                extra=extra or {},
            )
        )

    def _adapter(self, cap: str) -> object:
        adapter = getattr(self._adapters, cap)
        if adapter is None:
            raise SuaveplanError(
                "SAND_ADAPTER_MISSING",
                f"the host provides no {cap} adapter",
                {"capability": cap},
            )
        return adapter

    def _decide(
        self,
        cap: str,
        op: str,
        args: Mapping[object, object],
        handler: EventHandler | None,
    ) -> tuple[Allow | Deny, _AdapterCall | None]:
        checker = self._checker
        if cap == "fs":
            mode = "write" if op == "write_bytes" else "read"
            fs_decision = checker.check_fs(args.get("path"), mode)
            if isinstance(fs_decision, Deny):
                return fs_decision, None
            return fs_decision, self._fs_call(op, fs_decision, args)
        if cap == "fetch":
            if op == "connect":
                host, port = args.get("host"), args.get("port")
                net_decision = checker.check_connect(host, port)
                if isinstance(net_decision, Deny):
                    return net_decision, None
                assert isinstance(host, str)
                assert isinstance(port, int)
                return net_decision, self._connect_call(host, port, net_decision)
            url_decision = checker.check_fetch(args.get("url"))
            if isinstance(url_decision, Deny):
                return url_decision, None
            return url_decision, self._fetch_call(url_decision, args)
        if cap == "db":
            sql, params = args.get("sql"), args.get("params", [])
            db_decision = checker.check_capability("db", {"sql": sql, "params": params})
            if isinstance(db_decision, Deny):
                return db_decision, None
            return db_decision, self._db_call(db_decision, params)
        if cap == "secrets":
            name = args.get("name")
            s_decision = checker.check_capability("secrets", {"name": name})
            if isinstance(s_decision, Deny):
                return s_decision, None
            assert isinstance(name, str)
            return s_decision, self._secret_call(name)
        # events
        topic = args.get("topic")
        e_decision = checker.check_capability("events", {"action": op, "topic": topic})
        if isinstance(e_decision, Deny):
            return e_decision, None
        assert isinstance(topic, str)
        if op == "publish":
            payload = args.get("payload")
            return e_decision, self._publish_call(topic, payload)
        if handler is None:
            raise _Malformed
        return e_decision, self._subscribe_call(topic, handler, e_decision)

    def _fs_call(self, op: str, decision: Allow, args: Mapping[object, object]) -> _AdapterCall:
        path = decision.target or ""
        if op == "write_bytes":
            data = args.get("data")
            if isinstance(data, bytearray | memoryview):
                data = bytes(data)
            if not isinstance(data, bytes):
                raise _Malformed
            if len(data) > self._max_write:
                raise SuaveplanError(
                    "SAND_FS_TOO_LARGE", "write exceeds the size limit", {"limit": self._max_write}
                )
            return _AdapterCall("fs", "write_bytes", (path, data), shape=_none)
        if op == "read_bytes":
            limit = args.get("max_bytes", self._max_read)
            if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
                raise _Malformed
            limit = min(limit, self._max_read)
            return _AdapterCall("fs", "read_bytes", (path,), {"max_bytes": limit})
        if op == "list_dir":
            # Reading the directory is allowed; of its entries, the guest learns only those
            # it could read (a rule about `data` or `data/*.csv` is not one about every name
            # in `data`).
            # A long listing is filtered off the event loop (`_OffLoop`): under per-name rules
            # 100,000 names cost 100-200 ms, which would stall every sandbox on the loop.
            rules = self._checker.policy.fs

            def visible(names: Iterable[object]) -> object:
                if isinstance(names, Sized) and len(names) <= _INLINE_LIST_ENTRIES:
                    return rules.readable_entries(path, names)
                return _OffLoop(functools.partial(rules.readable_entries, path, names))

            return _AdapterCall("fs", "list_dir", (path,), shape=visible)
        return _AdapterCall("fs", "exists", (path,))

    def _fetch_call(self, decision: Allow, args: Mapping[object, object]) -> _AdapterCall:
        method = args.get("method", "GET")
        headers = args.get("headers", [])
        body = args.get("body", b"")
        if not isinstance(method, str) or method.upper() not in _METHODS:
            raise _Malformed
        if isinstance(headers, Mapping):
            headers = list(headers.items())
        if not isinstance(headers, list | tuple) or len(headers) > _MAX_HEADERS:
            raise _Malformed
        pairs: list[tuple[str, str]] = []
        for item in headers:
            if (
                not isinstance(item, list | tuple)
                or len(item) != 2
                or not all(isinstance(v, str) for v in item)
            ):
                raise _Malformed
            pairs.append((item[0], item[1]))
        if isinstance(body, str):
            body = body.encode()
        if not isinstance(body, bytes):
            raise _Malformed
        request = HttpRequest(
            url=decision.target or "",
            method=method.upper(),
            headers=tuple(pairs),
            body=body,
            rule=decision.rule or "",
        )
        return _AdapterCall("fetch", "request", (request,), shape=_http_response)

    def _connect_call(self, host: str, port: int, decision: Allow) -> _AdapterCall:
        return _AdapterCall("fetch", "connect", (host, port), {"rule": decision.rule or ""})

    def _db_call(self, decision: Allow, params: object) -> _AdapterCall:
        if isinstance(params, tuple):
            params = list(params)
        if not isinstance(params, list) or len(params) > _MAX_PARAMS:
            raise _Malformed
        bound: Sequence[WireValue] = list(params)
        sql = decision.target or ""
        return _AdapterCall("db", "query", (sql, bound), shape=_query_result)

    def _secret_call(self, name: str) -> _AdapterCall:
        return _AdapterCall("secrets", "get", (name,), shape=self._remember_secret)

    def _publish_call(self, topic: str, payload: object) -> _AdapterCall:
        return _AdapterCall("events", "publish", (self.plugin, topic, payload), shape=_none)

    def _subscribe_call(self, topic: str, handler: EventHandler, decision: Allow) -> _AdapterCall:
        def keep(sub: Subscription) -> object:
            self._subscriptions.append(sub)
            watch = getattr(sub, "on_lost", None)
            if callable(watch):
                watch(lambda error: self._subscription_lost(topic, decision, error))
            return None

        return _AdapterCall("events", "subscribe", (self.plugin, topic, handler), shape=keep)


def _none(_raw: object) -> object:
    return None


def _http_response(response: HttpResponse) -> object:
    return {
        "status": response.status,
        "headers": [list(h) for h in response.headers],
        "body": response.body,
    }


def _query_result(result: QueryResult) -> object:
    return {
        "columns": list(result.columns),
        "rows": [list(r) for r in result.rows],
        "rowcount": result.rowcount,
    }
