"""SQLite as the oracle for the SQL gate: what does the engine itself touch for a statement?

`violations(sql)` runs `sql` in a fresh in-memory database holding prefixed tables and
decoys (`users`, `secrets`, and every name the gate's own walk saw) under an authorizer that
only records, and lists every way the run left the gate's promise: a read or write of an
unprefixed table, a function outside `SQLITE_SAFE_FUNCTIONS`, an action other than plain DML,
or text the engine cannot read as the gate did (a NUL). Shared by the atheris target and the
hypothesis property; neither needs the other's machinery.

SQLite's authorizer also reports a read of a CTE as `SQLITE_READ` with the CTE's name (and an
empty column), exactly as it reports a row-count-only read of a real table of that name, so
the callback alone cannot tell `WITH users AS (...) SELECT 1 FROM users` from a real read of
`users`. The oracle asks the engine a counterfactual instead: it runs the statement again in
a database lacking that one table. SQLite resolves CTE names before schema tables, so only a
statement that reads the real table fails there with `no such table`.
"""

from __future__ import annotations

import re
import sqlite3
from typing import Final

from suaveplan_sandbox.permissions._sql_gate import SQLITE_SAFE_FUNCTIONS, SqlGate

__all__ = ["DECOYS", "PREFIX", "engine_touches", "reads_schema_table", "violations"]

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
_NAMES_GATE: Final = SqlGate(PREFIX, cache_size=0)
_ASCII_LOWER: Final = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def _database(sql: str, without: str | None = None) -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:", isolation_level=None)  # no implicit BEGIN
    conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, _MAX_LENGTH)
    names = set(_NAMES_GATE.referenced_tables(sql)) | _PREFIXED | DECOYS
    if without is not None:
        names = {n for n in names if _fold(n) != _fold(without)}
    for name in sorted(n for n in names if "\x00" not in n):
        quoted = '"' + name.replace('"', '""') + '"'
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {quoted} "  # our own fixture tables
            "(id INTEGER PRIMARY KEY, a UNIQUE, b, c, doc, name, x, ts)"
        )
    return conn


def _fold(name: str) -> str:
    return name.translate(_ASCII_LOWER)


class _AllNone(dict[str, object]):
    """Binds every named or numbered parameter (`:a`, `@a`, `$a`, `?1`) to NULL."""

    def __missing__(self, key: str) -> object:
        return None


_NAMED_OR_NUMBERED = re.compile(r"[:@$][A-Za-z_]|\?\d")
_BARE = re.compile(r"\?(?!\d)")
_STRING = re.compile(r"'[^']*'")


def null_bindings(sql: str, count: int) -> tuple[object, ...] | dict[str, object]:
    """NULL for every parameter of `sql`: a mapping for named and numbered placeholders (a
    sequence for them is deprecated since 3.12 and an error from 3.14), else `count` NULLs."""
    text = _STRING.sub("", sql)
    if _NAMED_OR_NUMBERED.search(text) and not _BARE.search(text):
        return _AllNone()
    return (None,) * count


def _run(conn: sqlite3.Connection, sql: str) -> sqlite3.Error | None:
    steps = 0

    def progress() -> int:
        nonlocal steps
        steps += 1
        return 1 if steps > _MAX_STEPS else 0  # a runaway recursive CTE is not a finding

    conn.set_progress_handler(progress, 100)
    try:
        conn.execute(sql, null_bindings(sql, sql.count("?")))
    except sqlite3.Error as exc:
        return exc
    except (ValueError, OverflowError):
        pass  # not valid SQLite for the driver (e.g. a parameter count it cannot bind)
    finally:
        conn.close()
    return None


def reads_schema_table(sql: str, name: str) -> bool:
    """Whether running `sql` needs the real table `name`, not merely a CTE called `name`."""
    error = _run(_database(sql, without=name), sql)
    if not isinstance(error, sqlite3.OperationalError):
        return False
    message = _fold(str(error))
    return message in (f"no such table: {_fold(name)}", f"no such table: main.{_fold(name)}")


def engine_touches(sql: str) -> tuple[set[str], set[str], set[int]]:
    """(tables read or written, functions called, authorizer actions) when SQLite runs `sql`.

    A table here is what the authorizer named, which for reads includes CTE names.
    """
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

    conn.set_authorizer(authorizer)
    _run(conn, sql)  # the authorizer runs at prepare time even if the statement then fails
    return tables, functions, actions


def violations(sql: str, prefix: str = PREFIX) -> list[str]:
    """Every way running `sql` in SQLite reaches beyond tables starting with `prefix`."""
    if "\x00" in sql:
        return ["holds a NUL, which C-string engines read as the end of the statement"]
    tables, functions, actions = engine_touches(sql)
    # SQLite matches table names ASCII-case-insensitively (quoted or not), and the authorizer
    # reports a name as the query spelled it: fold the way SQLite does before the prefix test.
    folded = _fold(prefix)
    found = [
        f"touches unprefixed table {t!r}"
        for t in sorted(tables)
        if not _fold(t).startswith(folded) and reads_schema_table(sql, t)
    ]
    found += [f"calls {f!r}" for f in sorted(functions - SQLITE_SAFE_FUNCTIONS)]
    found += [f"makes SQLite do action {a}" for a in sorted(actions - _DML_ACTIONS)]
    return found
