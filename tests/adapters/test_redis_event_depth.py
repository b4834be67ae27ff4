"""Event hop depth over a real redis-server: a loop through Redis stops where an in-process
one does, with the same drop and metric; what strangers publish on a channel is dropped and
counted, never delivered, and the subscription keeps running."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from suaveplan_sandbox.adapters import Adapters, InProcessEventBus
from suaveplan_sandbox.adapters._event_envelope import LEGACY_DEPTH
from suaveplan_sandbox.adapters._events import MAX_EVENT_DEPTH, event_depth
from suaveplan_sandbox.adapters._redis_events import RedisEventBus
from suaveplan_sandbox.errors import WireValue
from suaveplan_sandbox.metrics import EVENTS_DROPPED, InMemoryMetrics
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.vm import VmSandbox, create_vm_sandbox

ECHO = """
from suaveplan import events


@events.subscribe("loop.*")
def again(payload):
    events.publish("loop.again", payload)


def start():
    events.publish("loop.start", 0)
"""

PING = """
from suaveplan import events


@events.subscribe("ping")
def answer(payload):
    events.publish("pong", payload + 1)
"""

PONG = """
from suaveplan import events

LAST = []


@events.subscribe("pong")
def answer(payload):
    LAST.append(payload)
    events.publish("ping", payload + 1)


def start():
    events.publish("ping", 0)


def last():
    return LAST
