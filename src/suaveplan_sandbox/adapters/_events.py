"""`InProcessEventBus`: the default events adapter, topic patterns as in the manifest."""

from __future__ import annotations

import asyncio
import logging
from typing import final

from suaveplan_sandbox.adapters._protocols import EventHandler
from suaveplan_sandbox.errors import WireValue
from suaveplan_sandbox.permissions._topic_rules import topic_matches

_LOG = logging.getLogger("suaveplan_sandbox.events")


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
        targets = [s for s in list(self._subs) if topic_matches(s.pattern, topic)]
        results = await asyncio.gather(
            *(s.handler(topic, payload) for s in targets), return_exceptions=True
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
