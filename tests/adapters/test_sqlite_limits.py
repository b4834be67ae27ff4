"""SqliteDb keeps the host's time and memory: a plugin's statement is stopped when its caller
is cancelled, when the adapter is closed or past its time limit, is rolled back when stopped,
and can produce neither a value nor a result larger than the adapter's limits."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from suaveplan_sandbox.adapters import Adapters
from suaveplan_sandbox.adapters._sqlite import SqliteDb, apply_migrations
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.gateway import Gateway
from suaveplan_sandbox.permissions import PermissionChecker, PermissionPolicy
from suaveplan_sandbox.testing import FakeClock

# Generous bounds on how long a stopped statement may take to end: far more than it needs,
# far less than the runaway statement (forever) or the quadratic built-ins (minutes).
_STOPPED_WITHIN = 30.0

RUNAWAY = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
RUNAWAY_INSERT = (
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
    "INSERT INTO p_t (x) SELECT x FROM c"
)


def _counted(n: int) -> str:
    return f"WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < {n})"


async def _migrated(db: SqliteDb, tmp_path: Path) -> SqliteDb:
    mig = tmp_path / "migrations"
    mig.mkdir(exist_ok=True)
    (mig / "001.sql").write_text("CREATE TABLE p_t (x INTEGER);")
    await apply_migrations(db, mig, plugin="p")
    await db.query("INSERT INTO p_t (x) VALUES (1), (2), (3)", [])
    return db


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[SqliteDb]:
    database = await _migrated(SqliteDb(tmp_path / "host.db", plugin_prefix="p_"), tmp_path)
    yield database
    database.close()


@pytest.fixture
def fresh(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "host.db"


async def _error(db: SqliteDb, sql: str, params: list[Any] | None = None) -> SuaveplanError:
    with pytest.raises(SuaveplanError) as info:
        await asyncio.wait_for(db.query(sql, params or []), _STOPPED_WITHIN)
    assert info.value.code == "SAND_DB_ERROR"
    return info.value


async def _running(db: SqliteDb) -> None:
    """Until the adapter's worker is running a statement."""
    async with asyncio.timeout(_STOPPED_WITHIN):
        while db._current is None:
            await asyncio.sleep(0.01)


def _rows_on_disk(path: Path) -> tuple[int, str]:
    with closing(sqlite3.connect(path)) as conn:
        count = conn.execute("SELECT count(*) FROM p_t").fetchone()[0]
        check = conn.execute("PRAGMA integrity_check").fetchone()[0]
    return count, check


# -- stopping a statement -----------------------------------------------------------------


async def test_cancelling_the_caller_stops_the_statement_and_frees_the_adapter(
    db: SqliteDb,
) -> None:
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(db.query(RUNAWAY, []), 0.2)
    # The worker is free again: before, the statement ran on (a core) and held the lock.
    result = await asyncio.wait_for(db.query("SELECT count(*) FROM p_t", []), _STOPPED_WITHIN)
    assert result.rows == ((3,),)


async def test_close_stops_a_running_statement_and_returns(db: SqliteDb, tmp_path: Path) -> None:
    task = asyncio.create_task(db.query(RUNAWAY_INSERT, []))
    await _running(db)
    closer = threading.Thread(target=db.close, daemon=True)
    closer.start()
    closer.join(_STOPPED_WITHIN)
    assert not closer.is_alive(), "close() waited for the runaway statement"
    with pytest.raises(SuaveplanError) as info:
        await asyncio.wait_for(task, _STOPPED_WITHIN)
    assert (info.value.code, info.value.details.get("reason")) == ("SAND_DB_ERROR", "closed")
    # The rows inserted before the stop were rolled back with the statement.
    assert _rows_on_disk(tmp_path / "host.db") == (3, "ok")


async def test_a_closed_adapter_refuses_calls_with_a_coded_error(db: SqliteDb) -> None:
    db.close()
    db.close()  # idempotent
    error = await _error(db, "SELECT 1")
    assert error.details["reason"] == "closed"
    with pytest.raises(SuaveplanError) as info:
        await db._execute("SELECT 1", [])
    assert info.value.details["reason"] == "closed"


async def test_a_statement_past_its_time_limit_is_stopped_and_rolled_back(
    fresh: Path, tmp_path: Path
) -> None:
    clock = FakeClock()
    db = await _migrated(
        SqliteDb(fresh, plugin_prefix="p_", statement_timeout=5.0, clock=clock), tmp_path
    )
    try:
        for sql in (RUNAWAY, RUNAWAY_INSERT):
            task = asyncio.create_task(db.query(sql, []))
            async with asyncio.timeout(_STOPPED_WITHIN):
                while not task.done():  # the deadline is set when the statement starts
                    clock.advance(10.0)
                    await asyncio.sleep(0.01)
            with pytest.raises(SuaveplanError) as info:
                await task
            assert info.value.code == "SAND_DB_ERROR"
            assert info.value.details == {"reason": "statement-timeout", "limit_ms": 5000}
        assert (await db.query("SELECT count(*) FROM p_t", [])).rows == ((3,),)
    finally:
        db.close()
    assert _rows_on_disk(fresh) == (3, "ok")


