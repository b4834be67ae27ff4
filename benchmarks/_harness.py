"""Shared measurement helpers. The machine is noisy, so we report ratios, never gate on times."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import final


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class BenchRow:
    """One figure: `value_s` against `baseline_s` measured in the same process and run."""

    name: str
    value_s: float
    baseline_name: str
    baseline_s: float
    target: str
    ok: bool

    @property
    def ratio(self) -> float:
        return self.value_s / self.baseline_s if self.baseline_s > 0 else float("inf")


def _autorange(fn: Callable[[], object]) -> int:
    number = 1
    while True:
        start = time.perf_counter()
        for _ in range(number):
            fn()
        if time.perf_counter() - start >= 0.02 or number >= 1_000_000:
            return number
        number *= 4


def measure(fn: Callable[[], object], *, number: int | None = None, repeat: int = 5) -> float:
    """Median seconds per call of `fn` over `repeat` batches of `number` calls."""
    n = number if number is not None else _autorange(fn)
    samples: list[float] = []
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeat):
            start = time.perf_counter()
            for _ in range(n):
                fn()
            samples.append((time.perf_counter() - start) / n)
    finally:
        if gc_was_enabled:
            gc.enable()
    return statistics.median(samples)


def ratio_row(
    name: str,
    value_s: float,
    baseline_name: str,
    baseline_s: float,
    *,
    at_most: float | None = None,
    at_least_faster: float | None = None,
) -> BenchRow:
    """Target: `value <= at_most x baseline`, or `baseline >= at_least_faster x value`."""
    ratio = value_s / baseline_s if baseline_s > 0 else float("inf")
    if at_most is not None:
        return BenchRow(
            name=name,
            value_s=value_s,
            baseline_name=baseline_name,
            baseline_s=baseline_s,
            target=f"≤ {at_most:g}x",
            ok=ratio <= at_most,
        )
    assert at_least_faster is not None
    return BenchRow(
        name=name,
        value_s=value_s,
        baseline_name=baseline_name,
        baseline_s=baseline_s,
        target=f"≥ {at_least_faster:g}x faster",
        ok=baseline_s >= at_least_faster * value_s,
    )
