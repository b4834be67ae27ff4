"""`RedisEventBus`: events over Redis pub/sub (`redis.asyncio`), JSON payloads.

Subscriptions use PSUBSCRIBE with the manifest pattern translated to a Redis glob (`*` only;
other glob metacharacters are escaped), and each delivery is matched again against the
manifest pattern with the checker's own `topic_matches` before the handler sees it, so a
difference between Redis's glob and the manifest's rule can only drop an event, never deliver
one the plugin did not subscribe to. Payloads follow the rule every bus shares
(`_events.encode_payload`): strict JSON, anything else (bytes included) refused at `publish`
with `SAND_INVALID_ARGUMENT`; a received message that is not strict JSON is dropped (never
evaluated).

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

from suaveplan_sandbox.adapters._events import decode_payload, encode_payload
from suaveplan_sandbox.adapters._protocols import EventHandler
from suaveplan_sandbox.errors import SuaveplanError, WireValue
from suaveplan_sandbox.permissions._topic_rules import topic_matches

_LOG = logging.getLogger("suaveplan_sandbox.events")
_DEFAULT_TIMEOUT: Final = 5.0


def _glob(pattern: str) -> str:
    return "".join("\\" + c if c in "?[]\\" else c for c in pattern)


def _backend_failed(exc: BaseException) -> SuaveplanError:
    return SuaveplanError("SAND_EVENTS_ERROR", "the events backend failed", cause=exc)


@final
class _RedisSubscription:
    def __init__(self, pubsub: Any, pattern: str, handler: EventHandler) -> None:
        self._pubsub = pubsub
        self._pattern = pattern
        self._handler = handler
        self.error: SuaveplanError | None = None
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
                if message.get("type") != "pmessage":
                    continue
                channel = message["channel"]
                topic = channel.decode() if isinstance(channel, bytes) else str(channel)
                if not topic_matches(self._pattern, topic):
                    continue  # Redis matched, the manifest rule did not: never deliver
                try:
                    payload = decode_payload(message["data"])
                    await self._handler(topic, payload)
                except Exception as exc:
                    _LOG.warning("event handler failed: %s", type(exc).__name__)
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

    async def close(self) -> None:
        self._lost = []  # a closed subscription reports nothing
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        try:
            await self._pubsub.aclose()
        except Exception:  # the server may already be gone; the socket is closed regardless
            _LOG.debug("closing a lost subscription", exc_info=True)


@final
class RedisEventBus:
    """Publish/subscribe through a Redis server at `url` (`redis://`, `rediss://`, `unix://`)."""

    def __init__(self, url: str, *, timeout: float = _DEFAULT_TIMEOUT) -> None:
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

    def __repr__(self) -> str:
        return "RedisEventBus()"

    async def aclose(self) -> None:
        await self._redis.aclose()

    async def publish(self, plugin: str, topic: str, payload: WireValue) -> None:
        data = encode_payload(payload)
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
        return _RedisSubscription(pubsub, pattern, handler)