async def test_the_time_limit_has_a_default(fresh: Path) -> None:
    # A host without a wall-clock budget is still protected: the same clock, no argument.
    clock = FakeClock()
    db = SqliteDb(fresh, plugin_prefix="p_", clock=clock)
    try:
        task = asyncio.create_task(db.query(RUNAWAY, []))
        async with asyncio.timeout(_STOPPED_WITHIN):
            while not task.done():
                clock.advance(60.0)
                await asyncio.sleep(0.01)
        with pytest.raises(SuaveplanError) as info:
            await task
        assert info.value.details["reason"] == "statement-timeout"
    finally:
        db.close()


async def test_a_call_cancelled_while_it_waits_never_runs(db: SqliteDb) -> None:
    blocker = asyncio.create_task(db.query(RUNAWAY, []))
    await _running(db)
    waiting = asyncio.create_task(db.query("INSERT INTO p_t (x) VALUES (99)", []))
    await asyncio.sleep(0.05)
    waiting.cancel()
    blocker.cancel()
    for task in (waiting, blocker):
        with pytest.raises(asyncio.CancelledError):
            await task
    result = await asyncio.wait_for(db.query("SELECT count(*) FROM p_t", []), _STOPPED_WITHIN)
    assert result.rows == ((3,),)


async def test_cancelling_a_runaway_migration_stops_it_and_rolls_it_back(
    fresh: Path, tmp_path: Path
) -> None:
    db = SqliteDb(fresh, plugin_prefix="p_")
    mig = tmp_path / "runaway"
    mig.mkdir()
    (mig / "001.sql").write_text(f"CREATE TABLE p_t (x INTEGER);\n{RUNAWAY_INSERT};")
    try:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(apply_migrations(db, mig, plugin="p"), 0.2)
        error = await _error(db, "SELECT count(*) FROM p_t")  # the table was rolled back too
        assert "reason" not in error.details
    finally:
        db.close()


async def test_statements_a_migration_prepared_are_checked_again_at_runtime(
    db: SqliteDb, tmp_path: Path
) -> None:
    # The host's own text, prepared while migrating (when the migrations table is readable)
    # and kept in sqlite3's statement cache; a run with nothing to apply changes no schema
    # (which would expire it). Sent past a fooled gate, it must be authorized anew.
    assert await apply_migrations(db, tmp_path / "migrations", plugin="p") == []
    with pytest.raises(SuaveplanError) as info:
        await db._execute("SELECT name FROM _suaveplan_migrations WHERE plugin = ?", ["p"])
    assert info.value.code == "SAND_DB_ERROR"


# -- results ----------------------------------------------------------------------------------


async def test_a_result_over_the_row_limit_is_refused(fresh: Path, tmp_path: Path) -> None:
    db = await _migrated(SqliteDb(fresh, plugin_prefix="p_", max_result_rows=10), tmp_path)
    try:
        assert len((await db.query(f"{_counted(10)} SELECT x FROM c", [])).rows) == 10
        error = await _error(db, f"{_counted(11)} SELECT x FROM c")
        assert error.details == {
            "reason": "result-too-large",
            "max_rows": 10,
            "max_bytes": 16 * 1024 * 1024,
        }
    finally:
        db.close()


async def test_the_result_limits_have_defaults(db: SqliteDb) -> None:
    # Millions of rows, or a few large values, never reach the host's memory whole.
    error = await _error(db, f"{_counted(10_000_000)} SELECT x FROM c")
    assert error.details["reason"] == "result-too-large"
    error = await _error(db, f"{_counted(40)} SELECT zeroblob(1000000) FROM c")
    assert error.details["reason"] == "result-too-large"


async def test_a_result_over_the_byte_limit_is_refused(fresh: Path, tmp_path: Path) -> None:
    db = await _migrated(SqliteDb(fresh, plugin_prefix="p_", max_result_bytes=1000), tmp_path)
    try:
        assert (await db.query("SELECT length(zeroblob(900))", [])).rows == ((900,),)
        await db.query("SELECT zeroblob(900)", [])
        error = await _error(db, "SELECT zeroblob(600) UNION ALL SELECT zeroblob(600)")
        assert error.details["reason"] == "result-too-large"
        error = await _error(db, "SELECT ?", ["é" * 1200])
        assert error.details["reason"] == "result-too-large"
    finally:
        db.close()


