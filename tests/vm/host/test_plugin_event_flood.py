"""A plugin cannot make the host deliver events without end or queue them without bound.

An event published while a sandbox handles an event is one hop deeper than that one; a
delivery deeper than `MAX_EVENT_DEPTH` is dropped, so a subscriber re-publishing to its own
topic, or two sandboxes answering each other, stop. A sandbox holds at most
`MAX_QUEUED_EVENTS` deliveries (and `MAX_QUEUED_EVENT_BYTES` of them) waiting for its worker;
more are dropped. Drops are counted in `events_dropped` and reported in throttled warnings. A plugin subscribes to at most
`MAX_SUBSCRIPTIONS` topics: each is a subscription on the host's bus, which every publish scans.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

import psutil
import pytest

from suaveplan_sandbox.adapters import Adapters, InProcessEventBus
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.metrics import EVENTS_DROPPED, InMemoryMetrics
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.testing import InMemoryEvents
from suaveplan_sandbox.vm import VmSandbox, create_vm_sandbox
from suaveplan_sandbox.vm._guest._runtime import MAX_SUBSCRIPTIONS
from suaveplan_sandbox.vm._sandbox import (
    MAX_EVENT_DEPTH,
    MAX_QUEUED_EVENT_BYTES,
    MAX_QUEUED_EVENTS,
)
from suaveplan_sandbox.vm._zygote import fork_server

ECHO = """
from suaveplan import events


@events.subscribe("loop.*")
def again(payload):
    events.publish("loop.again", payload)


def start():
    events.publish("loop.start", 0)


def noop():
    return None
"""

FAN_OUT = """
from suaveplan import events


@events.subscribe("fan.*")
def twice(payload):
    events.publish("fan.a", payload)
    events.publish("fan.b", payload)


def start():
    events.publish("fan.start", 0)


def noop():
    return None
"""

PING = """
from suaveplan import events


@events.subscribe("ping")
def answer(payload):
    events.publish("pong", payload + 1)


def noop():
    return None
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


def noop():
    return None
"""

FLOOD = """
from suaveplan import events

SEEN = []


@events.subscribe("self.*")
def seen(payload):
    SEEN.append(payload)


def flood(n, size=0):
    for i in range(n):
        events.publish("self.x", "y" * size if size else i)


def count():
    return len(SEEN)


def noop():
    return None
