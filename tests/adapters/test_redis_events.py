"""RedisEventBus against a real redis-server: ordering, fan-out, the gateway's topic rules,
clean close, and a server that goes away."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from suaveplan_sandbox.adapters import Adapters
from suaveplan_sandbox.adapters._redis_events import RedisEventBus, _RedisSubscription
from suaveplan_sandbox.errors import SuaveplanError, WireValue
from suaveplan_sandbox.gateway import Gateway
from suaveplan_sandbox.metrics import CAPABILITY_CALLS, InMemoryMetrics
from suaveplan_sandbox.permissions import PermissionChecker, PermissionPolicy
from suaveplan_sandbox.testing import RecordingAudit

Got = list[tuple[str, WireValue]]


def _collector() -> tuple[Any, Got]:
    got: Got = []

    async def handler(topic: str, payload: WireValue) -> None:
        got.append((topic, payload))

    return handler, got


async def _until(predicate: Any, timeout: float = 10.0) -> None:
    async def poll() -> None:
        while not predicate():
            await asyncio.sleep(0.01)

    await asyncio.wait_for(poll(), timeout)


async def _clients(url: str) -> int:
    admin = aioredis.from_url(url)
    try:
        return len(await admin.client_list()) - 1  # minus this admin connection
    finally:
        await admin.aclose()


async def test_redis_bus_delivers_matching_events_to_subscribers(redis_url: str) -> None:
    bus = RedisEventBus(redis_url)
    handler, got = _collector()
    sub = await bus.subscribe("b", "orders.*", handler)
    await bus.publish("a", "users.created", {"skip": True})
    await bus.publish("a", "orders.created", {"id": 1})
    await _until(lambda: got)
    assert got == [("orders.created", {"id": 1})]
    await sub.close()
    await bus.aclose()


async def test_many_deliveries_arrive_in_publish_order(redis_url: str) -> None:
    bus = RedisEventBus(redis_url)
    handler, got = _collector()
    sub = await bus.subscribe("b", "seq.*", handler)
    for i in range(50):
        await bus.publish("a", f"seq.{i % 3}", {"n": i})
    await _until(lambda: len(got) == 50)
    assert [payload for _topic, payload in got] == [{"n": i} for i in range(50)]
    assert [topic for topic, _payload in got] == [f"seq.{i % 3}" for i in range(50)]
    await sub.close()
    await bus.aclose()


async def test_each_subscriber_gets_exactly_the_topics_its_pattern_names(redis_url: str) -> None:
    bus = RedisEventBus(redis_url)
    wide, got_wide = _collector()
    exact, got_exact = _collector()
    users, got_users = _collector()
    literal, got_literal = _collector()
    subs = [
        await bus.subscribe("a", "fan.orders.*", wide),
        await bus.subscribe("b", "fan.orders.created", exact),
        await bus.subscribe("c", "fan.users.*", users),
        # Redis glob metacharacters in a manifest rule are literal characters.
        await bus.subscribe("d", "fan.q[1]?", literal),
    ]
    for topic in (
        "fan.orders.created",
        "fan.users.deleted",
        "fan.orders.paid.eu",
        "fan.q1",
        "fan.q[1]?",
        "fan.other",
    ):
        await bus.publish("host", topic, topic)
    await _until(lambda: len(got_wide) == 2 and got_users and got_literal and got_exact)
    # A marker published last proves nothing else was still in flight.
    marker, got_marker = _collector()
    subs.append(await bus.subscribe("e", "fan.marker", marker))
    await bus.publish("host", "fan.marker", None)
    await _until(lambda: got_marker)
    assert [t for t, _ in got_wide] == ["fan.orders.created", "fan.orders.paid.eu"]
    assert [t for t, _ in got_exact] == ["fan.orders.created"]
    assert [t for t, _ in got_users] == ["fan.users.deleted"]
    assert [t for t, _ in got_literal] == ["fan.q[1]?"]
    for sub in subs:
        await sub.close()
    await bus.aclose()


async def test_non_json_payloads_are_dropped_and_delivery_continues(redis_url: str) -> None:
    bus = RedisEventBus(redis_url)
    handler, got = _collector()
    sub = await bus.subscribe("b", "raw.*", handler)
    raw = aioredis.from_url(redis_url)
    await raw.publish("raw.x", b"\x80not json")
    await raw.publish("raw.x", b"cos\nsystem\n(S'id'\ntR.")  # a pickle is just bytes here
    await raw.aclose()
    await bus.publish("a", "raw.x", [1, 2])
    await _until(lambda: got)
    assert got == [("raw.x", [1, 2])]
    await sub.close()
    await bus.aclose()


async def test_a_delivery_redis_matched_but_the_manifest_rule_does_not_is_dropped() -> None:
    class FakePubSub:
        async def listen(self) -> AsyncIterator[dict[str, Any]]:
            for channel in (b"orders.created", b"admin.secrets", b"orders.paid"):
                yield {"type": "pmessage", "channel": channel, "data": b"1"}

        async def aclose(self) -> None:
            pass

    handler, got = _collector()
    sub = _RedisSubscription(FakePubSub(), "orders.*", handler)
    await _until(lambda: not sub.active)
    assert got == [("orders.created", 1), ("orders.paid", 1)]
    assert sub.error is None
    await sub.close()


def _gateway(bus: RedisEventBus) -> Gateway:
    policy = PermissionPolicy.from_manifest(
        {
            "name": "gwr",
            "permissions": {},
            "events": {"publishes": ["gwr.done"], "subscribes": ["other.*"]},
        },
        root="/srv/gwr",
    )
    return Gateway(checker=PermissionChecker(policy), adapters=Adapters(events=bus))


async def test_the_gateway_filters_subscriptions_and_denies_undeclared_publishes(
    redis_url: str,
) -> None:
    bus = RedisEventBus(redis_url)
    gateway = _gateway(bus)
    watcher, seen = _collector()
    spy = await bus.subscribe("host", "*", watcher)  # sees everything that reaches Redis
    handler, got = _collector()
    await gateway.dispatch("events", "subscribe", {"topic": "other.*"}, handler=handler)
    for pattern in ("*", "other*", "gwr.*", "secret.*"):
        with pytest.raises(SuaveplanError) as info:
            await gateway.dispatch("events", "subscribe", {"topic": pattern}, handler=handler)
        assert info.value.code == "SAND_PERM_DENIED", pattern
    for topic in ("other.created", "gwr.other", "admin.reset"):
        with pytest.raises(SuaveplanError) as info:
            await gateway.dispatch("events", "publish", {"topic": topic, "payload": 1})
        assert info.value.code == "SAND_PERM_DENIED", topic
    await gateway.dispatch("events", "publish", {"topic": "gwr.done", "payload": {"ok": True}})
    await bus.publish("host", "other.created", 7)
    await bus.publish("host", "elsewhere.created", 8)
    await _until(lambda: len(seen) == 3 and got)
    # Denied publishes never reached Redis; the plugin got only what it subscribed to.
    assert seen == [("gwr.done", {"ok": True}), ("other.created", 7), ("elsewhere.created", 8)]
    assert got == [("other.created", 7)]
    await gateway.close()
    await spy.close()
    await bus.aclose()


async def test_closing_leaves_no_connection_or_task_behind(own_redis: tuple[str, Any]) -> None:
    url, _proc = own_redis
    tasks_before = asyncio.all_tasks()
    clients_before = await _clients(url)
    bus = RedisEventBus(url)
    gateway = _gateway(bus)
    handler, got = _collector()
    for _ in range(3):
        await gateway.dispatch("events", "subscribe", {"topic": "other.*"}, handler=handler)
    await bus.publish("host", "other.x", 1)
    await _until(lambda: len(got) == 3)
    assert await _clients(url) > clients_before
    await gateway.close()
    await bus.aclose()
    for _ in range(1000):  # polled inline: a helper task would itself be a task
        if asyncio.all_tasks() == tasks_before:
            break
        await asyncio.sleep(0.01)
    assert asyncio.all_tasks() == tasks_before

    async def drained() -> None:
        while await _clients(url) != clients_before:
            await asyncio.sleep(0.01)

    await asyncio.wait_for(drained(), 10)


async def test_a_server_that_goes_away_is_a_coded_error_not_a_hang(
    own_redis: tuple[str, subprocess.Popen[bytes]],
) -> None:
    url, proc = own_redis
    bus = RedisEventBus(url, timeout=1.0)
    handler, got = _collector()
    sub = await bus.subscribe("b", "gone.*", handler)
    await bus.publish("a", "gone.1", 1)
    await _until(lambda: got)
    proc.kill()
    proc.wait()
    with pytest.raises(SuaveplanError) as info:
        await asyncio.wait_for(bus.publish("a", "gone.2", 2), 10)
    assert info.value.code == "SAND_EVENTS_ERROR"
    await _until(lambda: not sub.active)
    assert sub.error is not None and sub.error.code == "SAND_EVENTS_ERROR"
    with pytest.raises(SuaveplanError) as info:
        await asyncio.wait_for(bus.subscribe("b", "gone.*", handler), 10)
    assert info.value.code == "SAND_EVENTS_ERROR"
    await asyncio.wait_for(sub.close(), 10)
    await asyncio.wait_for(bus.aclose(), 10)
    assert got == [("gone.1", 1)]


async def test_an_idle_subscription_outlives_the_socket_timeout(redis_url: str) -> None:
    bus = RedisEventBus(redis_url, timeout=0.3)
    handler, got = _collector()
    sub = await bus.subscribe("b", "idle.*", handler)
    await asyncio.sleep(1.0)
    assert sub.active
    await bus.publish("a", "idle.x", "late")
    await _until(lambda: got)
    assert got == [("idle.x", "late")]
    await sub.close()
    await bus.aclose()


async def test_a_lost_subscription_reaches_the_gateway_as_audit_metric_and_listener(
    own_redis: tuple[str, subprocess.Popen[bytes]], caplog: pytest.LogCaptureFixture
) -> None:
    url, proc = own_redis
    bus = RedisEventBus(url, timeout=1.0)
    policy = PermissionPolicy.from_manifest(
        {"name": "gwr", "events": {"subscribes": ["other.*"]}}, root="/srv/gwr"
    )
    metrics = InMemoryMetrics()
    audit = RecordingAudit()
    lost: list[tuple[str, str]] = []
    gateway = Gateway(
        checker=PermissionChecker(policy, metrics=metrics),
        adapters=Adapters(events=bus),
        audit=audit,
        on_subscription_lost=lambda topic, err: lost.append((topic, err.code)),
    )
    handler, got = _collector()
    await gateway.dispatch("events", "subscribe", {"topic": "other.*"}, handler=handler)
    await bus.publish("host", "other.one", 1)
    await _until(lambda: got)
    assert lost == []
    proc.kill()
    proc.wait()
    await _until(lambda: lost)
    assert lost == [("other.*", "SAND_EVENTS_ERROR")]
    row = audit.records[-1]
    assert (row.capability, row.operation, row.allowed) == ("events", "subscription_lost", True)
    assert row.outcome == "error:SAND_EVENTS_ERROR"
    assert row.resource == "other.*" and row.rule == "other.*"
    correlation = row.extra["correlation_id"]
    assert metrics.value(CAPABILITY_CALLS.name, capability="events", outcome="error") == 1
    warnings = [r for r in caplog.records if r.name == "suaveplan_sandbox.gateway"]
    assert [r.__dict__["suaveplan"]["correlation_id"] for r in warnings] == [correlation]
    assert all(r.exc_info is None for r in warnings)
    await asyncio.wait_for(gateway.close(), 10)
    await asyncio.wait_for(bus.aclose(), 10)
    assert lost == [("other.*", "SAND_EVENTS_ERROR")]  # reported once


async def test_a_subscription_closed_before_its_server_dies_reports_nothing(
    own_redis: tuple[str, subprocess.Popen[bytes]],
) -> None:
    url, proc = own_redis
    bus = RedisEventBus(url, timeout=1.0)
    handler, _got = _collector()
    sub = await bus.subscribe("b", "x.*", handler)
    lost: list[SuaveplanError] = []
    sub.on_lost(lost.append)
    await sub.close()
    proc.kill()
    proc.wait()
    await asyncio.sleep(0.2)
    assert lost == [] and sub.error is None
    await asyncio.wait_for(bus.aclose(), 10)


async def test_on_lost_registered_after_the_loss_is_called_at_once(
    own_redis: tuple[str, subprocess.Popen[bytes]],
) -> None:
    url, proc = own_redis
    bus = RedisEventBus(url, timeout=1.0)
    handler, _got = _collector()
    sub = await bus.subscribe("b", "x.*", handler)
    proc.kill()
    proc.wait()
    await _until(lambda: not sub.active)
    lost: list[SuaveplanError] = []
    sub.on_lost(lost.append)
    assert [e.code for e in lost] == ["SAND_EVENTS_ERROR"]
    await asyncio.wait_for(sub.close(), 10)
    await asyncio.wait_for(bus.aclose(), 10)
