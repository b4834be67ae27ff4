"""Fuzz target: the SQL gate, with SQLite itself as the differential oracle.

The input, decoded as UTF-8, is one runtime query for a plugin whose table prefix is
`billing_`. Properties checked for every input:

* `SqlGate.check_query` never raises, and the checker's `db` path never takes its
  fail-closed exception branch (which would mean a gate bug);
* the checker and the gate agree;
* whenever the gate Allows, executing the statement in an in-memory SQLite holding prefixed
  tables and decoys (`users`, `secrets`, the names the query mentions) under an authorizer
  that only records must show reads/writes of prefixed tables only, functions from
  `SQLITE_SAFE_FUNCTIONS` only, and no action outside plain DML (no ATTACH, PRAGMA, DDL,
  transaction control). An Allow that touches `users` is a finding.

libFuzzer's mutation order is seeded with `-seed=1` unless the command line names a seed
(`SUAVEPLAN_FUZZ_SQL_SEED=0` asks libFuzzer for a random one), so the bounded CI run over a
fresh corpus walks the same inputs every time: a finding reproduces instead of flaking.

Set `SUAVEPLAN_FUZZ_DEEP=1` to also instrument sqlglot's parser (coverage guidance inside
the parser; costs several seconds of start-up, so the runner only does it for long runs).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from typing import Final

import atheris

with atheris.instrument_imports(
    include=["suaveplan_sandbox", *(["sqlglot"] if os.environ.get("SUAVEPLAN_FUZZ_DEEP") else [])]
):
    from suaveplan_sandbox.metrics import InMemoryMetrics
    from suaveplan_sandbox.permissions import Allow, Deny, PermissionChecker, PermissionPolicy
    from suaveplan_sandbox.permissions._sql_gate import SqlGate

from fuzz._sqlite_oracle import PREFIX, violations
from fuzz._target import Finding, run_target, vector_cases


class _FailClosedAlarm(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        raise Finding(f"fail-closed path taken: {record.getMessage()}")


logging.getLogger("suaveplan_sandbox.permissions").addHandler(_FailClosedAlarm(logging.ERROR))
logging.getLogger("suaveplan_sandbox.permissions").propagate = False
logging.getLogger("sqlglot").setLevel(logging.CRITICAL)  # "falling back to Command" noise

_GATE: Final = SqlGate(PREFIX, cache_size=0)
_CHECKER: Final = PermissionChecker(
    PermissionPolicy.from_manifest(
        {"name": "fuzz", "database": {"tablePrefix": PREFIX}}, root="/srv/fuzz"
    ),
    metrics=InMemoryMetrics(),
)


def test_one_input(data: bytes) -> None:
    sql = data.decode("utf-8", "replace")
    decision = _GATE.check_query(sql)
    via_checker = _CHECKER.check_capability("db", {"sql": sql})
    if not isinstance(decision, Allow | Deny):
        raise Finding(f"check_query returned {type(decision).__name__}")
    if decision != via_checker:
        raise Finding(f"gate {decision!r} but checker {via_checker!r}")
    if not isinstance(decision, Allow):
        return
    found = violations(sql)
    if found:
        raise Finding(f"gate allowed {sql!r} but SQLite shows: {'; '.join(found)}")


def seeds() -> Iterator[bytes]:
    for case in vector_cases("sql"):
        yield case["sql"].encode("utf-8")


def _argv() -> list[str]:
    if any(arg.startswith("-seed=") for arg in sys.argv[1:]):
        return list(sys.argv)
    return [sys.argv[0], f"-seed={os.environ.get('SUAVEPLAN_FUZZ_SQL_SEED', '1')}", *sys.argv[1:]]


if __name__ == "__main__":
    run_target(test_one_input, seeds, _argv())
    sys.exit(0)
