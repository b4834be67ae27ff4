"""Events published on the host's bus reach a plugin's subscribers, each delivery checked."""

from __future__ import annotations

from pathlib import Path

from suaveplan_sandbox.adapters import Adapters, EventHandler
from suaveplan_sandbox.errors import WireValue
from suaveplan_sandbox.metrics import PERMISSION_DENIED, InMemoryMetrics
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.testing import InMemoryEvents, InMemoryFs
from suaveplan_sandbox.vm import VmSandbox, create_vm_sandbox

LISTENER = """
from suaveplan import events, fs

SEEN = []


@events.subscribe("orders.*")
def on_order(payload):
    SEEN.append(payload)


@events.subscribe("audit.*")
def on_audit(payload):
    fs.write_text("./data/audit.txt", str(payload))


def seen():
    return SEEN


def echo_self(payload):
    events.publish("orders.self", payload)
    return "published"
"""

PUBLISHER = """
from suaveplan import events


def pub(topic, payload):
    events.publish(topic, payload)
"""


def _policy(tmp: Path, name: str, events: dict[str, list[str]]) -> PermissionPolicy:
    return PermissionPolicy.from_manifest(
        {"name": name, "permissions": {"fs": ["rw:./data/*"]}, "events": events}, root=tmp
    )


async def _listener(
    tmp: Path, bus: object, metrics: InMemoryMetrics, fs: InMemoryFs | None = None
) -> VmSandbox:
    (tmp / "listener.py").write_text(LISTENER)
    policy = _policy(
        tmp, "listener", {"subscribes": ["orders.*", "audit.*"], "publishes": ["orders.*"]}
    )
    return await create_vm_sandbox(
        plugin_module_path=tmp / "listener.py",
        policy=policy,
        proxies=Adapters(events=bus, fs=fs or InMemoryFs()),  # type: ignore[arg-type]
        metrics=metrics,
    )


async def test_an_event_the_host_publishes_reaches_the_plugins_subscriber(tmp_path: Path) -> None:
    bus = InMemoryEvents()
    async with await _listener(tmp_path, bus, InMemoryMetrics()) as sb:
        assert sb.subscriptions == ["audit.*", "orders.*"]
        await bus.publish("host", "orders.created", {"id": 1})
        await bus.publish("host", "orders.paid", {"id": 1, "paid": True})
        assert await sb.call("seen") == [{"id": 1}, {"id": 1, "paid": True}]
        assert sb.events_delivered == 2


async def test_an_event_another_plugin_publishes_on_the_same_bus_is_delivered(
    tmp_path: Path,
) -> None:
    bus = InMemoryEvents()
    (tmp_path / "publisher.py").write_text(PUBLISHER)
    pub_policy = _policy(tmp_path, "publisher", {"publishes": ["orders.*"]})
    async with (
        await _listener(tmp_path, bus, InMemoryMetrics()) as listener,
        await create_vm_sandbox(
            plugin_module_path=tmp_path / "publisher.py",
            policy=pub_policy,
            proxies=Adapters(events=bus),
        ) as publisher,
    ):
        await publisher.call("pub", "orders.shipped", [1, 2])
        assert bus.published == [("publisher", "orders.shipped", [1, 2])]
        assert await listener.call("seen") == [[1, 2]]


async def test_a_subscriber_can_use_its_proxies_while_handling_an_event(tmp_path: Path) -> None:
    bus, fs = InMemoryEvents(), InMemoryFs()
    async with await _listener(tmp_path, bus, InMemoryMetrics(), fs) as sb:
        await bus.publish("host", "audit.login", "alice")
        assert await sb.call("seen") == []
        assert fs.files["data/audit.txt"] == b"alice"
        assert sb.state == "idle"


async def test_a_plugin_publishing_to_its_own_subscription_does_not_wait_on_itself(
    tmp_path: Path,
) -> None:
    bus = InMemoryEvents()
    async with await _listener(tmp_path, bus, InMemoryMetrics()) as sb:
        assert await sb.call("echo_self", "me") == "published"
        assert await sb.call("seen") == ["me"]


class BroadcastBus:
    """A careless host bus: every event goes to every subscriber, whatever its pattern."""

    def __init__(self) -> None:
        self.handlers: list[EventHandler] = []

    async def publish(self, plugin: str, topic: str, payload: WireValue) -> None:
        for handler in list(self.handlers):
            await handler(topic, payload)

    async def subscribe(self, plugin: str, pattern: str, handler: EventHandler) -> object:
        self.handlers.append(handler)

        class _Sub:
            async def close(self) -> None:
                pass

        return _Sub()


async def test_a_delivery_outside_events_subscribes_never_reaches_the_guest_and_is_counted(
    tmp_path: Path,
) -> None:
    bus, metrics = BroadcastBus(), InMemoryMetrics()
    async with await _listener(tmp_path, bus, metrics) as sb:
        await bus.publish("host", "payroll.salaries", {"ceo": 10**6})
        await bus.publish("host", "orders.created", {"id": 2})
        # Two subscriptions each got both events: only orders.created on orders.* passes.
        assert await sb.call("seen") == [{"id": 2}]
        assert sb.events_delivered == 1
        assert sb.events_denied == 3
        assert (
            metrics.value(PERMISSION_DENIED.name, capability="events", reason="event-not-declared")
            == 3
        )


async def test_a_failing_subscriber_is_logged_and_the_sandbox_carries_on(tmp_path: Path) -> None:
    bus = InMemoryEvents()
    (tmp_path / "p.py").write_text(
        "from suaveplan import events\n\n"
        "@events.subscribe('orders.*')\ndef on(p):\n    raise ValueError('no')\n\n"
        "def ok():\n    return 'ok'\n"
    )
    policy = _policy(tmp_path, "failing", {"subscribes": ["orders.*"]})
    async with await create_vm_sandbox(
        plugin_module_path=tmp_path / "p.py", policy=policy, proxies=Adapters(events=bus)
    ) as sb:
        await bus.publish("host", "orders.x", None)
        assert await sb.call("ok") == "ok"
        assert sb.events_delivered == 1
        assert sb.state == "idle"


def test_a_bus_shared_with_a_blocking_sandbox_delivers_across_threads(tmp_path: Path) -> None:
    import asyncio

    from suaveplan_sandbox.vm import create_vm_sandbox_sync

    bus = InMemoryEvents()
    (tmp_path / "listener.py").write_text(LISTENER)
    policy = _policy(tmp_path, "listener", {"subscribes": ["orders.*", "audit.*"]})
    with create_vm_sandbox_sync(
        plugin_module_path=tmp_path / "listener.py",
        policy=policy,
        proxies=Adapters(events=bus, fs=InMemoryFs()),
    ) as sb:
        # Published from this thread's loop; the sandbox's loop runs on its own thread.
        asyncio.run(bus.publish("host", "orders.created", {"id": 7}))
        assert sb.call("seen") == [{"id": 7}]
