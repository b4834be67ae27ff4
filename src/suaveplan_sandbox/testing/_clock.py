"""`FakeClock`: time that moves only when a test says so."""

from __future__ import annotations

from typing import final


@final
class FakeClock:
    """A manual monotonic clock for budgets and gateways. `advance()` moves it forward."""

    __slots__ = ("_now",)

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a monotonic clock never goes backwards")
        self._now += seconds

    def advance_ms(self, milliseconds: float) -> None:
        self.advance(milliseconds / 1000.0)
