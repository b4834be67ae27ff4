"""Red-team checks on the events buses, the secrets adapters and the audit sink, from a
hostile plugin's side (and a second plugin colluding with it on the same bus)."""

from __future__ import annotations

import asyncio
import json
import logging
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from suaveplan_sandbox.adapters import Adapters, JsonLinesAudit
from suaveplan_sandbox.adapters._events import InProcessEventBus
from suaveplan_sandbox.adapters._redis_events import RedisEventBus, _glob
from suaveplan_sandbox.adapters._secrets import DirectorySecrets
from suaveplan_sandbox.errors import SuaveplanError, WireValue
from suaveplan_sandbox.gateway import Gateway
from suaveplan_sandbox.permissions import PermissionChecker, PermissionPolicy
from suaveplan_sandbox.permissions._topic_rules import TopicRuleSet, topic_matches


async def test_fan_out_holds_one_decoded_copy_at_a_time_not_one_per_subscriber() -> None:
    # A colluding plugin with many subscriptions on one topic (a worker's `Ready` may list a
    # topic many times) must not make one publish hold a decoded copy per subscriber at once:
    # a 16 MiB frame's payload times 256 subscriptions is gigabytes in the host.
    bus = InProcessEventBus()
    subscribers = 64
    payload: WireValue = ["x" * 16 for _ in range(5_000)]
    delivered = 0

    async def handler(topic: str, got: WireValue) -> None:
        nonlocal delivered
        delivered += 1  # like the VM host's: encode it for the worker, keep nothing

    for _ in range(subscribers):
        await bus.subscribe("colluder", "bomb.topic", handler)
    tracemalloc.start()
    try:
        await bus.publish("hostile", "bomb.topic", payload)  # warm-up
        tracemalloc.reset_peak()
        base, _ = tracemalloc.get_traced_memory()
        await bus.publish("hostile", "bomb.topic", payload)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert delivered == 2 * subscribers
    one_copy = 5_000 * 70  # a list slot and a 16-character str per item, roughly
    assert peak - base < 8 * one_copy, (peak - base, one_copy)


async def test_each_subscriber_still_gets_its_own_copy() -> None:
    bus = InProcessEventBus()
    seen: list[WireValue] = []

    async def mutate(topic: str, got: WireValue) -> None:
        assert isinstance(got, dict)
        got["owned"] = True
        seen.append(got)

    for _ in range(3):
        await bus.subscribe("b", "t.*", mutate)
    await bus.publish("a", "t.x", {"owned": False})
    assert seen == [{"owned": True}] * 3
    assert len({id(v) for v in seen}) == 3


@pytest.mark.parametrize("pattern", ["a?b", "a[bc]", "a\\*", "a]b", "a\\", "x[!a]*"])
def test_redis_glob_escapes_every_metacharacter_but_star(pattern: str) -> None:
    out = _glob(pattern)
    i = 0
    while i < len(out):  # every `?`, `[`, `]`, `\` is escaped; a bare `*` stays a star
        if out[i] == "\\":
            assert out[i + 1] in "?[]\\"
            i += 2
            continue
        assert out[i] not in "?[]"
        i += 1


@pytest.mark.parametrize(
    ("rule", "topic"),
    [
        ("orders.*", "orders"),  # `*` needs the dot before it
        ("orders.*", "Orders.x"),  # case-sensitive
        ("orders.*", "orders\u2024x"),  # one dot leader is not a dot
        ("a.b", "a.b\x00"),
        ("a.b", "a.b\n"),
    ],
)
def test_topic_rules_match_exactly_what_they_say(rule: str, topic: str) -> None:
    assert TopicRuleSet([rule]).match(topic) is None
    assert not topic_matches(rule, topic)


def test_a_subscribe_pattern_with_a_star_must_be_a_rule_itself() -> None:
    rules = TopicRuleSet(["orders.*"])
    assert rules.match("orders.*") == "orders.*"
    assert rules.match("*") is None
    assert rules.match("orders.**") is None
    assert rules.match("orders.*.x") is None


async def test_directory_secrets_do_not_follow_a_data_link_up_and_out(tmp_path: Path) -> None:
    (tmp_path / "tok").write_text("OUTSIDE")
    mount = tmp_path / "mnt"
    mount.mkdir()
    (mount / "tok").symlink_to("..data/tok")
    (mount / "..data").symlink_to("..")
    with pytest.raises(SuaveplanError) as info:
        await DirectorySecrets(mount).get("tok")
    assert info.value.code == "SAND_SECRET_UNAVAILABLE"
    assert "OUTSIDE" not in repr(info.value) + repr(info.value.__cause__)


@pytest.mark.parametrize("name", ["../tok", "a/../../tok", "tok\x00", ".tok", ""])
async def test_directory_secrets_refuse_path_like_names(tmp_path: Path, name: str) -> None:
    (tmp_path / "tok").write_text("OUTSIDE")
    mount = tmp_path / "mnt"
    mount.mkdir()
    with pytest.raises(SuaveplanError) as info:
        await DirectorySecrets(mount).get(name)
    assert info.value.code == "SAND_SECRET_UNAVAILABLE"


async def _until(predicate: Any, timeout: float = 10.0) -> None:
    async def poll() -> None:
        while not predicate():
            await asyncio.sleep(0.01)

    await asyncio.wait_for(poll(), timeout)


async def test_redis_delivers_only_what_the_manifest_pattern_matches(redis_url: str) -> None:
    # A concrete subscribe topic holding Redis glob characters (granted by a rule `a.*`) is a
    # literal channel on Redis, never a wider pattern.
    bus = RedisEventBus(redis_url)
    got: list[tuple[str, WireValue]] = []

    async def handler(topic: str, payload: WireValue) -> None:
        got.append((topic, payload))

    subs = [await bus.subscribe("b", p, handler) for p in ("a.[bc]", "a.?", "a.\\x")]
    for topic in ("a.b", "a.c", "a.x", "a.\\x"):
        await bus.publish("a", topic, topic)
    await bus.publish("a", "a.[bc]", "literal")
    await _until(lambda: len(got) >= 2)
    await asyncio.sleep(0.1)
    assert sorted(got) == [("a.[bc]", "literal"), ("a.\\x", "a.\\x")]
    for sub in subs:
        await sub.close()
    await bus.aclose()


async def test_a_plugin_chosen_topic_stays_on_one_escaped_audit_line() -> None:
    policy = PermissionPolicy.from_manifest(
        {"name": "inject", "permissions": {}, "events": {"publishes": ["a.*"]}},
        root="/srv/inject",
    )
    lines: list[str] = []

    class _Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger("test.redteam.audit")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.addHandler(_Keep())
    gateway = Gateway(
        checker=PermissionChecker(policy),
        adapters=Adapters(events=InProcessEventBus()),
        audit=JsonLinesAudit(logger, include_resource=True),
    )
    forged = 'a.x\n{"decision":"allow","plugin":"victim"}\u2028\x1b[2J'
    await gateway.dispatch("events", "publish", {"topic": forged, "payload": 1})
    with pytest.raises(SuaveplanError):  # over the topic length: denied, never written out
        await gateway.dispatch("events", "publish", {"topic": "a." + "x" * 10_000})
    assert len(lines) == 2
    assert all(line.isascii() and line.isprintable() for line in lines)
    assert json.loads(lines[0])["resource"] == forged
    assert len(lines[1]) < 400