"""

LOGGER = "suaveplan_sandbox.vm"


async def _sandbox(
    tmp: Path,
    name: str,
    source: str,
    bus: object,
    events: dict[str, list[str]],
    *,
    metrics: InMemoryMetrics | None = None,
) -> VmSandbox:
    (tmp / f"{name}.py").write_text(source)
    policy = PermissionPolicy.from_manifest({"name": name, "events": events}, root=tmp)
    return await create_vm_sandbox(
        plugin_module_path=tmp / f"{name}.py",
        policy=policy,
        proxies=Adapters(events=bus),  # type: ignore[arg-type]
        metrics=metrics if metrics is not None else InMemoryMetrics(),
    )


async def _settled(*sandboxes: VmSandbox, rounds: int = 200) -> None:
    """Wait until no sandbox delivers any more events: a `noop` call queues behind every
    delivery already queued, so two rounds in a row with no new delivery mean quiet."""
    last = -1
    for _ in range(rounds):
        for sb in sandboxes:
            await sb.call("noop")
        now = sum(sb.events_delivered for sb in sandboxes)
        if now == last:
            return
        last = now
    raise AssertionError(f"still delivering events after {rounds} rounds ({last} delivered)")


def _dropped_in_warnings(caplog: pytest.LogCaptureFixture) -> dict[str, int]:
    out: dict[str, int] = {}
    for record in caplog.records:
        fields = getattr(record, "suaveplan", {})
        if record.name == LOGGER and "dropped_events" in fields:
            out[fields["reason"]] = out.get(fields["reason"], 0) + fields["dropped_events"]
    return out


@pytest.mark.parametrize("bus_kind", ["fake", "in-process"])
async def test_a_subscriber_republishing_to_its_own_topic_stops_at_the_depth_limit(
    tmp_path: Path, bus_kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    bus = InMemoryEvents() if bus_kind == "fake" else InProcessEventBus()
    events = {"subscribes": ["loop.*"], "publishes": ["loop.*"]}
    async with await _sandbox(tmp_path, "echo", ECHO, bus, events) as sb:
        await sb.call("start")
        await _settled(sb)
        assert sb.events_delivered == MAX_EVENT_DEPTH
        assert sb.events_dropped == 1
        assert sb.state == "idle"
    assert _dropped_in_warnings(caplog) == {"event-depth": 1}


@pytest.mark.parametrize("bus_kind", ["fake", "in-process"])
def test_the_depth_limit_holds_on_uvloop(tmp_path: Path, bus_kind: str) -> None:
    # uvloop runs reader callbacks and tasks in contexts of its own making: the hop count
    # must still travel from the host call through the bus to the delivery.
    import uvloop

    async def main() -> None:
        assert isinstance(asyncio.get_running_loop(), uvloop.Loop)
        bus = InMemoryEvents() if bus_kind == "fake" else InProcessEventBus()
        events = {"subscribes": ["loop.*"], "publishes": ["loop.*"]}
        async with await _sandbox(tmp_path, "echo", ECHO, bus, events) as sb:
            await sb.call("start")
            await _settled(sb)
            assert (sb.events_delivered, sb.events_dropped) == (MAX_EVENT_DEPTH, 1)

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())


async def test_a_subscriber_fanning_out_is_bounded_by_the_depth_limit(tmp_path: Path) -> None:
    bus = InMemoryEvents()
    events = {"subscribes": ["fan.*"], "publishes": ["fan.*"]}
    async with await _sandbox(tmp_path, "fan", FAN_OUT, bus, events) as sb:
        await sb.call("start")
        await _settled(sb)
        # Depth d holds 2**(d-1) deliveries; the 2**MAX_EVENT_DEPTH one level deeper drop.
        assert sb.events_delivered == 2**MAX_EVENT_DEPTH - 1
        assert sb.events_dropped == 2**MAX_EVENT_DEPTH


@pytest.mark.parametrize("bus_kind", ["fake", "in-process"])
async def test_two_sandboxes_answering_each_other_stop_at_the_depth_limit(
    tmp_path: Path, bus_kind: str
) -> None:
    bus = InMemoryEvents() if bus_kind == "fake" else InProcessEventBus()
    async with (
        await _sandbox(
            tmp_path, "ping", PING, bus, {"subscribes": ["ping"], "publishes": ["pong"]}
        ) as ping,
        await _sandbox(
            tmp_path, "pong", PONG, bus, {"subscribes": ["pong"], "publishes": ["ping"]}
        ) as pong,
    ):
        await pong.call("start")
        await _settled(ping, pong)
        assert ping.events_delivered + pong.events_delivered == MAX_EVENT_DEPTH
        assert ping.events_dropped + pong.events_dropped == 1
        assert await pong.call("last") == list(range(1, MAX_EVENT_DEPTH, 2))


async def test_an_event_the_host_publishes_starts_a_fresh_chain(tmp_path: Path) -> None:
    bus = InMemoryEvents()
    events = {"subscribes": ["loop.*"], "publishes": ["loop.*"]}
    async with await _sandbox(tmp_path, "echo", ECHO, bus, events) as sb:
        for round_ in range(1, 4):
            await bus.publish("host", "loop.host", round_)
            await _settled(sb)
            assert sb.events_delivered == round_ * MAX_EVENT_DEPTH
            assert sb.events_dropped == round_


async def test_a_call_publishing_more_events_than_the_queue_holds_drops_the_rest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    extra = 25
    bus = InMemoryEvents()
    events = {"subscribes": ["self.*"], "publishes": ["self.*"]}
    metrics = InMemoryMetrics()
    async with await _sandbox(tmp_path, "flood", FLOOD, bus, events, metrics=metrics) as sb:
        # Every delivery waits behind the call publishing it: all of them queue at once.
        await sb.call("flood", MAX_QUEUED_EVENTS + extra)
        await _settled(sb)
        assert sb.events_delivered == MAX_QUEUED_EVENTS
        assert sb.events_dropped == extra
        assert (
            metrics.value(EVENTS_DROPPED.name, plugin="flood", reason="event-queue-full") == extra
        )
        assert await sb.call("count") == MAX_QUEUED_EVENTS
        assert sb.state == "idle"
        # Dropping is throttled: far fewer warnings than drops, every drop counted in them.
        warnings = [r for r in caplog.records if "dropped_events" in getattr(r, "suaveplan", {})]
        assert len(warnings) < extra
    assert _dropped_in_warnings(caplog) == {"event-queue-full": extra}


async def test_queued_events_are_bounded_in_bytes(tmp_path: Path) -> None:
    size = 4 * 1024 * 1024
    fits = MAX_QUEUED_EVENT_BYTES // (size + 256)  # a frame is the payload and < 256 bytes
    extra = 2
    bus = InMemoryEvents()
    events = {"subscribes": ["self.*"], "publishes": ["self.*"]}
    async with await _sandbox(tmp_path, "flood", FLOOD, bus, events) as sb:
        await sb.call("flood", fits + extra, size)
        await _settled(sb)
        assert sb.events_delivered == fits
        assert sb.events_dropped == extra


async def test_the_queue_takes_events_again_once_it_has_drained(tmp_path: Path) -> None:
    bus = InMemoryEvents()
    events = {"subscribes": ["self.*"], "publishes": ["self.*"]}
    async with await _sandbox(tmp_path, "flood", FLOOD, bus, events) as sb:
        await sb.call("flood", MAX_QUEUED_EVENTS + 1)
        await _settled(sb)
        await sb.call("flood", MAX_QUEUED_EVENTS)
        await _settled(sb)
        assert sb.events_delivered == 2 * MAX_QUEUED_EVENTS
        assert sb.events_dropped == 1


FAILING = """
from suaveplan import events


