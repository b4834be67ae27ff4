"""SqliteDb: gate plus engine authorizer; migrations applied once, atomically, prefix-only."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from suaveplan_sandbox.adapters._sqlite import SqliteDb, apply_migrations
from suaveplan_sandbox.errors import SuaveplanError


@pytest.fixture
def db(tmp_path: Path) -> Iterator[SqliteDb]:
    database = SqliteDb(tmp_path / "host.db", plugin_prefix="p_")
    yield database
    database.close()


async def _migrate(db: SqliteDb, tmp_path: Path, files: dict[str, str]) -> list[str]:
    mig = tmp_path / "migrations"
    mig.mkdir(exist_ok=True)
    for name, sql in files.items():
        (mig / name).write_text(sql)
    return await apply_migrations(db, mig, plugin="p", version="1.0.0")


async def _code(db: SqliteDb, sql: str, *, bypass_gate: bool = False) -> str:
    with pytest.raises(SuaveplanError) as info:
        if bypass_gate:
            await db._execute(sql, [])
        else:
            await db.query(sql, [])
    return info.value.code


async def test_migrations_apply_in_order_once_and_queries_bind_params(
    db: SqliteDb, tmp_path: Path
) -> None:
    files = {
        "002_seed.sql": "INSERT INTO p_items (name) VALUES ('seed');",
        "001_create.sql": "CREATE TABLE p_items (id INTEGER PRIMARY KEY, name TEXT);\n"
        "CREATE INDEX p_items_name ON p_items (name);",
    }
    assert await _migrate(db, tmp_path, files) == ["001_create.sql", "002_seed.sql"]
    assert await _migrate(db, tmp_path, files) == []
    hostile = "x'); DROP TABLE p_items; --"
    await db.query("INSERT INTO p_items (name) VALUES (?)", [hostile])
    result = await db.query("SELECT name FROM p_items ORDER BY id", [])
    assert result.columns == ("name",)
    assert result.rows == (("seed",), (hostile,))


async def test_a_failing_migration_leaves_nothing_half_applied(
    db: SqliteDb, tmp_path: Path
) -> None:
    with pytest.raises(SuaveplanError) as info:
        await _migrate(
            db,
            tmp_path,
            {"001.sql": "CREATE TABLE p_a (x INTEGER);\nINSERT INTO p_missing VALUES (1);"},
        )
    assert info.value.code == "SAND_DB_MIGRATION_FAILED"
    assert await _code(db, "SELECT * FROM p_a") == "SAND_DB_ERROR"


async def test_migrations_refuse_ddl_outside_the_prefix(db: SqliteDb, tmp_path: Path) -> None:
    with pytest.raises(SuaveplanError) as info:
        await _migrate(db, tmp_path, {"001.sql": "CREATE TABLE other (x INTEGER);"})
    assert info.value.code == "SAND_DB_MIGRATION_FAILED"


async def test_the_gate_refuses_out_of_scope_sql(db: SqliteDb, tmp_path: Path) -> None:
    await _migrate(db, tmp_path, {"001.sql": "CREATE TABLE p_t (x INTEGER);"})
    for sql in (
        "SELECT * FROM other",
        "ATTACH DATABASE '/tmp/x.db' AS x",
        "PRAGMA table_info(p_t)",
        "SELECT * FROM sqlite_master",
        "DROP TABLE p_t",
        "SELECT * FROM _suaveplan_migrations",
    ):
        assert await _code(db, sql) == "SAND_PERM_DENIED", sql


async def test_the_authorizer_catches_what_a_fooled_parser_would_miss(
    db: SqliteDb, tmp_path: Path
) -> None:
    await _migrate(db, tmp_path, {"001.sql": "CREATE TABLE p_t (x INTEGER);"})
    db._conn.set_authorizer(None)
    db._conn.execute("CREATE TABLE other_plugin (secret TEXT)")
    db._conn.set_authorizer(db._authorize)
    # Straight to the engine: as if the gate had been fooled into Allow.
    for sql in (
        "SELECT * FROM p_t WHERE x IN (SELECT 1 FROM other_plugin)",
        "WITH p_cte AS (SELECT secret FROM other_plugin) SELECT * FROM p_cte",
        "SELECT * FROM _suaveplan_migrations",
        "SELECT name FROM sqlite_master",
        "ATTACH DATABASE ':memory:' AS x",
        "PRAGMA table_info(p_t)",
        "SELECT load_extension('x')",
        "SELECT readfile('/etc/passwd')",
        "CREATE TABLE p_new (x INTEGER)",
        "DELETE FROM other_plugin",
    ):
        assert await _code(db, sql, bypass_gate=True) == "SAND_DB_ERROR", sql
    assert (await db._execute("SELECT count(*), upper('a') FROM p_t", [])).rows == ((0, "A"),)


async def test_the_authorizer_is_used_even_when_the_gate_allows_everything(
    db: SqliteDb, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from suaveplan_sandbox.permissions._decision import Allow

    db._conn.set_authorizer(None)
    db._conn.execute("CREATE TABLE other_plugin (secret TEXT)")
    db._conn.set_authorizer(db._authorize)

    class AllowEverything:
        def check_query(self, sql: str, params: object = ()) -> Allow:
            return Allow(rule=None, target=sql)

    monkeypatch.setattr(db, "_gate", AllowEverything())
    assert await _code(db, "SELECT secret FROM other_plugin") == "SAND_DB_ERROR"


async def test_a_query_reading_only_ctes_runs_although_sqlite_reports_cte_reads_as_tables(
    db: SqliteDb, tmp_path: Path
) -> None:
    await _migrate(db, tmp_path, {"001.sql": "CREATE TABLE p_t (x INTEGER);"})
    sql = "WITH a AS (SELECT 1), b AS (SELECT * FROM a) SELECT count(*) FROM b, p_t"
    assert (await db.query(sql, [])).rows == ((0,),)


async def test_a_cte_name_never_lets_a_real_table_read_through(
    db: SqliteDb, tmp_path: Path
) -> None:
    await _migrate(db, tmp_path, {"001.sql": "CREATE TABLE p_t (x INTEGER);"})
    db._conn.set_authorizer(None)
    db._conn.execute("CREATE TABLE other_plugin (secret TEXT)")
    db._conn.set_authorizer(db._authorize)
    # Straight to the engine, as if the gate had been fooled.
    for sql in (
        "WITH q AS (SELECT 1) SELECT count(*) FROM other_plugin, q",
        "SELECT (SELECT count(*) FROM other_plugin), (WITH other_plugin AS (SELECT 1) SELECT 1)",
        # Ambiguous (a CTE named like a real unprefixed table): refused, never guessed.
        "WITH other_plugin AS (SELECT 1) SELECT count(*) FROM other_plugin",
        "WITH sqlite_master AS (SELECT 1) SELECT count(*) FROM sqlite_master",
    ):
        assert await _code(db, sql, bypass_gate=True) == "SAND_DB_ERROR", sql


async def test_sqlite_spellings_the_gate_allows_run_with_their_parameters(
    db: SqliteDb, tmp_path: Path
) -> None:
    await _migrate(
        db, tmp_path, {"001.sql": "CREATE TABLE p_t (k INTEGER UNIQUE, v BLOB, n INTEGER);"}
    )
    await db.query("REPLACE INTO p_t (k, v, n) VALUES (?1, x'00ff', ?2)", [1, 10])
    await db.query("UPDATE OR REPLACE p_t SET n = ?2 WHERE k = ?1", [1, 11])
    upsert = (
        "INSERT INTO p_t (k, v, n) VALUES (?1, x'01', ?2) "
        "ON CONFLICT (k) DO UPDATE SET n = n + excluded.n RETURNING k, v, n"
    )
    rows: tuple[tuple[object, ...], ...] = (await db.query(upsert, [1, 5])).rows
    assert rows == ((1, b"\x00\xff", 16),)
    assert await _code(db, "REPLACE INTO other_plugin (secret) VALUES ('x')") == (
        "SAND_PERM_DENIED"
    )
