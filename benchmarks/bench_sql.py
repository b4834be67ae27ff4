"""SQL gate cost against sqlglot's own parse of the same statement, in the same run.

The machine is shared and noisy (absolute times swing 2x within a minute), so the two sides
are measured in alternating short batches (`_ROUNDS` pairs, the order flipped every round)
and each pair gives one ratio: a burst of noise lands on both sides of a pair alike. Time is
this thread's CPU time (`time.thread_time`), not wall time, so the slices other processes
take from us while we are descheduled count on neither side. A row's ratio is the median of
the paired ratios; its value is that ratio times the baseline's median, so `value /
baseline` prints the same figure.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from typing import Final

import sqlglot

from benchmarks._harness import BenchRow, ratio_row
from suaveplan_sandbox.permissions._sql_gate import SqlGate

STATEMENT: Final = """
WITH recent AS (
    SELECT customer_id, max(created_at) AS last_seen
    FROM billing_invoices WHERE status = ? GROUP BY customer_id
)
SELECT c.id, c.name, i.total, p.amount, r.last_seen
FROM billing_customers AS c
JOIN billing_invoices AS i ON i.customer_id = c.id
JOIN billing_payments AS p ON p.invoice_id = i.id
LEFT JOIN recent AS r ON r.customer_id = c.id
WHERE i.total > ? AND lower(c.name) LIKE ?
ORDER BY i.total DESC LIMIT 50
"""

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


def run() -> list[BenchRow]:
    params = ("paid", 10, "a%")
    uncached = SqlGate("billing_", cache_size=0)
    cached = SqlGate("billing_")
    assert uncached.check_query(STATEMENT, params).allowed
    assert cached.check_query(STATEMENT, params).allowed

    def parse() -> object:
        return sqlglot.parse_one(STATEMENT, read="sqlite")

    uncached_ratio, parse_s = paired(lambda: uncached.check_query(STATEMENT, params), parse)
    cached_ratio, parse_s2 = paired(lambda: cached.check_query(STATEMENT, params), parse)
    return [
        ratio_row(
            "check_query CTE+3 joins (uncached)",
            uncached_ratio * parse_s,
            "sqlglot.parse_one",
            parse_s,
            at_most=1.2,
        ),
        ratio_row(
            "check_query CTE+3 joins (cached)",
            cached_ratio * parse_s2,
            "sqlglot.parse_one",
            parse_s2,
            at_most=0.02,
        ),
    ]


if __name__ == "__main__":
    for row in run():
        print(row, f"ratio={row.ratio:.4f}")
