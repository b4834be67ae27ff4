"""SQL gate cost against sqlglot's own parse of the same statement, in the same run.

Measured with `_harness.paired` (interleaved batches on thread CPU time, median of the paired
ratios); a row's value is that ratio times the baseline's median, so `value / baseline`
prints the same figure.
"""

from __future__ import annotations

from typing import Final

import sqlglot

from benchmarks._harness import BenchRow, paired, ratio_row
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