@events.subscribe("self.*")
def fail(payload):
    raise ValueError("no")


def flood(n):
    for i in range(n):
        events.publish("self.x", i)


def noop():
    return None
"""


async def test_failing_deliveries_are_counted_and_reported_in_throttled_warnings(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    n = 60
    bus = InMemoryEvents()
    events = {"subscribes": ["self.*"], "publishes": ["self.*"]}
    async with await _sandbox(tmp_path, "failing", FAILING, bus, events) as sb:
        await sb.call("flood", n)
        await _settled(sb)
        assert sb.events_delivered == n
        assert sb.events_failed == n
        assert sb.state == "idle"
        reports = [r for r in caplog.records if "failed_events" in getattr(r, "suaveplan", {})]
        assert len(reports) < n
    reports = [r for r in caplog.records if "failed_events" in getattr(r, "suaveplan", {})]
    assert {r.suaveplan["reason"] for r in reports} == {"SAND_VM_PLUGIN_ERROR"}  # type: ignore[attr-defined]
    assert sum(r.suaveplan["failed_events"] for r in reports) == n  # type: ignore[attr-defined]


async def test_a_plugin_subscribing_outside_its_manifest_fails_without_leaking_its_worker(
    tmp_path: Path,
) -> None:
    (tmp_path / "sub.py").write_text(
        "from suaveplan import events\n\n@events.subscribe('other.topic')\ndef h(p):\n    pass\n"
    )
    policy = PermissionPolicy.from_manifest(
        {"name": "sub", "events": {"subscribes": ["orders.*"]}}, root=tmp_path
    )

    def workers() -> set[int]:
        alive = set()
        for proc in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                if proc.status() != psutil.STATUS_ZOMBIE:
                    alive.add(proc.pid)
        return alive

    fork_server().ping()  # started before counting: it is a child too
    for _ in range(3):
        before = workers()
        with pytest.raises(SuaveplanError) as info:
            await create_vm_sandbox(plugin_module_path=tmp_path / "sub.py", policy=policy)
        assert info.value.code == "SAND_PERM_DENIED"
        for _ in range(200):  # the killed worker is reaped by its fork server
            if not workers() - before:
                break
            await asyncio.sleep(0.01)
        assert not workers() - before


def _many_subscriptions(n: int) -> str:
    return (
        "from suaveplan import events\n\n"
        "def h(p):\n    pass\n\n"
        f"for i in range({n}):\n"
        "    events.subscribe('orders.%d' % i)(h)\n\n"
        "def noop():\n    return None\n"
    )


async def test_a_plugin_may_subscribe_to_up_to_the_subscription_limit(tmp_path: Path) -> None:
    bus = InProcessEventBus()
    source = _many_subscriptions(MAX_SUBSCRIPTIONS)
    async with await _sandbox(tmp_path, "subs", source, bus, {"subscribes": ["orders.*"]}) as sb:
        assert len(sb.subscriptions) == MAX_SUBSCRIPTIONS
        await bus.publish("host", f"orders.{MAX_SUBSCRIPTIONS - 1}", 1)
        await _settled(sb)
        assert sb.events_delivered == 1


async def test_a_plugin_subscribing_to_more_topics_than_the_limit_is_not_created(
    tmp_path: Path,
) -> None:
    source = _many_subscriptions(MAX_SUBSCRIPTIONS + 1)
    with pytest.raises(SuaveplanError) as info:
        await _sandbox(tmp_path, "subs", source, InProcessEventBus(), {"subscribes": ["orders.*"]})
    assert info.value.code == "SAND_VM_PLUGIN_ERROR"
    assert info.value.details["type"] == "ValueError"


# Run without the interpreter layer (as the escape corpus does): the plugin plays a worker that
# escaped it and announces more subscriptions than the guest runtime would ever allow.
FORGED_READY = """
import gc
from suaveplan_sandbox.protocol import Ready, encode