@pytest.mark.parametrize("rows", [11, 12, 1000])
async def test_a_write_whose_returned_rows_are_refused_writes_nothing(
    fresh: Path, tmp_path: Path, rows: int
) -> None:
    # 11 rows with a limit of 10: the last row tips it over after SQLite has finished the
    # statement, which it commits when reset, unless the host's transaction takes it back.
    db = await _migrated(SqliteDb(fresh, plugin_prefix="p_", max_result_rows=10), tmp_path)
    try:
        error = await _error(
            db, f"{_counted(rows)} INSERT INTO p_t (x) SELECT x FROM c RETURNING x"
        )
        assert error.details["reason"] == "result-too-large"
        assert (await db.query("SELECT count(*) FROM p_t", [])).rows == ((3,),)
        accepted = await db.query(
            f"{_counted(10)} INSERT INTO p_t (x) SELECT x FROM c RETURNING x", []
        )
        assert len(accepted.rows) == 10
        assert (await db.query("SELECT count(*) FROM p_t", [])).rows == ((13,),)
        # The host's transaction statements are its own: the authorizer still refuses them.
        for sql in ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT s"):
            with pytest.raises(SuaveplanError):
                await db._execute(sql, [])
    finally:
        db.close()
    assert _rows_on_disk(fresh) == (13, "ok")


# -- values and engine steps ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "params"),
    [
        ("SELECT zeroblob(?)", [2 * 1024 * 1024]),
        ("SELECT hex(randomblob(?))", [600_000]),
        ("SELECT replace(printf('%.*c', 1000, 'a'), 'a', printf('%.*c', 2000, 'b'))", []),
        (f"{_counted(100_000)} SELECT group_concat(printf('%.*c', 100, 'x')) FROM c", []),
        ("INSERT INTO p_t (x) VALUES (?)", [b"x" * (2 * 1024 * 1024)]),
    ],
)
async def test_a_value_over_the_value_limit_is_refused(
    db: SqliteDb, sql: str, params: list[Any]
) -> None:
    error = await _error(db, sql, params)
    assert error.details["reason"] == "value-too-large"
    assert (await db.query("SELECT count(*) FROM p_t", [])).rows == ((3,),)


async def test_printf_past_the_value_limit_yields_null_or_is_refused(db: SqliteDb) -> None:
    # SQLite's printf stops building its text at the limit (before: a gigabyte) and answers NULL.
    result = await db.query("SELECT printf('%5000000d', 1) IS NULL", [])
    assert result.rows == ((1,),)
    # A `%c` repeat count past the limit is refused before SQLite runs it: SQLite would still
    # write every repeat, one at a time, in a step no deadline reaches.
    error = await _error(db, "SELECT printf('%.*c', ?, 'x') IS NULL", [2 * 1024 * 1024])
    assert error.details["reason"] == "value-too-large"


async def test_values_up_to_the_value_limit_are_fine(db: SqliteDb) -> None:
    limit = 1024 * 1024
    blob: list[Any] = [b"x" * (limit - 100)]
    await db.query("INSERT INTO p_t (x) VALUES (?)", blob)
    result = await db.query("SELECT length(x) FROM p_t WHERE typeof(x) = 'blob'", [])
    assert result.rows == ((limit - 100,),)


async def test_a_row_has_at_most_max_result_columns_values(db: SqliteDb) -> None:
    # A row is built whole before it can be counted: its width bounds it.
    assert len((await db.query("SELECT " + ", ".join(["1"] * 100), [])).rows[0]) == 100
    await _error(db, "SELECT " + ", ".join(["zeroblob(1000000)"] * 101))


async def test_a_like_pattern_over_the_limit_is_refused(db: SqliteDb) -> None:
    assert (await db.query("SELECT 'a' LIKE ?", ["%" * 1000])).rows == ((1,),)
    await _error(db, "SELECT 'a' LIKE ?", ["%" * 1001])
    await _error(db, "SELECT 'a' GLOB ?", ["*" * 1001])


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        # Each of these is one engine step of minutes with SQLite's own function: neither
        # interrupt() nor the progress handler could stop it, and close() waited for it.
        (
            "SELECT length(trim(printf('%.*c', 300000, 'a'), printf('%.*c', 300000, 'b') || 'a'))",
            0,
        ),
        (
            "SELECT length(ltrim(printf('%.*c', 300000, 'a'), printf('%.*c', 300000, 'b') || 'a'))",
            0,
        ),
        (
            "SELECT length(rtrim(printf('%.*c', 300000, 'a'), printf('%.*c', 300000, 'b') || 'a'))",
            0,
        ),
        (
            "SELECT length(replace(printf('%.*c', 8000000, 'a'), "
            "printf('%.*c', 4000000, 'a') || 'b', 'x'))",
            8_000_000,
        ),
        ("SELECT instr(printf('%.*c', 8000000, 'a'), printf('%.*c', 4000000, 'a') || 'b')", 0),
    ],
)
async def test_text_functions_take_linear_time(fresh: Path, sql: str, expected: int) -> None:
    db = SqliteDb(fresh, plugin_prefix="p_", max_value_bytes=16 * 1024 * 1024)
    try:
        result = await asyncio.wait_for(db.query(sql, []), _STOPPED_WITHIN)
        assert result.rows == ((expected,),)
    finally:
        db.close()


