"""An injectable monotonic clock, so budgets are testable without sleeping."""

from __future__ import annotations

import time
from typing import Protocol, final


class Clock(Protocol):
    """Monotonic seconds. Only differences between readings are meaningful."""

    def now(self) -> float: ...


@final
class MonotonicClock:
    """The real clock: `time.monotonic()`."""

    __slots__ = ()

    def now(self) -> float:
        return time.monotonic()
