"""Shared measurement helpers. The machine is noisy, so we report ratios, never gate on times."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, final


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class BenchRow:
    """One figure: `value_s` against `baseline_s` measured in the same process and run.
    `ok` is None for a row that explains another and has no target of its own."""

    name: str
    value_s: float
    baseline_name: str
    baseline_s: float
    target: str
    ok: bool | None

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
    info: bool = False,
) -> BenchRow:
    """Target: `value <= at_most x baseline`, or `baseline >= at_least_faster x value`; or,
    with `info`, none (the row explains another)."""
    ratio = value_s / baseline_s if baseline_s > 0 else float("inf")
    if info:
        return BenchRow(
            name=name,
            value_s=value_s,
            baseline_name=baseline_name,
            baseline_s=baseline_s,
            target="—",
            ok=None,
        )
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


# Paired measurement for overheads smaller than the machine's noise (absolute times swing 2x
# within a minute): the two sides run in alternating short batches (`_ROUNDS` pairs, order
# flipped every round) and each pair gives one ratio, so a burst of noise lands on both sides
# alike. Time is this thread's CPU time (`time.thread_time`), so slices other processes take
# while we are descheduled count on neither side.
_ROUNDS: Final = 31
_BATCH_S: Final = 0.01  # each side's batch in one round lasts about this long


def _batch_size(fn: Callable[[], object]) -> int:
    number = 1
    while True:
        start = time.thread_time()
        for _ in range(number):
            fn()
        if time.thread_time() - start >= _BATCH_S or number >= 1_000_000:
            return number
        number *= 2


def _per_call(fn: Callable[[], object], number: int) -> float:
    start = time.thread_time()
    for _ in range(number):
        fn()
    return (time.thread_time() - start) / number


def paired(
    value: Callable[[], object], baseline: Callable[[], object], rounds: int = _ROUNDS
) -> tuple[float, float]:
    """(median of value/baseline over interleaved rounds, baseline's median seconds per call)."""
    n_value, n_base = _batch_size(value), _batch_size(baseline)
    ratios: list[float] = []
    bases: list[float] = []
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for i in range(rounds):
            if i % 2:
                v = _per_call(value, n_value)
                b = _per_call(baseline, n_base)
            else:
                b = _per_call(baseline, n_base)
                v = _per_call(value, n_value)
            ratios.append(v / b)
            bases.append(b)
    finally:
        if gc_was_enabled:
            gc.enable()
    return statistics.median(ratios), statistics.median(bases)