async def test_a_costly_call_sqlite_would_answer_itself_is_refused(db: SqliteDb) -> None:
    # A REAL (spelled SQLite's way) or a BLOB that is not UTF-8 goes to SQLite's own trim,
    # only while that is quick.
    assert (await db.query("SELECT trim(?, ?)", [1.5, "1"])).rows == ((".5",),)
    error = await _error(db, "SELECT trim(?, ?)", [b"\xff" * 10_000, b"\xfe" * 10_000])
    assert error.details["reason"] == "function-too-costly"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"statement_timeout": 0},
        {"statement_timeout": float("inf")},
        {"statement_timeout": float("nan")},
        {"max_result_rows": 0},
        {"max_result_bytes": -1},
        {"max_result_columns": 1.5},
        {"max_value_bytes": True},
    ],
)
def test_limits_must_be_positive(fresh: Path, kwargs: dict[str, Any]) -> None:
    with pytest.raises(SuaveplanError) as info:
        SqliteDb(fresh, plugin_prefix="p_", **kwargs)
    assert info.value.code == "SAND_INVALID_ARGUMENT"


async def test_disposing_the_gateway_stops_a_running_sqlite_statement(fresh: Path) -> None:
    # The path a wall-clock budget or `dispose()` takes: the gateway cancels the adapter's
    # awaitable, which must reach the statement on the adapter's thread.
    manifest = {"name": "p", "version": "1.0.0", "database": {"tablePrefix": "p_"}}
    policy = PermissionPolicy.from_manifest(manifest, root=str(fresh.parent))
    db = SqliteDb(fresh, plugin_prefix="p_")
    gateway = Gateway(checker=PermissionChecker(policy), adapters=Adapters(db=db))
    try:
        call = asyncio.create_task(gateway.dispatch("db", "query", {"sql": RUNAWAY}))
        await _running(db)
        await gateway.close()
        with pytest.raises(SuaveplanError) as info:
            await asyncio.wait_for(call, _STOPPED_WITHIN)
        assert info.value.code == "SAND_CANCELLED"
        result = await asyncio.wait_for(db.query("SELECT 1", []), _STOPPED_WITHIN)
        assert result.rows == ((1,),)
    finally:
        db.close()


async def test_a_database_sqlite_cannot_read_fails_migrations_with_a_coded_error(
    fresh: Path, tmp_path: Path
) -> None:
    fresh.write_bytes(b"not a database, " * 512)
    db = SqliteDb(fresh, plugin_prefix="p_")
    mig = tmp_path / "migrations"
    mig.mkdir()
    (mig / "001.sql").write_text("CREATE TABLE p_t (x INTEGER);")
    try:
        with pytest.raises(SuaveplanError) as info:
            await apply_migrations(db, mig, plugin="p")
        assert info.value.code == "SAND_DB_MIGRATION_FAILED"
    finally:
        db.close()


async def test_a_database_reopened_with_fewer_result_columns_than_a_tables_width_still_answers(
    fresh: Path, tmp_path: Path
) -> None:
    wide = SqliteDb(fresh, plugin_prefix="p_")
    mig = tmp_path / "wide"
    mig.mkdir()
    (mig / "001.sql").write_text("CREATE TABLE p_w (a, b, c, d, e);")
    await apply_migrations(wide, mig, plugin="p")
    await wide.query("INSERT INTO p_w VALUES (1, 2, 3, 4, 5)", [])
    wide.close()
    # The schema (p_w, and the host's 3-column migrations table) is wider than the limit:
    # it used to be read under it, and every statement failed as a malformed schema.
    db = SqliteDb(fresh, plugin_prefix="p_", max_result_columns=2)
    try:
        assert (await db.query("SELECT a, e FROM p_w", [])).rows == ((1, 5),)
        with pytest.raises(SuaveplanError) as info:
            await db.query("SELECT * FROM p_w", [])
        assert info.value.code == "SAND_DB_ERROR"
    finally:
        db.close()
