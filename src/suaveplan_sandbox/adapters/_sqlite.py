"""`SqliteDb`: one SQLite file per plugin behind the SQL gate *and* an engine authorizer.

The gate (`SqlGate.check_query`) decides on the parsed SQL; the authorizer enforces the same
rule inside SQLite on what the engine actually touches, so a parser differential cannot reach
an out-of-scope table: any table without the prefix, any under a reserved prefix
(`RESERVED_TABLE_PREFIXES`: SQLite's own `sqlite_*` tables, `pg_*`), ATTACH,
DETACH, PRAGMA, DDL at runtime and functions outside `SQLITE_SAFE_FUNCTIONS` are refused.
`apply_migrations` runs host-side with a wider (still prefix-only) authorizer.

Theory of operation for the host's time and memory. Statements run one at a time on the
adapter's own worker thread (never the event loop's default executor, which a plugin's queue
of calls must not fill). A progress handler checks the running statement every
`_PROGRESS_STEPS` engine instructions and stops it when its `_Run` is cancelled (the
awaiting coroutine was cancelled: a wall-clock budget, a disposed sandbox), when the adapter
is closed, or past `statement_timeout`; `Connection.interrupt()` is sent as well. A stopped
statement is rolled back by SQLite, and one that writes and returns rows (RETURNING) runs in
a transaction of the host's, committed only once its rows are accepted, so a coded error
always means nothing was written. Each engine step is kept short by limits: a value is at
most `max_value_bytes`, a row at most `max_result_columns` values, a LIKE/GLOB pattern at
most `_LIKE_PATTERN_BYTES`, and the built-ins whose time is the product of two lengths are
replaced by linear ones (`_sqlite_functions`, which also bounds `printf`'s `%c` repeat
count). A result is read row by row and refused past `max_result_rows` or
`max_result_bytes`. Every refusal is `SAND_DB_ERROR` with
`details.reason`.

And for the host's disk. The database file is capped at `max_db_bytes` with
`PRAGMA max_page_count`, which lasts as long as the connection and which no plugin statement
can change (the gate and the authorizer refuse PRAGMA, and the `pragma_*` table-valued
functions only read; ATTACH, which could create another file, is refused by both and by
`SQLITE_LIMIT_ATTACHED = 0`). A statement that would grow the file past it fails with
SQLITE_FULL, and SQLite rolls it back (`database-full`). Temporary files (sorts, DISTINCT,
recursive CTEs) are kept on disk (`temp_store = FILE`, not in the host's memory) and bounded
by the bytes the statement writes, `max_statement_write_bytes` (`_sqlite_writes`).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import re
import secrets
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Final, TypeVar, final

from suaveplan_sandbox.adapters._migration_files import migration_files, read_migration
from suaveplan_sandbox.adapters._protocols import QueryResult
from suaveplan_sandbox.adapters._sqlite_functions import LinearTextFunctions
from suaveplan_sandbox.adapters._sqlite_params import ParameterNames
from suaveplan_sandbox.adapters._sqlite_writes import StatementWrites, writes_are_countable
from suaveplan_sandbox.errors import SuaveplanError, WireValue
from suaveplan_sandbox.permissions._clock import Clock, MonotonicClock
from suaveplan_sandbox.permissions._decision import Deny
from suaveplan_sandbox.permissions._sql_gate import SQLITE_SAFE_FUNCTIONS, SqlGate
from suaveplan_sandbox.permissions._table_names import RESERVED_TABLE_PREFIXES

MIGRATIONS_TABLE: Final = "_suaveplan_migrations"

DEFAULT_STATEMENT_TIMEOUT: Final = 10.0
DEFAULT_MAX_RESULT_ROWS: Final = 100_000
DEFAULT_MAX_RESULT_BYTES: Final = 16 * 1024 * 1024  # the wire's frame: more cannot reach a guest
DEFAULT_MAX_RESULT_COLUMNS: Final = 100
DEFAULT_MAX_VALUE_BYTES: Final = 1024 * 1024
DEFAULT_MAX_DB_BYTES: Final = 1024**3
# As much as the database may hold: a sort of the whole of a full database still fits.
DEFAULT_MAX_STATEMENT_WRITE_BYTES: Final = 1024**3

# A LIKE or GLOB costs up to (text length) x (pattern length) in one engine step: with 1 MiB
# values and this, about a second at worst.
_LIKE_PATTERN_BYTES: Final = 1000
_PROGRESS_STEPS: Final = 1000
# How long `close()` waits for an interrupted statement to unwind before leaving the
# connection for its worker to close.
_CLOSE_WAIT: Final = 2.0
# Statements that may both write and return rows (SQLite: only with RETURNING); a superset on
# purpose, as a column named `returning_at` matches too and merely runs in a transaction.
_MAYBE_RETURNING: Final = re.compile("returning", re.IGNORECASE)

_T = TypeVar("_T")
_SIZED: Final = (str, bytes)  # values counted by their length; any other as 8

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
class _Run:
    """One call on the worker thread, as the progress handler sees it.

    `stop` is why it must stop (`cancelled`, `closed`, `statement-timeout`, or None to go on);
    `deadline` is on the adapter's clock, None for no time limit (migrations).
    """

    __slots__ = ("deadline", "stop")

    def __init__(self) -> None:
        self.deadline: float | None = None
        self.stop: str | None = None


def _closed_error() -> SuaveplanError:
    return SuaveplanError("SAND_DB_ERROR", "the database is closed", {"reason": "closed"})


def positive_limit(value: float, name: str, owner: str) -> None:
    """Refuse a limit that is not a finite positive number (shared with `PostgresDb`)."""
    if isinstance(value, bool) or not (isinstance(value, int | float) and 0 < value < math.inf):
        raise SuaveplanError("SAND_INVALID_ARGUMENT", f"{owner} needs a positive {name}")


def positive_int_limit(value: int, name: str, owner: str) -> None:
    """Refuse a limit that is not a positive int (shared with `SqliteLimits`, `FsLimits`)."""
    positive_limit(value, name, owner)
    if not isinstance(value, int):
        raise SuaveplanError("SAND_INVALID_ARGUMENT", f"{owner} needs an int {name}")


@final
class SqliteDb:
    """The embedded `DbAdapter`: `path` is the plugin's database file.

    Limits (each must be positive; all refusals are `SAND_DB_ERROR` with `details.reason`):
    `statement_timeout` seconds per call on `clock` (`statement-timeout`); a result of at most
    `max_result_rows` rows and about `max_result_bytes` bytes (`result-too-large`: text counts
    its characters, a BLOB its bytes, any other value 8, each value and row a little more);
    `max_result_columns` values a row and `max_value_bytes` a text or BLOB, also in tables
    (`value-too-large`, or SQLite's own refusal); a database file of at most `max_db_bytes`
    (`database-full`; a file already larger keeps its size as its limit); at most
    `max_statement_write_bytes` written to disk by one statement or migration file, temporary
    files included (`statement-write-limit`; counted only where `counts_statement_writes`).
    `close()` stops a running statement.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        plugin_prefix: str,
        dialect: str = "sqlite",
        statement_timeout: float = DEFAULT_STATEMENT_TIMEOUT,
        max_result_rows: int = DEFAULT_MAX_RESULT_ROWS,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
        max_result_columns: int = DEFAULT_MAX_RESULT_COLUMNS,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
        max_db_bytes: int = DEFAULT_MAX_DB_BYTES,
        max_statement_write_bytes: int = DEFAULT_MAX_STATEMENT_WRITE_BYTES,
        clock: Clock | None = None,
    ) -> None:
        if dialect != "sqlite" or not plugin_prefix:
            raise SuaveplanError("SAND_INVALID_ARGUMENT", "SqliteDb needs a prefix and sqlite")
        positive_limit(statement_timeout, "statement_timeout", "SqliteDb")
        for value, name in (
            (max_result_rows, "max_result_rows"),
            (max_result_bytes, "max_result_bytes"),
            (max_result_columns, "max_result_columns"),
            (max_value_bytes, "max_value_bytes"),
            (max_db_bytes, "max_db_bytes"),
            (max_statement_write_bytes, "max_statement_write_bytes"),
        ):
            positive_int_limit(value, name, "SqliteDb")
        self._prefix = plugin_prefix.translate(_ASCII_LOWER)
        self._gate = SqlGate(plugin_prefix, dialect="sqlite")
        self._timeout = float(statement_timeout)
        self._max_rows = max_result_rows
        self._max_bytes = max_result_bytes
        self._max_columns = max_result_columns
        self._max_db_bytes = max_db_bytes
        self._pages_limited = False
        self._clock: Clock = clock or MonotonicClock()
        self._lock = threading.Lock()  # the connection's owner: one worker call, or close()
        self._state = threading.Lock()  # guards `_current` and `_closed` against interrupt()
        self._current: _Run | None = None
        self._closed = False
        self._migrating = False
        self._host_transaction = False
        # The host's own transaction statements. A prepared statement keeps the authorizer's
        # answer and `sqlite3` reuses it for the same text, so the texts carry a secret: no
        # plugin statement, even past a fooled gate, can be one of them.
        marker = f"/* suaveplan {secrets.token_hex(8)} */"
        self._begin, self._commit, self._rollback_sql = (
            f"{verb} {marker}" for verb in ("BEGIN", "COMMIT", "ROLLBACK")
        )
        self._cte_reads: frozenset[str] = frozenset()  # see `_authorize`, `_execute_sync`
        self._denied_table_reads = False
        self._parameters = ParameterNames()
        self._functions = LinearTextFunctions(max_value_bytes=max_value_bytes)
        self._writes = (
            StatementWrites(max_statement_write_bytes) if writes_are_countable() else None
        )
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="suaveplan-sqlite")
        self._conn = sqlite3.connect(Path(path), isolation_level=None, check_same_thread=False)
        try:
            self._default_columns = self._conn.getlimit(sqlite3.SQLITE_LIMIT_COLUMN)
            self._conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, max_value_bytes)
            self._conn.setlimit(sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH, _LIKE_PATTERN_BYTES)
            self._conn.setlimit(sqlite3.SQLITE_LIMIT_COLUMN, max_result_columns)
            # Helper threads would write sort spills that the worker's counter cannot see.
            self._conn.setlimit(sqlite3.SQLITE_LIMIT_WORKER_THREADS, 0)
            self._conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
            # Not MEMORY (a build's default may be): spills in memory are bounded by nothing.
            self._conn.execute("PRAGMA temp_store = FILE")
            self._functions.install(self._conn)
            self._conn.set_progress_handler(self._progress, _PROGRESS_STEPS)
            self._conn.set_authorizer(self._authorize)
        except BaseException:
            self._conn.close()
            raise

    def _limit_pages(self) -> None:
        """Under the lock, before the first statement: the file's page budget. Not in the
        constructor, because it reads the file, and a file that is no database must fail
        the first call with a coded error rather than the host's constructor call.

        Setting it loads the schema, here under SQLite's default column limit: a table wider
        than `max_result_columns` (the host's own migrations table has three columns) is
        then no reason for every statement to fail as a malformed schema."""
        if self._pages_limited:
            return
        columns = self._conn.getlimit(sqlite3.SQLITE_LIMIT_COLUMN)
        self._conn.setlimit(sqlite3.SQLITE_LIMIT_COLUMN, self._default_columns)
        self._conn.set_authorizer(None)  # the authorizer refuses every PRAGMA
        try:
            page_size = int(self._conn.execute("PRAGMA page_size").fetchone()[0])
            pages = max(1, self._max_db_bytes // page_size)
            self._conn.execute(f"PRAGMA max_page_count = {pages}")
        finally:
            self._conn.set_authorizer(self._authorize)
            self._conn.setlimit(sqlite3.SQLITE_LIMIT_COLUMN, columns)
        self._pages_limited = True

    def __repr__(self) -> str:
        return f"SqliteDb(prefix={self._prefix!r})"

    @property
    def counts_statement_writes(self) -> bool:
        """Whether `max_statement_write_bytes` is enforced: it needs Linux's per-thread I/O
        counters (`/proc/thread-self/io`); elsewhere temporary files are not bounded."""
        return self._writes is not None

    def close(self) -> None:
        """Stop a running statement and close the database. Idempotent; waits at most a
        couple of seconds for the statement to unwind, then leaves the connection for its
        worker to close as soon as it does."""
        with self._state:
            self._closed = True
            run = self._current
            if run is not None:
                if run.stop is None:
                    run.stop = "closed"
                self._conn.interrupt()
        self._worker.shutdown(wait=False)  # what is queued runs, finds `_closed`, returns
        if self._lock.acquire(timeout=_CLOSE_WAIT):
            try:
                self._close_connection()
            finally:
                self._lock.release()

    def _close_connection(self) -> None:
        """Under `_lock`, once `_closed`: idempotent."""
        self._functions.close()
        if self._writes is not None:
            self._writes.close()
        self._conn.close()

    # -- the running statement ------------------------------------------------------------

    def _progress(self) -> int:
        """SQLite's progress handler: non-zero stops the running statement."""
        run = self._current
        if run is None:
            return 0
        if run.stop is not None:
            return 1
        now = self._clock.now()
        if run.deadline is not None and now > run.deadline:
            run.stop = "statement-timeout"
            return 1
        if self._writes is not None and self._writes.exceeded(now):
            run.stop = "statement-write-limit"
            return 1
        return 0

    @contextlib.contextmanager
    def _running(self, run: _Run) -> Iterator[None]:
        """`run` is the connection's running call, which `_stop` and `close` may interrupt."""
        if self._writes is not None:
            self._writes.begin(self._clock.now())
        with self._state:
            if self._closed and run.stop is None:
                run.stop = "closed"
            self._current = run
        try:
            yield
        finally:
            with self._state:
                self._current = None

    def _stop(self, run: _Run, reason: str) -> None:
        with self._state:
            if run.stop is None:
                run.stop = reason
            if self._current is run:
                self._conn.interrupt()

    async def _in_worker(self, run: _Run, work: Callable[..., _T], *args: object) -> _T:
        """`work(*args)` on the worker thread; cancelling the caller stops it."""
        if self._closed:
            raise _closed_error()
        loop = asyncio.get_running_loop()
        try:
            future = loop.run_in_executor(self._worker, work, *args)
        except RuntimeError:  # shut down by a concurrent close()
            raise _closed_error() from None
        try:
            return await future
        except asyncio.CancelledError:
            # A call still queued is dropped with its future; a running one is interrupted.
            self._stop(run, "cancelled")
            raise

    def _refusal(self, exc: sqlite3.Error, run: _Run) -> SuaveplanError:
        """The coded error for what SQLite raised while `run` ran."""
        reason = run.stop
        details: dict[str, WireValue] = {}
        if reason == "statement-timeout":
            details = {"reason": reason, "limit_ms": round(self._timeout * 1000)}
            message = "the statement ran past its time limit and was rolled back"
        elif reason == "statement-write-limit" and self._writes is not None:
            details = {"reason": reason, "limit_bytes": self._writes.limit}
            message = "the statement wrote more to disk than it may and was rolled back"
        elif reason is not None:
            details = {"reason": reason}
            message = f"the statement was stopped ({reason}) and rolled back"
        elif self._functions.refusal is not None:
            details = {"reason": self._functions.refusal}
            message = f"a function call was refused ({self._functions.refusal})"
        elif getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_TOOBIG:
            details = {"reason": "value-too-large"}
            message = "a value is larger than the database allows"
        elif _is_full(exc):
            details = {"reason": "database-full"}
            message = "the database is full; the statement was rolled back"
        else:
            message = f"the database refused the statement ({type(exc).__name__})"
        return SuaveplanError("SAND_DB_ERROR", message, details, cause=exc)

    # -- authorizer -------------------------------------------------------------------------

    def _in_scope(self, name: str | None) -> bool:
        # The engines' reserved prefixes are never a plugin's, whatever prefix it was given
        # (the gate's rule, from the same constant): under `sqlite_` the engine-side rule
        # would grant exactly `sqlite_master`, `sqlite_sequence` and the like.
        if name is None:
            return False
        # SQLite folds ASCII only: `str.lower()` would make U+212A (KELVIN SIGN) a `k`.
        lowered = name.translate(_ASCII_LOWER)
        return lowered.startswith(self._prefix) and not lowered.startswith(RESERVED_TABLE_PREFIXES)

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
            return (
                sqlite3.SQLITE_OK
                if self._migrating or self._host_transaction
                else sqlite3.SQLITE_DENY
            )
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
        return frozenset(
            n for n in ctes if n not in schema and not n.startswith(RESERVED_TABLE_PREFIXES)
        )

    # -- runtime queries --------------------------------------------------------------------

    def _host_statement(self, sql: str) -> None:
        self._host_transaction = True
        try:
            self._conn.execute(sql)
        finally:
            self._host_transaction = False

    def _rollback(self) -> None:
        """End the host's transaction, if SQLite has not rolled it back already."""
        if self._conn.in_transaction:
            self._host_statement(self._rollback_sql)

    def _read(self, cursor: sqlite3.Cursor) -> list[tuple[WireValue, ...]]:
        """The rows, one at a time, refused past the row or byte limit."""
        rows: list[tuple[WireValue, ...]] = []
        size = 0
        max_rows, max_bytes = self._max_rows, self._max_bytes
        for row in cursor:
            size += 8
            for value in row:
                size += len(value) if type(value) in _SIZED else 8
            rows.append(row)
            if size > max_bytes or len(rows) > max_rows:
                raise SuaveplanError(
                    "SAND_DB_ERROR",
                    "the result is larger than the adapter returns; nothing was written",
                    {"reason": "result-too-large", "max_rows": max_rows, "max_bytes": max_bytes},
                )
        return rows

    def _run(self, sql: str, params: Sequence[WireValue], run: _Run) -> QueryResult:
        # A statement that writes and returns rows has written by its first step, and
        # SQLite commits it when it is reset: only the host's transaction can take it back
        # if its rows are refused.
        transaction = _MAYBE_RETURNING.search(sql) is not None
        if transaction:
            self._host_statement(self._begin)
        try:
            with self._running(run):
                cursor = self._conn.execute(sql, self._parameters.bindings(self._conn, sql, params))
                try:
                    rows = self._read(cursor)
                    columns = tuple(d[0] for d in cursor.description or ())
                    rowcount = cursor.rowcount
                finally:
                    cursor.close()
            if transaction:
                self._host_statement(self._commit)
        except BaseException:
            if transaction:
                self._rollback()
            raise
        return QueryResult(columns=columns, rows=tuple(rows), rowcount=rowcount)

    def _execute_sync(self, sql: str, params: Sequence[WireValue], run: _Run) -> QueryResult:
        with self._lock:
            try:
                if self._closed:
                    raise _closed_error()
                if run.stop is not None:  # cancelled while it waited: it never starts
                    raise SuaveplanError(
                        "SAND_DB_ERROR", "the call was cancelled", {"reason": run.stop}
                    )
                run.deadline = self._clock.now() + self._timeout
                self._functions.refusal = None
                return self._execute_locked(sql, params, run)
            finally:
                if self._closed:
                    self._close_connection()

    def _execute_locked(self, sql: str, params: Sequence[WireValue], run: _Run) -> QueryResult:
        try:
            self._limit_pages()
            self._denied_table_reads = False
            try:
                return self._run(sql, params, run)
            except sqlite3.DatabaseError:
                # The authorizer runs at prepare time, so a refused statement did nothing;
                # if it was refused for a table-level read that may be a CTE, ask which
                # names are CTE-only and prepare it once more with those let through.
                if not self._denied_table_reads or self._migrating or run.stop is not None:
                    raise
                self._cte_reads = self._cte_only_names(sql)
                if not self._cte_reads:
                    raise
                return self._run(sql, params, run)
            finally:
                self._cte_reads = frozenset()
        except sqlite3.Error as exc:
            raise self._refusal(exc, run) from None
        except (OverflowError, UnicodeEncodeError) as exc:
            # A value sqlite3 cannot bind (an int outside SQLite's signed 64 bits, which
            # msgpack carries; a str with a lone surrogate). Nothing ran. No cause: a
            # UnicodeEncodeError holds the whole value.
            raise SuaveplanError(
                "SAND_DB_ERROR",
                f"a parameter cannot be bound ({type(exc).__name__})",
                {"reason": "parameter-invalid"},
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
        run = _Run()
        return await self._in_worker(run, self._execute_sync, sql, params, run)

    async def query(self, sql: str, params: Sequence[WireValue]) -> QueryResult:
        if self._closed:
            raise _closed_error()
        decision = self._gate.check_query(sql, list(params))
        if isinstance(decision, Deny):
            decision.raise_for_denial()
        return await self._execute(sql, params)

    # -- migrations (host side) ---------------------------------------------------------------

    def _migrate_sync(
        self, plugin: str, files: list[Path], version: str | None, run: _Run
    ) -> list[str]:
        with self._lock:
            try:
                if self._closed:
                    raise _closed_error()
                self._migrating = True
                self._conn.setlimit(sqlite3.SQLITE_LIMIT_COLUMN, self._default_columns)
                self._limit_pages()
                return self._migrate_locked(plugin, files, version, run)
            except sqlite3.Error as exc:
                raise SuaveplanError(
                    "SAND_DB_MIGRATION_FAILED",
                    f"migrations could not run ({type(exc).__name__})",
                    cause=exc,
                ) from None
            finally:
                self._migrating = False
                if self._closed:
                    self._close_connection()
                else:
                    self._conn.setlimit(sqlite3.SQLITE_LIMIT_COLUMN, self._max_columns)
                    # Setting it again expires every prepared statement, so none authorized
                    # under the migrations' wider rule is run again without being re-checked.
                    self._conn.set_authorizer(self._authorize)

    def _migrate_locked(
        self, plugin: str, files: list[Path], version: str | None, run: _Run
    ) -> list[str]:
        applied: list[str] = []
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
            # The plugin's file: a link, FIFO, huge or non-UTF-8 file is a coded refusal.
            sql = read_migration(file)
            decisions = self._gate.check_migration(sql)
            if not decisions or any(isinstance(d, Deny) for d in decisions):
                raise SuaveplanError(
                    "SAND_DB_MIGRATION_FAILED",
                    "a migration contains a statement outside the plugin's prefix",
                    {"migration": file.name},
                )
            # Split before BEGIN: nothing that fails here may leave the transaction open.
            statements = _split_statements(sql)
            self._conn.execute("BEGIN")
            try:
                with self._running(run):
                    for statement in statements:
                        self._conn.execute(statement)
                    self._conn.execute(
                        "INSERT INTO _suaveplan_migrations (plugin, name, version) "
                        "VALUES (?, ?, ?)",
                        (plugin, file.name, version),
                    )
                self._conn.execute("COMMIT")
            except sqlite3.Error as exc:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                details: dict[str, WireValue] = {"migration": file.name}
                if run.stop is not None:
                    details["reason"] = run.stop
                elif _is_full(exc):
                    details["reason"] = "database-full"
                raise SuaveplanError(
                    "SAND_DB_MIGRATION_FAILED",
                    f"migration failed and was rolled back ({type(exc).__name__})",
                    details,
                    cause=exc,
                ) from None
            applied.append(file.name)
        return applied


def _is_full(exc: sqlite3.Error) -> bool:
    """SQLITE_FULL: past `max_page_count`, or the disk itself (the file's or a temporary
    one's) is full. Either way SQLite has rolled the statement back."""
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(code, int) and code & 0xFF == sqlite3.SQLITE_FULL


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
    root: str | os.PathLike[str] | None = None,
) -> list[str]:
    """Apply the plugin's `*.sql` files in name order, each once; returns the names applied.

    `root`: the plugin's root, above `migrations_dir`; no component from it down to the
    folder may be a symbolic link (`_migration_files.migration_files`).
    Migrations have no time limit, but cancelling the caller or closing `db` stops the one
    running (rolled back; `SAND_DB_MIGRATION_FAILED` with `details.reason`)."""
    files = migration_files(migrations_dir, root=root)
    run = _Run()
    return await db._in_worker(run, db._migrate_sync, plugin, files, version, run)
