"""RedisEventBus against a real redis-server: deliveries by manifest pattern."""

from __future__ import annotations

import asyncio

from suaveplan_sandbox.adapters._redis_events import RedisEventBus
from suaveplan_sandbox.errors import WireValue


async def test_redis_bus_delivers_matching_events_to_subscribers(redis_url: str) -> None:
    bus = RedisEventBus(redis_url)
    got: asyncio.Queue[tuple[str, WireValue]] = asyncio.Queue()

    async def handler(topic: str, payload: WireValue) -> None:
        await got.put((topic, payload))

    sub = await bus.subscribe("b", "orders.*", handler)
    await bus.publish("a", "users.created", {"skip": True})
    await bus.publish("a", "orders.created", {"id": 1})
    assert await asyncio.wait_for(got.get(), 10) == ("orders.created", {"id": 1})
    await sub.close()
    await bus.aclose()
