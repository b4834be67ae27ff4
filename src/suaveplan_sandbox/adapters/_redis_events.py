"""`RedisEventBus`: events over Redis pub/sub (`redis.asyncio`), JSON payloads.

Subscriptions use PSUBSCRIBE with the manifest pattern translated to a Redis glob (`*` only;
other glob metacharacters are escaped), and each delivery is matched again against the
manifest pattern with the checker's own `topic_matches` before the handler sees it, so a
difference between Redis's glob and the manifest's rule can only drop an event, never deliver
one the plugin did not subscribe to. Payloads follow the rule every bus shares
(`_events.encode_payload`): strict JSON, anything else (bytes included) refused at `publish`
with `SAND_INVALID_ARGUMENT`.

Hop depth: each message carries the publisher's hop depth (`_event_envelope`), and the
handler runs with `event_depth` set from it, so a plugin re-publishing to its own topic stops
at `MAX_EVENT_DEPTH` with the same `event-depth` drop as on the in-process bus. What arrives is
untrusted (any client of the server may publish): a message that is not a well-formed event
(a bad header or depth, a payload that is not strict JSON, a channel name that is not UTF-8)
is dropped, never evaluated, counted in `plugin.events_dropped_total{reason="event-malformed"}`
when the bus has a metrics sink, and reported in at most one warning a second per
subscription with its count. A message in the format before depths were carried is delivered
as the last hop (`LEGACY_DEPTH`).

Failure: a lost server surfaces as `SAND_EVENTS_ERROR` from `publish`/`subscribe` within the
connect timeout (no hang), and ends a subscription's pump, which records the error on
`subscription.error`, logs it, and calls every `on_lost` callback with it (the gateway
registers one: an audit row, a metric and its `on_subscription_lost` listener); `close()` is
always safe and leaves no task or connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, Final, final

from suaveplan_sandbox.adapters._credentials import url_passwords
from suaveplan_sandbox.adapters._event_envelope import read_event, write_event
from suaveplan_sandbox.adapters._events import event_depth
from suaveplan_sandbox.adapters._protocols import EventHandler
from suaveplan_sandbox.errors import SuaveplanError, WireValue
from suaveplan_sandbox.metrics import EVENTS_DROPPED, MetricsSink
from suaveplan_sandbox.permissions._topic_rules import topic_matches

_LOG = logging.getLogger("suaveplan_sandbox.events")
_DEFAULT_TIMEOUT: Final = 5.0
_MALFORMED: Final = "event-malformed"
# Warnings about one subscription's malformed messages: at most one a second, each with the
# count since the last (a publisher flooding junk must not flood the host's log too).
_WARNING_INTERVAL_S: Final = 1.0


class _Malformed(Exception):
    """Internal: a message on the channel is not a well-formed event."""


def _glob(pattern: str) -> str:
    return "".join("\\" + c if c in "?[]\\" else c for c in pattern)


def _backend_failed(exc: BaseException) -> SuaveplanError:
    return SuaveplanError("SAND_EVENTS_ERROR", "the events backend failed", cause=exc)


@final
class _RedisSubscription:
    def __init__(
        self,
        pubsub: Any,
        pattern: str,
        handler: EventHandler,
        *,
        plugin: str = "",
        metrics: MetricsSink | None = None,
    ) -> None:
        self._pubsub = pubsub
        self._pattern = pattern
        self._handler = handler
        self._plugin = plugin
        self._metrics = metrics
        self.error: SuaveplanError | None = None
        # Malformed messages dropped: all of them, and those no warning has reported yet.
        self.malformed = 0
        self._unreported = 0
        self._next_warning = 0.0
        self._lost: list[Callable[[SuaveplanError], None]] = []
        self._task = asyncio.create_task(self._pump())

    def on_lost(self, callback: Callable[[SuaveplanError], None]) -> None:
        """Call `callback(error)` once if the server connection is lost (now, if it was)."""
        if self.error is not None:
            callback(self.error)
        else:
            self._lost.append(callback)

    @property
    def active(self) -> bool:
        """False once closed or once the server connection was lost."""
        return not self._task.done()

    async def _pump(self) -> None:
        try:
            async for message in self._pubsub.listen():
                try:
                    await self._receive(message)
                except _Malformed:
                    self._drop_malformed()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            error = self.error = _backend_failed(exc)
            _LOG.warning("events subscription lost its backend: %s", type(exc).__name__)
            callbacks, self._lost = self._lost, []
            for callback in callbacks:
                try:
                    callback(error)
                except Exception as cb_exc:
                    _LOG.warning("an on_lost callback failed: %s", type(cb_exc).__name__)

    async def _receive(self, message: object) -> None:
        """Deliver one message from the server, or raise `_Malformed`; a handler's failure is
        logged and does not end the subscription."""
        if not isinstance(message, dict) or message.get("type") != "pmessage":
            return
        channel = message.get("channel")
        if isinstance(channel, bytes):
            try:
                topic = channel.decode()
            except UnicodeDecodeError:
                raise _Malformed from None
        elif isinstance(channel, str):
            topic = channel
        else:
            raise _Malformed
        if not topic_matches(self._pattern, topic):
            return  # Redis matched, the manifest rule did not: never deliver
        try:
            depth, payload = read_event(message.get("data"))
        except ValueError:
            raise _Malformed from None
        # The handler (and what it publishes) runs at the publisher's depth, as in-process.
        token = event_depth.set(depth)
        try:
            await self._handler(topic, payload)
        except Exception as exc:
            _LOG.warning("event handler failed: %s", type(exc).__name__)
        finally:
            event_depth.reset(token)

    def _drop_malformed(self) -> None:
        self.malformed += 1
        self._unreported += 1
        if self._metrics is not None:
            self._metrics.inc(EVENTS_DROPPED.name, {"plugin": self._plugin, "reason": _MALFORMED})
        now = asyncio.get_running_loop().time()
        if now >= self._next_warning:
            self._next_warning = now + _WARNING_INTERVAL_S
            self._report_malformed()

    def _report_malformed(self) -> None:
        count, self._unreported = self._unreported, 0
        if count:
            _LOG.warning(
                "[%s] %d malformed event messages dropped (%s)",
                self._plugin,
                count,
                _MALFORMED,
                extra={
                    "suaveplan": {
                        "plugin": self._plugin,
                        "reason": _MALFORMED,
                        "dropped_events": count,
                    }
                },
            )

    async def close(self) -> None:
        self._lost = []  # a closed subscription reports nothing
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._report_malformed()  # the drops the throttle held back
        try:
            await self._pubsub.aclose()
        except Exception:  # the server may already be gone; the socket is closed regardless
            _LOG.debug("closing a lost subscription", exc_info=True)


@final
class RedisEventBus:
    """Publish/subscribe through a Redis server at `url` (`redis://`, `rediss://`, `unix://`).

    `metrics` (optional) counts the malformed messages subscriptions drop, as
    `plugin.events_dropped_total{plugin, reason="event-malformed"}`.
    """

    def __init__(
        self,
        url: str,
        *,
        timeout: float = _DEFAULT_TIMEOUT,
        metrics: MetricsSink | None = None,
    ) -> None:
        import redis.asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        # A bounded connect/read timeout and a single retry: a dead server is an error, not a hang.
        self._redis: Any = aioredis.from_url(
            url,
            socket_connect_timeout=timeout,
            socket_timeout=timeout,
            retry=Retry(NoBackoff(), 1),
        )
        self._metrics = metrics
        # The password the client uses, and any other the URL's text shows (userinfo wins
        # over a `?password=`, which then stays in the URL): never in a diagnostic.
        shown = [self._redis.connection_pool.connection_kwargs.get("password")]
        shown += url_passwords(url)
        self._passwords = tuple(dict.fromkeys(v for v in shown if isinstance(v, str) and v))

    def __repr__(self) -> str:
        return "RedisEventBus()"

    def redaction_values(self) -> tuple[str, ...]:
        """The password(s) in this bus's URL, for the gateway's redactor (not the username)."""
        return self._passwords

    async def aclose(self) -> None:
        await self._redis.aclose()

    async def publish(self, plugin: str, topic: str, payload: WireValue) -> None:
        data = write_event(event_depth.get(), payload)
        try:
            await self._redis.publish(topic, data)
        except Exception as exc:
            raise _backend_failed(exc) from None

    async def subscribe(
        self, plugin: str, pattern: str, handler: EventHandler
    ) -> _RedisSubscription:
        pubsub = self._redis.pubsub()
        try:
            await pubsub.psubscribe(_glob(pattern))
        except Exception as exc:
            with contextlib.suppress(Exception):
                await pubsub.aclose()
            raise _backend_failed(exc) from None
        return _RedisSubscription(pubsub, pattern, handler, plugin=plugin, metrics=self._metrics)