"""

Seen = list[tuple[str, WireValue, int]]


def _recorder() -> tuple[Any, Seen]:
    """A handler recording (topic, payload, the hop depth it runs at)."""
    seen: Seen = []

    async def handler(topic: str, payload: WireValue) -> None:
        seen.append((topic, payload, event_depth.get()))

    return handler, seen


async def _until(predicate: Any, timeout: float = 10.0) -> None:
    async def poll() -> None:
        while not predicate():
            await asyncio.sleep(0.01)

    await asyncio.wait_for(poll(), timeout)


async def _sandbox(
    tmp: Path, name: str, source: str, bus: object, events: dict[str, list[str]]
) -> tuple[VmSandbox, InMemoryMetrics]:
    (tmp / f"{name}.py").write_text(source)
    policy = PermissionPolicy.from_manifest({"name": name, "events": events}, root=tmp)
    metrics = InMemoryMetrics()
    sandbox = await create_vm_sandbox(
        plugin_module_path=tmp / f"{name}.py",
        policy=policy,
        proxies=Adapters(events=bus),  # type: ignore[arg-type]
        metrics=metrics,
    )
    return sandbox, metrics


async def test_a_handler_runs_at_the_hop_depth_its_publisher_had(redis_url: str) -> None:
    bus = RedisEventBus(redis_url)
    handler, seen = _recorder()
    sub = await bus.subscribe("b", "hop.*", handler)
    await bus.publish("host", "hop.host", "from the host")
    token = event_depth.set(3)
    try:
        await bus.publish("a", "hop.deep", "three hops in")
    finally:
        event_depth.reset(token)
    await _until(lambda: len(seen) == 2)
    assert seen == [("hop.host", "from the host", 0), ("hop.deep", "three hops in", 3)]
    await sub.close()
    await bus.aclose()


@pytest.mark.parametrize("bus_kind", ["in-process", "redis"])
async def test_a_plugin_republishing_to_its_own_topic_stops_at_the_same_depth_on_either_bus(
    tmp_path: Path, redis_url: str, bus_kind: str
) -> None:
    bus: Any = InProcessEventBus() if bus_kind == "in-process" else RedisEventBus(redis_url)
    events = {"subscribes": ["loop.*"], "publishes": ["loop.*"]}
    sb, metrics = await _sandbox(tmp_path, "echo", ECHO, bus, events)
    async with sb:
        await sb.call("start")
        # Without the depth on the wire the loop never ends: stop looking well past the limit.
        # The drop can be counted before the last delivery's result arrives (the bus hands
        # the host the over-deep event while that delivery is still answering), so wait for
        # both.
        await _until(
            lambda: (
                (sb.events_dropped and sb.events_delivered >= MAX_EVENT_DEPTH)
                or sb.events_delivered > 3 * MAX_EVENT_DEPTH
            )
        )
        assert (sb.events_delivered, sb.events_dropped) == (MAX_EVENT_DEPTH, 1)
        assert metrics.value(EVENTS_DROPPED.name, plugin="echo", reason="event-depth") == 1
        assert metrics.value(EVENTS_DROPPED.name) == 1
    if bus_kind == "redis":
        await bus.aclose()


async def test_two_plugins_answering_each_other_through_redis_stop_at_the_depth_limit(
    tmp_path: Path, redis_url: str
) -> None:
    bus = RedisEventBus(redis_url)
    ping, _ = await _sandbox(
        tmp_path, "ping", PING, bus, {"subscribes": ["ping"], "publishes": ["pong"]}
    )
    pong, _ = await _sandbox(
        tmp_path, "pong", PONG, bus, {"subscribes": ["pong"], "publishes": ["ping"]}
    )
    async with ping, pong:
        await pong.call("start")

        def delivered() -> int:
            return ping.events_delivered + pong.events_delivered

        await _until(  # both the drop and the last delivery's result, as above
            lambda: (
                (ping.events_dropped + pong.events_dropped and delivered() >= MAX_EVENT_DEPTH)
                or delivered() > 3 * MAX_EVENT_DEPTH
            )
        )
        assert ping.events_delivered + pong.events_delivered == MAX_EVENT_DEPTH
        assert ping.events_dropped + pong.events_dropped == 1
        assert await pong.call("last") == list(range(1, MAX_EVENT_DEPTH, 2))
    await bus.aclose()


async def test_an_event_in_the_earlier_format_is_delivered_as_the_last_hop(
    tmp_path: Path, redis_url: str
) -> None:
    # A publisher still on the bare-JSON format: its event reaches the plugin, but what the
    # plugin publishes while handling it is one hop too deep and goes nowhere.
    bus = RedisEventBus(redis_url)
    handler, seen = _recorder()
    spy = await bus.subscribe("host", "loop.*", handler)
    events = {"subscribes": ["loop.*"], "publishes": ["loop.*"]}
    sb, metrics = await _sandbox(tmp_path, "echo", ECHO, bus, events)
    async with sb:
        raw = aioredis.from_url(redis_url)
        await raw.publish("loop.legacy", b'{"old":true}')
        await raw.aclose()
        await _until(lambda: sb.events_dropped)
        # The spy saw both: the legacy event and the plugin's answer, one hop deeper.
        await _until(lambda: len(seen) == 2)
        assert seen == [
            ("loop.legacy", {"old": True}, LEGACY_DEPTH),
            ("loop.again", {"old": True}, MAX_EVENT_DEPTH),
        ]
        assert (sb.events_delivered, sb.events_dropped) == (1, 1)
        assert metrics.value(EVENTS_DROPPED.name, plugin="echo", reason="event-depth") == 1
    await spy.close()
    await bus.aclose()


JUNK: list[tuple[bytes, bytes]] = [
    (b"junk.a", b"suaveplan-event/1 depth=-1\n1"),
    (b"junk.a", b"suaveplan-event/1 depth=01\n1"),
    (b"junk.a", b"suaveplan-event/1 depth=" + b"9" * 40 + b"\n1"),
    (b"junk.a", b"suaveplan-event/1 depth=abc\n1"),
    (b"junk.a", b"suaveplan-event/1 depth=2"),
    (b"junk.a", b"suaveplan-event/1 depth=2\nnot json"),
    (b"junk.a", b"suaveplan-event/9 depth=2\n1"),
    (b"junk.a", b"\x80\x04\x95 a pickle"),
    (b"junk.a", b"[" * 50_000),
    (b"junk.\xff", b"suaveplan-event/1 depth=0\n1"),  # a channel name that is not UTF-8
]


async def test_malformed_messages_are_dropped_and_counted_and_delivery_continues(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="suaveplan_sandbox.events")
    metrics = InMemoryMetrics()
    bus = RedisEventBus(redis_url, metrics=metrics)
    handler, seen = _recorder()
    sub = await bus.subscribe("p", "junk.*", handler)
    raw = aioredis.from_url(redis_url)
    for channel, data in JUNK:
        await raw.publish(channel, data)
    await raw.publish(b"junk.huge", b"suaveplan-event/1 depth=123456789\n[1]")
    await raw.aclose()
    await bus.publish("host", "junk.ok", "after the junk")
    await _until(lambda: len(seen) == 2)
    assert seen == [("junk.huge", [1], MAX_EVENT_DEPTH), ("junk.ok", "after the junk", 0)]
    assert sub.active and sub.error is None
    dropped = metrics.value(EVENTS_DROPPED.name, plugin="p", reason="event-malformed")
    assert dropped == len(JUNK) == sub.malformed
    await sub.close()
    await bus.aclose()
    # Warnings are throttled, but together (the last one written at close) they count all.
    counts = [
        r.__dict__["suaveplan"]["dropped_events"]
        for r in caplog.records
        if "dropped_events" in r.__dict__.get("suaveplan", {})
    ]
    assert sum(counts) == len(JUNK)
    assert all(r.exc_info is None for r in caplog.records)


async def test_a_bus_without_metrics_still_drops_malformed_messages(redis_url: str) -> None:
    bus = RedisEventBus(redis_url)
    handler, seen = _recorder()
    sub = await bus.subscribe("p", "bare.*", handler)
    raw = aioredis.from_url(redis_url)
    await raw.publish("bare.x", b"suaveplan-event/1 depth=-3\n1")
    await raw.aclose()
    await bus.publish("host", "bare.x", 2)
    await _until(lambda: seen)
    assert seen == [("bare.x", 2, 0)]
    assert sub.malformed == 1
    await sub.close()
    await bus.aclose()