for obj in gc.get_objects():
    if type(obj).__name__ == "socket" and hasattr(obj, "sendall"):
        topics = TOPICS
        obj.sendall(encode(Ready(subscriptions=topics)))
        break
"""


@pytest.mark.parametrize(
    ("topics", "why"),
    [
        (f'["orders.%d" % i for i in range({MAX_SUBSCRIPTIONS + 1})]', "too-many-subscriptions"),
        # One topic many times: each copy would be one more delivery of every event.
        ('["orders.new"] * 64', "duplicate-subscriptions"),
    ],
    ids=["too-many", "duplicated"],
)
async def test_a_worker_announcing_more_subscriptions_than_the_limit_is_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, topics: str, why: str
) -> None:
    from suaveplan_sandbox.vm import _sandbox as vm_sandbox_module
    from suaveplan_sandbox.vm._guest import PluginBundle, load_plugin

    def unchecked(path: str | Path) -> PluginBundle:
        return load_plugin(path, _without_interpreter_layer=True)

    monkeypatch.setattr(vm_sandbox_module, "load_plugin", unchecked)
    bus = InProcessEventBus()
    with pytest.raises(SuaveplanError) as info:
        await _sandbox(
            tmp_path,
            "forged",
            FORGED_READY.replace("TOPICS", topics),
            bus,
            {"subscribes": ["orders.*"]},
        )
    assert info.value.code == "SAND_VM_WORKER_CRASHED"
    assert info.value.details["why"] == why
    assert bus._subs == set()
