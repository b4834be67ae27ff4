"""`InProcessEventBus`: the default events adapter, topic patterns as in the manifest.

Payloads, for every bus alike (`encode_payload`/`decode_payload`, shared with
`RedisEventBus`): a payload must be a strict JSON value (`None`, `bool`, `int`, `float`
except NaN/infinity, `str`, lists and string-keyed dicts of those). Anything else (`bytes`,
a tuple key, a set, an object) is refused at `publish` with `SAND_INVALID_ARGUMENT` before
any subscriber sees it; a guest that must send bytes encodes them itself (base64). Each
subscriber receives its own decoded copy, so tuples arrive as lists on either bus and one
handler cannot mutate what another receives.

Hop depth, for every bus alike: `event_depth` holds the hop count of the event delivery whose
handling is making the current publish (0 for a plugin call or the host itself). The VM host
sets it around a plugin's `events` host call and drops a delivery deeper than
`MAX_EVENT_DEPTH`. An in-process bus runs each handler in a copy of the publisher's context,
so the count travels with it; a bus that crosses processes (`RedisEventBus`) writes it into
the message and sets it around the handler on the receiving side.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
from typing import Any, Final, final

from suaveplan_sandbox.adapters._protocols import EventHandler
from suaveplan_sandbox.errors import SuaveplanError, WireValue
from suaveplan_sandbox.permissions._topic_rules import topic_matches

_LOG = logging.getLogger("suaveplan_sandbox.events")

# A delivery more than this many hops from a plugin call or host publish is dropped (VM host).
MAX_EVENT_DEPTH: Final = 8
# The hop count of the delivery being handled where a publish happens (see the docstring).
event_depth: Final[contextvars.ContextVar[int]] = contextvars.ContextVar(
    "suaveplan_event_depth", default=0
)


def encode_payload(payload: object) -> str:
    """The payload as strict JSON text, or `SAND_INVALID_ARGUMENT` (the payload is not echoed)."""
    try:
        if not _string_keys(payload):
            raise TypeError("a dict key is not a string")
        return json.dumps(payload, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError):
        raise SuaveplanError(
            "SAND_INVALID_ARGUMENT",
            "event payloads must be JSON values (bytes are not: encode them, e.g. base64)",
            {"type": type(payload).__name__},
        ) from None


def _string_keys(value: object, depth: int = 0) -> bool:
    """`json.dumps` would silently turn int/float/bool/None keys into strings: refuse them."""
    if depth > 256:
        raise RecursionError
    if isinstance(value, dict):
        return all(isinstance(k, str) for k in value) and all(
            _string_keys(v, depth + 1) for v in value.values()
        )
    if isinstance(value, list | tuple):
        return all(_string_keys(v, depth + 1) for v in value)
    return True


def decode_payload(text: str | bytes) -> WireValue:
    """Parse a payload `encode_payload` produced; raises `ValueError` on anything else."""
    try:
        value: WireValue = json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        # Nesting deeper than the interpreter's stack (`[[[[...`) is junk, not a crash.
        raise ValueError("payload nested too deeply") from None
    return value


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


async def _deliver(handler: EventHandler, topic: str, data: str) -> None:
    # Each subscriber's copy is decoded when its turn comes, not all before the first runs:
    # a plugin holding many subscriptions to one topic would otherwise have every publish
    # hold one decoded copy per subscriber at once (a 16 MiB payload, 256 times over).
    await handler(topic, decode_payload(data))


@final
class _InProcessSubscription:
    def __init__(self, bus: InProcessEventBus, pattern: str, handler: EventHandler) -> None:
        self._bus = bus
        self.pattern = pattern
        self.handler = handler

    async def close(self) -> None:
        self._bus._subs.discard(self)


@final
class InProcessEventBus:
    """Delivers each published event to every matching subscriber, awaiting the handlers.

    A failing handler is logged (topic and exception type, never the payload) and does not
    stop delivery to the others.
    """

    def __init__(self) -> None:
        self._subs: set[_InProcessSubscription] = set()

    async def publish(self, plugin: str, topic: str, payload: WireValue) -> None:
        data = encode_payload(payload)
        targets = [s for s in list(self._subs) if topic_matches(s.pattern, topic)]
        results = await asyncio.gather(
            *(_deliver(s.handler, topic, data) for s in targets), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                _LOG.warning("event handler failed: %s", type(result).__name__)

    async def subscribe(
        self, plugin: str, pattern: str, handler: EventHandler
    ) -> _InProcessSubscription:
        sub = _InProcessSubscription(self, pattern, handler)
        self._subs.add(sub)
        return sub
