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

Set `SUAVEPLAN_FUZZ_DEEP=1` to also instrument sqlglot's parser (coverage guidance inside
the parser; costs several seconds of start-up, so the runner only does it for long runs).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import sys
from collections.abc import Iterator
from typing import Final

import atheris

with atheris.instrument_imports(
    include=["suaveplan_sandbox", *(["sqlglot"] if os.environ.get("SUAVEPLAN_FUZZ_DEEP") else [])]
):
    from suaveplan_sandbox.metrics import InMemoryMetrics
    from suaveplan_sandbox.permissions import Allow, Deny, PermissionChecker, PermissionPolicy
    from suaveplan_sandbox.permissions._sql_gate import SQLITE_SAFE_FUNCTIONS, SqlGate

from fuzz._target import Finding, run_target, vector_cases

PREFIX: Final = "billing_"
DECOYS: Final = frozenset({"users", "secrets", "a", "b", "t", "u", "r", "x"})
_PREFIXED: Final = frozenset({"billing_x", "billing_y"})
_TABLE_ACTIONS: Final = frozenset(
    {sqlite3.SQLITE_READ, sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE}
)
# What a runtime SELECT/INSERT/UPDATE/DELETE may make SQLite do; anything else is a finding.
_DML_ACTIONS: Final = _TABLE_ACTIONS | frozenset(
    {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
)
_MAX_STEPS: Final = 20_000
_MAX_LENGTH: Final = 100_000


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


def _database(sql: str) -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:", isolation_level=None)  # no implicit BEGIN
    conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, _MAX_LENGTH)
    names = set(_GATE.referenced_tables(sql)) | _PREFIXED | DECOYS
    for name in names:
        quoted = '"' + name.replace('"', '""') + '"'
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {quoted} "  # our own fixture tables
            "(id INTEGER PRIMARY KEY, a UNIQUE, b, c, doc, name, x, ts)"
        )
    return conn


def engine_touches(sql: str) -> tuple[set[str], set[str], set[int]]:
    """(tables read or written, functions called, authorizer actions) when SQLite runs `sql`."""
    conn = _database(sql)
    tables: set[str] = set()
    functions: set[str] = set()
    actions: set[int] = set()

    def authorizer(action: int, arg1: str | None, arg2: str | None, *_: str | None) -> int:
        actions.add(action)
        if action in _TABLE_ACTIONS and arg1 is not None:
            tables.add(arg1)
        if action == sqlite3.SQLITE_FUNCTION and arg2 is not None:
            functions.add(arg2.lower())
        return sqlite3.SQLITE_OK

    steps = 0

    def progress() -> int:
        nonlocal steps
        steps += 1
        return 1 if steps > _MAX_STEPS else 0  # a runaway recursive CTE is not a finding

    conn.set_authorizer(authorizer)
    conn.set_progress_handler(progress, 100)
    try:
        conn.execute(sql, (None,) * sql.count("?"))
    except (sqlite3.Error, ValueError, OverflowError):
        pass  # prepare (where the authorizer runs) has happened or the statement is invalid
    finally:
        conn.close()
    return tables, functions, actions


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
    if "\x00" in sql:
        raise Finding(f"allowed {sql!r} holds a NUL, which engines read as the end of the text")
    tables, functions, actions = engine_touches(sql)
    outside = {t for t in tables if not t.startswith(PREFIX)}
    if outside:
        raise Finding(f"allowed {sql!r} touches unprefixed tables {sorted(outside)}")
    unsafe = functions - SQLITE_SAFE_FUNCTIONS
    if unsafe:
        raise Finding(f"allowed {sql!r} calls {sorted(unsafe)}")
    odd = actions - _DML_ACTIONS
    if odd:
        raise Finding(f"allowed {sql!r} makes SQLite do actions {sorted(odd)}")


def seeds() -> Iterator[bytes]:
    for case in vector_cases("sql"):
        yield case["sql"].encode("utf-8")


if __name__ == "__main__":
    run_target(test_one_input, seeds)
    sys.exit(0)
