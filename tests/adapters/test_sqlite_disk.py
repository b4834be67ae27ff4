"""SqliteDb keeps the host's disk: the database file has a byte quota no plugin statement can
lift, a full database is a coded error that loses nothing committed, and what one statement
writes to disk (its temporary files above all) is bounded."""

from __future__ import annotations

import asyncio
import os
import sqlite3
from collections.abc import AsyncIterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from suaveplan_sandbox.adapters import _sqlite_writes
from suaveplan_sandbox.adapters._sqlite import (
    DEFAULT_MAX_DB_BYTES,
    DEFAULT_MAX_STATEMENT_WRITE_BYTES,
    SqliteDb,
    apply_migrations,
)
from suaveplan_sandbox.errors import SuaveplanError

_WITHIN = 60.0
_SMALL_DB = 64 * 1024  # 16 pages of 4 KiB
_KIB_ROWS = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < {n})"
# Each row sorts by a 2,000-byte key: n rows spill about 2 n KB to a temporary file.
_SORT = _KIB_ROWS + " SELECT x FROM c ORDER BY randomblob(2000) LIMIT -1 OFFSET {skip}"


def _sort(n: int) -> str:
    return _SORT.format(n=n, skip=n - 1)


async def _migrated(db: SqliteDb, folder: Path, schema: str = "") -> SqliteDb:
    mig = folder / "migrations"
    mig.mkdir(exist_ok=True)
    (mig / "001.sql").write_text(schema or "CREATE TABLE p_t (x INTEGER, b BLOB);")
    await apply_migrations(db, mig, plugin="p")
    return db


@pytest.fixture
async def small(tmp_path: Path) -> AsyncIterator[SqliteDb]:
    db = await _migrated(
        SqliteDb(tmp_path / "h.db", plugin_prefix="p_", max_db_bytes=_SMALL_DB), tmp_path
    )
    yield db
    db.close()


async def _refusal(db: SqliteDb, sql: str, params: list[Any] | None = None) -> SuaveplanError:
    with pytest.raises(SuaveplanError) as info:
        await asyncio.wait_for(db.query(sql, params or []), _WITHIN)
    assert info.value.code == "SAND_DB_ERROR"
    return info.value


def _on_disk(path: Path) -> tuple[list[tuple[int, int]], str]:
    """(x, length(b)) of every row, and SQLite's integrity check, read by a plain connection."""
    with closing(sqlite3.connect(path)) as conn:
        rows = conn.execute("SELECT x, length(b) FROM p_t ORDER BY x").fetchall()
        check = conn.execute("PRAGMA integrity_check").fetchone()[0]
    return rows, check


# -- the database file's quota --------------------------------------------------------------


async def test_a_full_database_is_a_coded_error_and_keeps_what_was_committed(
    small: SqliteDb, tmp_path: Path
) -> None:
    for x in range(3):
        await small.query("INSERT INTO p_t (x, b) VALUES (?, randomblob(1000))", [x])
    error = await _refusal(
        small,
        _KIB_ROWS.format(n=200) + " INSERT INTO p_t (x, b) SELECT x + 10, randomblob(1000) FROM c",
    )
    assert error.details == {"reason": "database-full"}
    # The whole statement was rolled back; the rows committed before it are all there.
    assert (await small.query("SELECT count(*) FROM p_t", [])).rows == ((3,),)
    small.close()
    assert _on_disk(tmp_path / "h.db") == ([(0, 1000), (1, 1000), (2, 1000)], "ok")
    assert os.path.getsize(tmp_path / "h.db") <= _SMALL_DB


async def test_a_full_database_refuses_rows_one_by_one_and_takes_them_again_once_emptied(
    small: SqliteDb,
) -> None:
    inserted = 0
    with pytest.raises(SuaveplanError) as info:
        for x in range(1000):
            await small.query("INSERT INTO p_t (x, b) VALUES (?, randomblob(1000))", [x])
            inserted += 1
    assert info.value.details == {"reason": "database-full"}
    assert 0 < inserted < 64  # 64 KiB hold no more than ~60 rows of 1000 bytes
    await small.query("DELETE FROM p_t", [])
    # Pages freed by the delete are used again: the quota is on the file, not on writes.
    for x in range(inserted):
        await small.query("INSERT INTO p_t (x, b) VALUES (?, randomblob(1000))", [x])


async def test_a_write_that_returns_rows_into_a_full_database_writes_nothing(
    small: SqliteDb, tmp_path: Path
) -> None:
    await small.query("INSERT INTO p_t (x, b) VALUES (1, randomblob(1000))", [])
    error = await _refusal(
        small,
        _KIB_ROWS.format(n=200) + " INSERT INTO p_t (x, b) SELECT x + 10, randomblob(1000) FROM c"
        " RETURNING x",
    )
    assert error.details == {"reason": "database-full"}
    small.close()
    assert _on_disk(tmp_path / "h.db") == ([(1, 1000)], "ok")


