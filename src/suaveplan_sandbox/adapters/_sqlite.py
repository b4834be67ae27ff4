"""`SqliteDb`: one SQLite file per plugin behind the SQL gate *and* an engine authorizer.

The gate (`SqlGate.check_query`) decides on the parsed SQL; the authorizer enforces the same
rule inside SQLite on what the engine actually touches, so a parser differential cannot reach
an out-of-scope table: any table without the prefix, `sqlite_*` schema tables, ATTACH,
DETACH, PRAGMA, DDL at runtime and functions outside `SQLITE_SAFE_FUNCTIONS` are refused.
`apply_migrations` runs host-side with a wider (still prefix-only) authorizer.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Final, final

from suaveplan_sandbox.adapters._protocols import QueryResult
from suaveplan_sandbox.adapters._sqlite_params import ParameterNames
from suaveplan_sandbox.errors import SuaveplanError, WireValue
from suaveplan_sandbox.permissions._decision import Deny
from suaveplan_sandbox.permissions._sql_gate import SQLITE_SAFE_FUNCTIONS, SqlGate

MIGRATIONS_TABLE: Final = "_suaveplan_migrations"

_DML: Final = {sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE}
_ALWAYS_OK: Final = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_RECURSIVE}
_DDL: Final = {
    getattr(sqlite3, name)
    for name in (
        "SQLITE_CREATE_INDEX",
        "SQLITE_CREATE_TABLE",
        "SQLITE_CREATE_TRIGGER",
        "SQLITE_CREATE_VIEW",
        "SQLITE_DROP_INDEX",
        "SQLITE_DROP_TABLE",
        "SQLITE_DROP_TRIGGER",
        "SQLITE_DROP_VIEW",
        "SQLITE_ALTER_TABLE",
        "SQLITE_REINDEX",
        "SQLITE_ANALYZE",
    )
}
_SCHEMA_TABLES: Final = frozenset({"sqlite_master", "sqlite_schema", "sqlite_temp_master"})
_SCHEMA_NAMES_SQL: Final = (
    "SELECT name FROM sqlite_master WHERE type IN ('table', 'view') "
    "UNION ALL SELECT name FROM sqlite_temp_master WHERE type IN ('table', 'view')"
)
_ASCII_LOWER: Final = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


@final
class SqliteDb:
    """The embedded `DbAdapter`: `path` is the plugin's database file."""

    def __init__(
        self, path: str | os.PathLike[str], *, plugin_prefix: str, dialect: str = "sqlite"
    ) -> None:
        if dialect != "sqlite" or not plugin_prefix:
            raise SuaveplanError("SAND_INVALID_ARGUMENT", "SqliteDb needs a prefix and sqlite")
        self._prefix = plugin_prefix.lower()
        self._gate = SqlGate(plugin_prefix, dialect="sqlite")
        self._lock = threading.Lock()
        self._migrating = False
        self._cte_reads: frozenset[str] = frozenset()  # see `_authorize`, `_execute_sync`
        self._denied_table_reads = False
        self._parameters = ParameterNames()
        self._conn = sqlite3.connect(Path(path), isolation_level=None, check_same_thread=False)
        self._conn.set_authorizer(self._authorize)

    def __repr__(self) -> str:
        return f"SqliteDb(prefix={self._prefix!r})"

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def _in_scope(self, name: str | None) -> bool:
        return name is not None and name.lower().startswith(self._prefix)

    def _authorize(
        self, action: int, arg1: str | None, arg2: str | None, db: str | None, trigger: str | None
    ) -> int:
        if db not in (None, "main"):
            return sqlite3.SQLITE_DENY
        if action in _ALWAYS_OK:
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_READ and arg2 == "" and db is None and arg1 is not None:
            # A table-level read (no column). SQLite reports a read of a CTE this way too,
            # under the CTE's name; `_execute_sync` retries with `_cte_reads` set to the
            # statement's CTE names that are no table or view here.
            if arg1.translate(_ASCII_LOWER) in self._cte_reads:
                return sqlite3.SQLITE_OK
            if not self._in_scope(arg1):
                self._denied_table_reads = True
        if action == sqlite3.SQLITE_READ or action in _DML:
            if self._migrating and (arg1 in _SCHEMA_TABLES or arg1 == MIGRATIONS_TABLE):
                return sqlite3.SQLITE_OK
            return sqlite3.SQLITE_OK if self._in_scope(arg1) else sqlite3.SQLITE_DENY
        if action == sqlite3.SQLITE_FUNCTION:
            return (
                sqlite3.SQLITE_OK
                if (arg2 or "").lower() in SQLITE_SAFE_FUNCTIONS
                else sqlite3.SQLITE_DENY
            )
        if action == sqlite3.SQLITE_TRANSACTION:
            return sqlite3.SQLITE_OK if self._migrating else sqlite3.SQLITE_DENY
        if action in _DDL and self._migrating:
            # arg1 is the object (index/table/trigger/view) name; arg2 the table it is on.
            # SQLite names implicit UNIQUE/PK indexes itself; only the table they sit on counts.
            names = [
                n for n in (arg1, arg2) if n is not None and not n.startswith("sqlite_autoindex_")
            ]
            if all(self._in_scope(n) or n == MIGRATIONS_TABLE for n in names):
                return sqlite3.SQLITE_OK
        # ATTACH, DETACH, PRAGMA, runtime DDL, virtual tables, savepoints, anything new.
        return sqlite3.SQLITE_DENY

    def _cte_only_names(self, sql: str) -> frozenset[str]:
        """The statement's CTE names that name no table or view of this database: a read
        under such a name can only be a read of the CTE. Runs under the lock."""
        ctes = self._gate.cte_names(sql)
        if not ctes:
            return ctes
        self._conn.set_authorizer(None)
        try:
            rows = self._conn.execute(_SCHEMA_NAMES_SQL).fetchall()
        finally:
            self._conn.set_authorizer(self._authorize)
        schema = {str(row[0]).translate(_ASCII_LOWER) for row in rows}
        return frozenset(n for n in ctes if n not in schema and not n.startswith("sqlite_"))

    def _run(self, sql: str, params: Sequence[WireValue]) -> QueryResult:
        cursor = self._conn.execute(sql, self._parameters.bindings(self._conn, sql, params))
        rows = tuple(tuple(row) for row in cursor.fetchall())
        columns = tuple(d[0] for d in cursor.description or ())
        return QueryResult(columns=columns, rows=rows, rowcount=cursor.rowcount)

    def _execute_sync(self, sql: str, params: Sequence[WireValue]) -> QueryResult:
        with self._lock:
            try:
                self._denied_table_reads = False
                try:
                    return self._run(sql, params)
                except sqlite3.DatabaseError:
                    # The authorizer runs at prepare time, so a refused statement did nothing;
                    # if it was refused for a table-level read that may be a CTE, ask which
                    # names are CTE-only and prepare it once more with those let through.
                    if not self._denied_table_reads or self._migrating:
                        raise
                    self._cte_reads = self._cte_only_names(sql)
                    if not self._cte_reads:
                        raise
                    return self._run(sql, params)
                finally:
                    self._cte_reads = frozenset()
            except sqlite3.Error as exc:
                raise SuaveplanError(
                    "SAND_DB_ERROR",
                    f"the database refused the statement ({type(exc).__name__})",
                    cause=exc,
                ) from None
            except DeprecationWarning as exc:
                # Raised, not shown, only in a host run with warnings as errors: sqlite3 (3.12,
                # 3.13) binding a list to named placeholders, which `ParameterNames` avoids
                # except beside a nameless `?` (3.14 refuses that outright). Nothing ran.
                raise SuaveplanError(
                    "SAND_DB_ERROR",
                    "the statement mixes nameless `?` with named parameters",
                    cause=exc,
                ) from None

    async def _execute(self, sql: str, params: Sequence[WireValue]) -> QueryResult:
        """The engine path, after the gate. Tests call it directly to prove the authorizer."""
        return await asyncio.to_thread(self._execute_sync, sql, params)

    async def query(self, sql: str, params: Sequence[WireValue]) -> QueryResult:
        decision = self._gate.check_query(sql, list(params))
        if isinstance(decision, Deny):
            decision.raise_for_denial()
        return await self._execute(sql, params)

    # -- migrations (host side) ---------------------------------------------------------------

    def _migrate_sync(self, plugin: str, files: list[Path], version: str | None) -> list[str]:
        applied: list[str] = []
        with self._lock:
            self._migrating = True
            try:
                self._conn.execute(
                    "CREATE TABLE IF NOT EXISTS _suaveplan_migrations (plugin TEXT NOT NULL, "
                    "name TEXT NOT NULL, version TEXT, PRIMARY KEY (plugin, name))"
                )
                done = {
                    row[0]
                    for row in self._conn.execute(
                        "SELECT name FROM _suaveplan_migrations WHERE plugin = ?", (plugin,)
                    )
                }
                for file in files:
                    if file.name in done:
                        continue
                    sql = file.read_text(encoding="utf-8")
                    decisions = self._gate.check_migration(sql)
                    if not decisions or any(isinstance(d, Deny) for d in decisions):
                        raise SuaveplanError(
                            "SAND_DB_MIGRATION_FAILED",
                            "a migration contains a statement outside the plugin's prefix",
                            {"migration": file.name},
                        )
                    self._conn.execute("BEGIN")
                    try:
                        for statement in _split_statements(sql):
                            self._conn.execute(statement)
                        self._conn.execute(
                            "INSERT INTO _suaveplan_migrations (plugin, name, version) "
                            "VALUES (?, ?, ?)",
                            (plugin, file.name, version),
                        )
                        self._conn.execute("COMMIT")
                    except sqlite3.Error as exc:
                        self._conn.execute("ROLLBACK")
                        raise SuaveplanError(
                            "SAND_DB_MIGRATION_FAILED",
                            f"migration failed and was rolled back ({type(exc).__name__})",
                            {"migration": file.name},
                            cause=exc,
                        ) from None
                    applied.append(file.name)
            finally:
                self._migrating = False
        return applied


def _split_statements(sql: str) -> list[str]:
    out: list[str] = []
    buf = ""
    for piece in sql.split(";"):
        buf += piece + ";"
        if sqlite3.complete_statement(buf):
            if buf.strip(" \t\r\n;"):
                out.append(buf)
            buf = ""
    if buf.strip(" \t\r\n;"):
        out.append(buf)
    return out


async def apply_migrations(
    db: SqliteDb,
    migrations_dir: str | os.PathLike[str],
    *,
    plugin: str,
    version: str | None = None,
) -> list[str]:
    """Apply the plugin's `*.sql` files in name order, each once; returns the names applied."""
    files = sorted(Path(migrations_dir).glob("*.sql"), key=lambda p: p.name)
    return await asyncio.to_thread(db._migrate_sync, plugin, files, version)
