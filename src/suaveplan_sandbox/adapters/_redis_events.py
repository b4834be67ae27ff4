"""`RedisEventBus`: events over Redis pub/sub (`redis.asyncio`), JSON payloads.

Subscriptions use PSUBSCRIBE with the manifest pattern translated to a Redis glob (`*` only;
other glob metacharacters are escaped), so Redis matches exactly what the manifest says.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any, final

from suaveplan_sandbox.adapters._protocols import EventHandler
from suaveplan_sandbox.errors import SuaveplanError, WireValue

_LOG = logging.getLogger("suaveplan_sandbox.events")


def _glob(pattern: str) -> str:
    escaped = "".join("\\" + c if c in "?[]\\" else c for c in pattern)
    return escaped


@final
class _RedisSubscription:
    def __init__(self, pubsub: Any, task: asyncio.Task[None]) -> None:
        self._pubsub = pubsub
        self._task = task

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        await self._pubsub.aclose()


@final
class RedisEventBus:
    """Publish/subscribe through a Redis server at `url` (`redis://`, `unix://`)."""

    def __init__(self, url: str) -> None:
        import redis.asyncio as aioredis

        self._redis: Any = aioredis.from_url(url)

    def __repr__(self) -> str:
        return "RedisEventBus()"

    async def aclose(self) -> None:
        await self._redis.aclose()

    async def publish(self, plugin: str, topic: str, payload: WireValue) -> None:
        try:
            await self._redis.publish(topic, json.dumps(payload))
        except Exception as exc:
            raise SuaveplanError(
                "SAND_EVENTS_ERROR", "the events backend failed", cause=exc
            ) from None

    async def subscribe(
        self, plugin: str, pattern: str, handler: EventHandler
    ) -> _RedisSubscription:
        pubsub = self._redis.pubsub()
        try:
            await pubsub.psubscribe(_glob(pattern))
        except Exception as exc:
            raise SuaveplanError(
                "SAND_EVENTS_ERROR", "the events backend failed", cause=exc
            ) from None

        async def pump() -> None:
            async for message in pubsub.listen():
                if message.get("type") != "pmessage":
                    continue
                channel = message["channel"]
                topic = channel.decode() if isinstance(channel, bytes) else str(channel)
                try:
                    payload = json.loads(message["data"])
                    await handler(topic, payload)
                except Exception as exc:
                    _LOG.warning("event handler failed: %s", type(exc).__name__)

        return _RedisSubscription(pubsub, asyncio.create_task(pump()))