async def test_a_migration_that_fills_the_database_fails_with_the_reason(tmp_path: Path) -> None:
    db = SqliteDb(tmp_path / "h.db", plugin_prefix="p_", max_db_bytes=_SMALL_DB)
    mig = tmp_path / "migrations"
    mig.mkdir()
    (mig / "001.sql").write_text(
        "CREATE TABLE p_t (x INTEGER, b BLOB);\n"
        + _KIB_ROWS.format(n=500)
        + " INSERT INTO p_t (x, b) SELECT x, randomblob(1000) FROM c;"
    )
    try:
        with pytest.raises(SuaveplanError) as info:
            await apply_migrations(db, mig, plugin="p")
        assert info.value.code == "SAND_DB_MIGRATION_FAILED"
        assert info.value.details == {"migration": "001.sql", "reason": "database-full"}
    finally:
        db.close()


# Statements a plugin might try to lift the quota with, or to write a file beside it.
_LIFTERS = [
    "PRAGMA max_page_count = 1000000000",
    "PRAGMA main.max_page_count = 1000000000",
    "PRAGMA page_size = 65536",
    "PRAGMA temp_store = MEMORY",
    "SELECT * FROM pragma_max_page_count",
    "SELECT * FROM pragma_max_page_count(1000000000)",
    "ATTACH '{dir}/other.db' AS other",
    "ATTACH ':memory:' AS other",
    "VACUUM INTO '{dir}/copy.db'",
    "VACUUM",
]


@pytest.mark.parametrize("sql", _LIFTERS)
async def test_a_plugin_cannot_lift_the_quota_or_write_another_file(
    tmp_path: Path, sql: str
) -> None:
    # The prefix `pragma_` puts the pragma table-valued functions' names in scope, so only
    # the engine's authorizer stands between them and the plugin: the gate is fooled.
    db = await _migrated(
        SqliteDb(tmp_path / "h.db", plugin_prefix="pragma_", max_db_bytes=_SMALL_DB),
        tmp_path,
        "CREATE TABLE pragma_t (x INTEGER, b BLOB);",
    )
    try:
        text = sql.format(dir=tmp_path)
        with pytest.raises(SuaveplanError) as gate:
            await db.query(text, [])
        assert gate.value.code in ("SAND_PERM_DENIED", "SAND_DB_ERROR")
        with pytest.raises(SuaveplanError) as engine:  # past the gate, as a parser bug would be
            await db._execute(text, [])
        assert engine.value.code == "SAND_DB_ERROR"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["h.db", "migrations"]
        with pytest.raises(SuaveplanError) as full:
            await db.query(
                _KIB_ROWS.format(n=200)
                + " INSERT INTO pragma_t (x, b) SELECT x, randomblob(1000) FROM c",
                [],
            )
        assert full.value.details == {"reason": "database-full"}
    finally:
        db.close()


async def test_a_file_already_past_the_quota_opens_and_cannot_grow(tmp_path: Path) -> None:
    path = tmp_path / "h.db"
    big = await _migrated(SqliteDb(path, plugin_prefix="p_"), tmp_path)
    await big.query(
        _KIB_ROWS.format(n=100) + " INSERT INTO p_t (x, b) SELECT x, randomblob(1000) FROM c", []
    )
    big.close()
    size = os.path.getsize(path)
    assert size > _SMALL_DB
    db = SqliteDb(path, plugin_prefix="p_", max_db_bytes=_SMALL_DB)
    try:
        assert (await db.query("SELECT count(*) FROM p_t", [])).rows == ((100,),)
        error = await _refusal(
            db, _KIB_ROWS.format(n=20) + " INSERT INTO p_t (x, b) SELECT x, randomblob(1000) FROM c"
        )
        assert error.details == {"reason": "database-full"}
    finally:
        db.close()
    assert os.path.getsize(path) == size


# -- what one statement writes: temporary files ----------------------------------------------


async def test_this_platform_counts_what_a_statement_writes(small: SqliteDb) -> None:
    # CI and the supported hosts are Linux: the limit below is really enforced there.
    assert small.counts_statement_writes


async def test_a_sort_that_spills_past_the_write_limit_is_stopped(tmp_path: Path) -> None:
    db = await _migrated(
        SqliteDb(tmp_path / "h.db", plugin_prefix="p_", max_statement_write_bytes=4 << 20),
        tmp_path,
    )
    try:
        # ~1 MB of sort keys is sorted (spilled or not) well within the limit...
        assert len((await db.query(_sort(500), [])).rows) == 1
        # ...while ~40 MB is stopped once it has written 4 MiB, not when it is done.
        error = await _refusal(db, _sort(20_000))
        assert error.details == {"reason": "statement-write-limit", "limit_bytes": 4 << 20}
        assert len((await db.query(_sort(500), [])).rows) == 1  # the next statement runs
    finally:
        db.close()


