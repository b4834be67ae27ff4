"""Both event buses (and the `testing.InMemoryEvents` fake hosts test with) accept and refuse exactly the same payloads, with the same coded error.

The rule (documented in `docs/hosts.md` and `adapters/_events.py`): strict JSON values only;
bytes, NaN/infinity, non-string dict keys and other objects are refused at `publish` with
`SAND_INVALID_ARGUMENT`, and no subscriber sees anything. Every subscriber gets its own
decoded copy, so a tuple arrives as a list on either bus.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from suaveplan_sandbox.adapters import Adapters, InProcessEventBus, RedisEventBus
from suaveplan_sandbox.errors import SuaveplanError, WireValue
from suaveplan_sandbox.gateway import Gateway
from suaveplan_sandbox.permissions import PermissionChecker, PermissionPolicy
from suaveplan_sandbox.testing import InMemoryEvents

Bus = InProcessEventBus | RedisEventBus | InMemoryEvents


@pytest.fixture(params=["in-process", "redis", "testing-fake"])
async def bus(request: pytest.FixtureRequest) -> AsyncIterator[Bus]:
    if request.param == "in-process":
        yield InProcessEventBus()
        return
    if request.param == "testing-fake":
        yield InMemoryEvents()
        return
    redis_url: str = request.getfixturevalue("redis_url")
    redis_bus = RedisEventBus(redis_url)
    try:
        yield redis_bus
    finally:
        await redis_bus.aclose()


async def _until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    async def poll() -> None:
        while not predicate():
            await asyncio.sleep(0.01)

    await asyncio.wait_for(poll(), timeout)


REFUSED: list[tuple[str, Any]] = [
    ("bytes", b"\x00\x01raw"),
    ("bytes nested", {"blob": b"abc"}),
    ("bytearray", bytearray(b"x")),
    ("nan", math.nan),
    ("infinity", [math.inf]),
    ("int key", {1: "one"}),
    ("none key", {"ok": {None: 1}}),
    ("set", {1, 2}),
    ("object", object()),
]


@pytest.mark.parametrize(("label", "payload"), REFUSED, ids=[r[0] for r in REFUSED])
async def test_non_json_payloads_are_refused_identically(
    bus: Bus, label: str, payload: Any
) -> None:
    got: list[tuple[str, WireValue]] = []

    async def handler(topic: str, value: WireValue) -> None:
        got.append((topic, value))

    sub = await bus.subscribe("b", "pay.*", handler)
    with pytest.raises(SuaveplanError) as info:
        await bus.publish("a", "pay.bad", payload)
    assert info.value.code == "SAND_INVALID_ARGUMENT"
    assert info.value.details == {"type": type(payload).__name__}
    assert "abc" not in str(info.value) and "raw" not in str(info.value)
    await bus.publish("a", "pay.marker", None)  # ordering: the marker is the first delivery
    await _until(lambda: bool(got))
    assert got == [("pay.marker", None)]
    await sub.close()


ACCEPTED: list[tuple[Any, WireValue]] = [
    (None, None),
    (True, True),
    (-(2**62), -(2**62)),
    (1.5, 1.5),
    ("ünïcode \u2028", "ünïcode \u2028"),
    ((1, "two"), [1, "two"]),
    ({"a": [1, {"b": None}]}, {"a": [1, {"b": None}]}),
]


async def test_json_payloads_arrive_the_same_way_on_both_buses_as_private_copies(
    bus: Bus,
) -> None:
    first: list[WireValue] = []
    second: list[WireValue] = []

    async def mutate(topic: str, value: WireValue) -> None:
        first.append(value)
        if isinstance(value, dict):
            value["mutated"] = True

    async def keep(topic: str, value: WireValue) -> None:
        second.append(value)

    subs = [await bus.subscribe("b", "ok.*", mutate), await bus.subscribe("c", "ok.*", keep)]
    for payload, _expected in ACCEPTED:
        await bus.publish("a", "ok.x", payload)
    await _until(lambda: len(first) == len(second) == len(ACCEPTED))
    assert second == [expected for _payload, expected in ACCEPTED]
    for sub in subs:
        await sub.close()


async def test_a_guest_publishing_bytes_through_the_gateway_gets_the_coded_refusal() -> None:
    bus = InProcessEventBus()
    policy = PermissionPolicy.from_manifest(
        {"name": "pay", "events": {"publishes": ["pay.*"]}}, root="/srv/pay"
    )
    gateway = Gateway(checker=PermissionChecker(policy), adapters=Adapters(events=bus))
    with pytest.raises(SuaveplanError) as info:
        await gateway.dispatch("events", "publish", {"topic": "pay.x", "payload": b"\xff"})
    assert info.value.code == "SAND_INVALID_ARGUMENT"
    await gateway.close()