async def test_a_recursive_union_that_spills_past_the_write_limit_is_stopped(
    tmp_path: Path,
) -> None:
    db = await _migrated(
        SqliteDb(tmp_path / "h.db", plugin_prefix="p_", max_statement_write_bytes=4 << 20),
        tmp_path,
    )
    # UNION (not UNION ALL) keeps every row seen in a temporary table, to drop duplicates.
    sql = (
        "WITH RECURSIVE c(x, k) AS (SELECT 1, randomblob(2000) UNION "
        "SELECT x + 1, randomblob(2000) FROM c WHERE x < 20000) SELECT count(*) FROM c"
    )
    try:
        error = await _refusal(db, sql)
        assert error.details["reason"] == "statement-write-limit"
    finally:
        db.close()


async def test_a_write_stopped_at_the_write_limit_writes_nothing(tmp_path: Path) -> None:
    db = await _migrated(
        SqliteDb(tmp_path / "h.db", plugin_prefix="p_", max_statement_write_bytes=4 << 20),
        tmp_path,
    )
    await db.query("INSERT INTO p_t (x, b) VALUES (1, x'00')", [])
    sql = (
        _KIB_ROWS.format(n=20_000)
        + " INSERT INTO p_t (x, b) SELECT x + 1, randomblob(10) FROM c ORDER BY randomblob(2000)"
    )
    try:
        error = await _refusal(db, sql)
        assert error.details["reason"] == "statement-write-limit"
    finally:
        db.close()
    assert _on_disk(tmp_path / "h.db") == ([(1, 1)], "ok")


async def test_a_migration_that_spills_past_the_write_limit_is_stopped(tmp_path: Path) -> None:
    db = SqliteDb(tmp_path / "h.db", plugin_prefix="p_", max_statement_write_bytes=4 << 20)
    mig = tmp_path / "migrations"
    mig.mkdir()
    (mig / "001.sql").write_text(
        "CREATE TABLE p_t (x INTEGER, b BLOB);\n"
        + _KIB_ROWS.format(n=20_000)
        + " INSERT INTO p_t (x, b) SELECT x, randomblob(10) FROM c ORDER BY randomblob(2000);"
    )
    try:
        with pytest.raises(SuaveplanError) as info:
            await apply_migrations(db, mig, plugin="p")
        assert info.value.code == "SAND_DB_MIGRATION_FAILED"
        assert info.value.details == {"migration": "001.sql", "reason": "statement-write-limit"}
    finally:
        db.close()


async def test_a_statement_whose_writes_cannot_be_counted_is_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = await _migrated(SqliteDb(tmp_path / "h.db", plugin_prefix="p_"), tmp_path)
    # The counter's file disappears (a /proc without I/O accounting, say): fail closed.
    monkeypatch.setattr(_sqlite_writes, "_IO_FILE", str(tmp_path / "no-such-file"))
    assert db._writes is not None
    db._writes.close()
    try:
        error = await _refusal(db, _sort(20_000))
        assert error.details["reason"] == "statement-write-limit"
    finally:
        db.close()


# -- configuration --------------------------------------------------------------------------


def test_the_disk_limits_have_defaults() -> None:
    assert DEFAULT_MAX_DB_BYTES == 1024**3
    assert DEFAULT_MAX_STATEMENT_WRITE_BYTES == 1024**3


@pytest.mark.parametrize("name", ["max_db_bytes", "max_statement_write_bytes"])
@pytest.mark.parametrize("value", [0, -1, 1.5, True, float("inf")])
def test_disk_limits_must_be_positive_ints(tmp_path: Path, name: str, value: object) -> None:
    with pytest.raises(SuaveplanError) as info:
        SqliteDb(tmp_path / "h.db", plugin_prefix="p_", **{name: value})  # type: ignore[arg-type]
    assert info.value.code == "SAND_INVALID_ARGUMENT"
    assert not (tmp_path / "h.db").exists()


async def test_attach_and_vacuum_into_are_refused_by_the_connection_even_without_the_authorizer(
    small: SqliteDb, tmp_path: Path
) -> None:
    small._conn.set_authorizer(None)  # the layer below the authorizer, on its own
    for sql in (
        f"ATTACH '{tmp_path}/other.db' AS other",
        "ATTACH ':memory:' AS other",
        f"VACUUM INTO '{tmp_path}/other.db'",
    ):
        with pytest.raises(SuaveplanError) as info:
            await small._execute(sql, [])
        assert info.value.code == "SAND_DB_ERROR"
    assert not (tmp_path / "other.db").exists()
