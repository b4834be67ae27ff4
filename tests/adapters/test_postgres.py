"""PostgresDb against a real PostgreSQL: the gate, per-plugin roles, and host-run migrations."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from suaveplan_sandbox.adapters import _postgres
from suaveplan_sandbox.adapters._postgres import (
    PostgresDb,
    apply_postgres_migrations,
    provision_postgres_plugin,
)
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions._decision import Allow


def _write(folder: Path, files: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, sql in files.items():
        (folder / name).write_text(sql)
    return folder


async def _fetch(conninfo: str, sql: str) -> list[tuple[object, ...]]:
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
        return list(await (await conn.execute(sql)).fetchall())


async def _raw_refused(conninfo: str, sql: str) -> bool:
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
        try:
            await conn.execute(sql)
        except psycopg.Error:
            return True
    return False


async def test_a_plugin_role_cannot_read_another_plugins_table(
    postgres_admin: str, tmp_path: Path
) -> None:
    alpha = await provision_postgres_plugin(postgres_admin, "alpha", "a_")
    beta = await provision_postgres_plugin(postgres_admin, "beta", "b_")
    await apply_postgres_migrations(
        postgres_admin,
        _write(tmp_path / "beta", {"001.sql": "CREATE TABLE b_secret (v text);"}),
        plugin="beta",
        prefix="b_",
    )
    await apply_postgres_migrations(
        postgres_admin,
        _write(tmp_path / "alpha", {"001.sql": "CREATE TABLE a_items (id serial, v text);"}),
        plugin="alpha",
        prefix="a_",
    )
    async with await psycopg.AsyncConnection.connect(beta, autocommit=True) as conn:
        await conn.execute("INSERT INTO b_secret VALUES ('beta-only')")
    # A raw connection with alpha's credentials: no route to beta's rows, and no DDL at all.
    for raw in (
        "SELECT * FROM suaveplan_beta.b_secret",
        "SELECT * FROM b_secret",
        "CREATE TABLE a_new (x int)",
        "CREATE TABLE suaveplan_alpha.a_new (x int)",
        "DROP TABLE a_items",
        "SELECT * FROM suaveplan_host.migrations",
    ):
        assert await _raw_refused(alpha, raw), raw
    db = PostgresDb(alpha, plugin="alpha", prefix="a_")
    await db.query("INSERT INTO a_items (v) VALUES (%s)", ["x'); DROP TABLE a_items; --"])
    result = await db.query("SELECT v FROM a_items", [])
    assert result.rows == (("x'); DROP TABLE a_items; --",),)
    with pytest.raises(SuaveplanError) as info:
        await db.query("SELECT * FROM b_secret", [])
    assert info.value.code == "SAND_PERM_DENIED"
    with pytest.raises(SuaveplanError) as info:
        await db._execute("SELECT * FROM suaveplan_beta.b_secret", [])
    assert info.value.code == "SAND_DB_ERROR"
    await db.aclose()


async def test_migrations_apply_once_per_plugin_and_record_the_version(
    postgres_admin: str, tmp_path: Path
) -> None:
    conninfo = await provision_postgres_plugin(postgres_admin, "gamma", "g_")
    folder = _write(
        tmp_path,
        {
            "002_seed.sql": "INSERT INTO g_items (name) VALUES ('seed');",
            "001_create.sql": "CREATE TABLE g_items (id serial PRIMARY KEY, name text NOT NULL);\n"
            "CREATE INDEX g_items_name ON g_items (name);",
        },
    )
    applied = await apply_postgres_migrations(
        postgres_admin, folder, plugin="gamma", prefix="g_", version="1.0.0"
    )
    assert applied == ["001_create.sql", "002_seed.sql"]
    again = await apply_postgres_migrations(
        postgres_admin, folder, plugin="gamma", prefix="g_", version="1.0.0"
    )
    assert again == []
    _write(tmp_path, {"003_more.sql": "ALTER TABLE g_items ADD COLUMN note text;"})
    assert await apply_postgres_migrations(
        postgres_admin, folder, plugin="gamma", prefix="g_", version="1.1.0"
    ) == ["003_more.sql"]
    history = await _fetch(
        postgres_admin,
        "SELECT name, version FROM suaveplan_host.migrations WHERE plugin = 'gamma' ORDER BY name",
    )
    assert history == [
        ("001_create.sql", "1.0.0"),
        ("002_seed.sql", "1.0.0"),
        ("003_more.sql", "1.1.0"),
    ]
    db = PostgresDb(conninfo, plugin="gamma", prefix="g_")
    # The runtime role got DML on the migrated table and its sequence.
    await db.query("INSERT INTO g_items (name, note) VALUES (%s, %s)", ["b", "n"])
    rows = await db.query("SELECT name, note FROM g_items ORDER BY id", [])
    assert rows.rows == (("seed", None), ("b", "n"))
    await db.aclose()


async def test_a_failing_postgres_migration_leaves_nothing_half_applied(
    postgres_admin: str, tmp_path: Path
) -> None:
    await provision_postgres_plugin(postgres_admin, "delta", "d_")
    folder = _write(
        tmp_path,
        {
            "001_ok.sql": "CREATE TABLE d_first (x int);",
            "002_bad.sql": "CREATE TABLE d_half (x int);\nINSERT INTO d_missing VALUES (1);",
        },
    )
    with pytest.raises(SuaveplanError) as info:
        await apply_postgres_migrations(postgres_admin, folder, plugin="delta", prefix="d_")
    assert info.value.code == "SAND_DB_MIGRATION_FAILED"
    assert info.value.details["migration"] == "002_bad.sql"
    tables = await _fetch(
        postgres_admin,
        "SELECT tablename FROM pg_tables WHERE schemaname = 'suaveplan_delta' ORDER BY 1",
    )
    assert tables == [("d_first",)]
    recorded = await _fetch(
        postgres_admin, "SELECT name FROM suaveplan_host.migrations WHERE plugin = 'delta'"
    )
    assert recorded == [("001_ok.sql",)]
    # Fixed file: it now applies, once.
    _write(tmp_path, {"002_bad.sql": "CREATE TABLE d_half (x int);"})
    assert await apply_postgres_migrations(postgres_admin, folder, plugin="delta", prefix="d_") == [
        "002_bad.sql"
    ]


@pytest.mark.parametrize(
    "bad",
    [
        "CREATE TABLE other (x int);",
        "ALTER TABLE b_secret ADD COLUMN stolen text;",
        "DROP TABLE b_secret;",
        "CREATE INDEX e_idx ON b_secret (v);",
        "CREATE TABLE suaveplan_beta.e_x (x int);",
        "CREATE TABLE public.e_x (x int);",
        "CREATE VIEW e_peek AS SELECT * FROM b_secret;",
        "GRANT ALL ON e_ok TO PUBLIC;",
        "CREATE FUNCTION e_f() RETURNS int AS $$ SELECT 1 $$ LANGUAGE sql;",
        "CREATE TABLE e_ok2 (x int); SET ROLE admin;",
    ],
)
async def test_a_migration_outside_the_prefix_is_refused_before_anything_runs(
    postgres_admin: str, tmp_path: Path, bad: str
) -> None:
    await provision_postgres_plugin(postgres_admin, "epsilon", "e_")
    folder = _write(tmp_path, {"001_ok.sql": "CREATE TABLE e_ok (x int);", "002.sql": bad})
    with pytest.raises(SuaveplanError) as info:
        await apply_postgres_migrations(postgres_admin, folder, plugin="epsilon", prefix="e_")
    assert info.value.code == "SAND_DB_MIGRATION_FAILED"
    assert info.value.details["migration"] == "002.sql"
    # Refused while planning: not even the good first file ran.
    assert (
        await _fetch(
            postgres_admin, "SELECT 1 FROM pg_tables WHERE schemaname = 'suaveplan_epsilon'"
        )
        == []
    )


class _AllowEverything:
    """A gate fooled into Allow: what the database itself must still refuse."""

    def __init__(self, prefix: str, *, dialect: str) -> None:
        del prefix, dialect

    def check_migration(self, sql: str) -> list[Allow]:
        return [Allow(rule=None, target=s) for s in sql.split(";") if s.strip()]


@pytest.mark.parametrize(
    "bad",
    [
        "DROP TABLE suaveplan_beta.b_secret",
        "CREATE TABLE z_copy AS SELECT * FROM suaveplan_beta.b_secret",
        "CREATE TABLE public.z_planted (x int)",
        "CREATE TABLE unprefixed (x int)",
    ],
)
async def test_the_database_refuses_what_a_fooled_migration_gate_let_through(
    postgres_admin: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bad: str
) -> None:
    await provision_postgres_plugin(postgres_admin, "beta", "b_")
    await apply_postgres_migrations(
        postgres_admin,
        _write(tmp_path / "beta", {"001.sql": "CREATE TABLE b_secret (v text);"}),
        plugin="beta",
        prefix="b_",
    )
    await provision_postgres_plugin(postgres_admin, "zeta", "z_")
    monkeypatch.setattr(_postgres, "SqlGate", _AllowEverything)
    folder = _write(tmp_path / "zeta", {"001.sql": bad})
    with pytest.raises(SuaveplanError) as info:
        await apply_postgres_migrations(postgres_admin, folder, plugin="zeta", prefix="z_")
    assert info.value.code == "SAND_DB_MIGRATION_FAILED"
    assert (
        await _fetch(
            postgres_admin,
            "SELECT tablename FROM pg_tables WHERE schemaname IN ('suaveplan_zeta', 'public')",
        )
        == []
    )
    beta_tables = "SELECT tablename FROM pg_tables WHERE schemaname = 'suaveplan_beta'"
    assert await _fetch(postgres_admin, beta_tables) == [("b_secret",)]


async def test_provisioning_changes_nothing_for_unrelated_users_of_the_database(
    postgres_admin: str,
) -> None:
    # A bystander application that relies on the default `public` schema.
    async with await psycopg.AsyncConnection.connect(postgres_admin, autocommit=True) as conn:
        await conn.execute("DROP ROLE IF EXISTS bystander")
        await conn.execute("CREATE ROLE bystander LOGIN")
        await conn.execute("GRANT CREATE ON SCHEMA public TO bystander")
    snapshot = (
        "SELECT (SELECT nspacl::text FROM pg_namespace WHERE nspname = 'public'), "
        "(SELECT datacl::text FROM pg_database WHERE datname = current_database()), "
        "(SELECT string_agg(rolname, ',' ORDER BY rolname) FROM pg_roles "
        "WHERE rolname NOT LIKE 'suaveplan_%')"
    )
    before = await _fetch(postgres_admin, snapshot)
    await provision_postgres_plugin(postgres_admin, "eta", "h_")
    assert await _fetch(postgres_admin, snapshot) == before
    params = conninfo_to_dict(postgres_admin)
    params.update(user="bystander")
    bystander = make_conninfo(**{k: str(v) for k, v in params.items() if v is not None})
    async with await psycopg.AsyncConnection.connect(bystander, autocommit=True) as conn:
        await conn.execute("CREATE TABLE public.bystander_t (x int)")
        await conn.execute("INSERT INTO public.bystander_t VALUES (1)")
        await conn.execute("DROP TABLE public.bystander_t")


# -- the host's time and memory ---------------------------------------------------------------

_RUNAWAY = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
_STOPPED_WITHIN = 30.0


def _counted(n: int) -> str:
    return f"WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < {n})"


async def _plugin_with_table(admin: str, tmp_path: Path, plugin: str) -> str:
    """A provisioned plugin (prefix `l_`) with `l_t (x int)` holding three rows."""
    conninfo = await provision_postgres_plugin(admin, plugin, "l_")
    await apply_postgres_migrations(
        admin,
        _write(tmp_path / plugin, {"001.sql": "CREATE TABLE l_t (x int);"}),
        plugin=plugin,
        prefix="l_",
    )
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
        await conn.execute("INSERT INTO l_t VALUES (1), (2), (3)")
    return conninfo


async def _active_statements(admin: str, plugin: str) -> int:
    rows = await _fetch(
        admin,
        "SELECT count(*) FROM pg_stat_activity "
        f"WHERE usename = 'suaveplan_{plugin}' AND state = 'active'",
    )
    return int(str(rows[0][0]))


async def _until_active(admin: str, plugin: str, count: int) -> None:
    async with asyncio.timeout(_STOPPED_WITHIN):
        while await _active_statements(admin, plugin) != count:
            await asyncio.sleep(0.05)


async def _db_error(db: PostgresDb, sql: str, params: list[Any] | None = None) -> SuaveplanError:
    with pytest.raises(SuaveplanError) as info:
        await asyncio.wait_for(db.query(sql, params or []), _STOPPED_WITHIN)
    assert info.value.code == "SAND_DB_ERROR"
    return info.value


async def test_a_postgres_statement_past_its_time_limit_is_stopped_on_the_server(
    postgres_admin: str, tmp_path: Path
) -> None:
    conninfo = await _plugin_with_table(postgres_admin, tmp_path, "lim_timeout")
    db = PostgresDb(conninfo, plugin="lim_timeout", prefix="l_", statement_timeout=0.5)
    try:
        error = await _db_error(db, _RUNAWAY)
        assert error.details == {"reason": "statement-timeout", "limit_ms": 500}
        assert (await db.query("SELECT count(*) FROM l_t", [])).rows == ((3,),)
    finally:
        await db.aclose()
    assert await _active_statements(postgres_admin, "lim_timeout") == 0


async def test_cancelling_a_postgres_call_cancels_its_statement_on_the_server(
    postgres_admin: str, tmp_path: Path
) -> None:
    conninfo = await _plugin_with_table(postgres_admin, tmp_path, "lim_cancel")
    db = PostgresDb(conninfo, plugin="lim_cancel", prefix="l_")
    try:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(db.query(_RUNAWAY, []), 0.3)
        await _until_active(postgres_admin, "lim_cancel", 0)
        assert (await db.query("SELECT count(*) FROM l_t", [])).rows == ((3,),)
    finally:
        await db.aclose()


async def test_aclose_stops_a_running_statement_on_the_server(
    postgres_admin: str, tmp_path: Path
) -> None:
    # Closing the connection alone left the server counting forever: a backend notices a
    # gone client only when it writes to it.
    conninfo = await _plugin_with_table(postgres_admin, tmp_path, "lim_close")
    db = PostgresDb(conninfo, plugin="lim_close", prefix="l_")
    task = asyncio.create_task(db.query(_RUNAWAY, []))
    await _until_active(postgres_admin, "lim_close", 1)
    await asyncio.wait_for(db.aclose(), _STOPPED_WITHIN)
    await _until_active(postgres_admin, "lim_close", 0)
    with pytest.raises(SuaveplanError) as info:
        await asyncio.wait_for(task, _STOPPED_WITHIN)
    assert (info.value.code, info.value.details.get("reason")) == ("SAND_DB_ERROR", "closed")
    error = await _db_error(db, "SELECT 1")
    assert error.details == {"reason": "closed"}
    await db.aclose()  # idempotent


async def test_a_postgres_result_over_the_limits_is_refused_and_writes_nothing(
    postgres_admin: str, tmp_path: Path
) -> None:
    conninfo = await _plugin_with_table(postgres_admin, tmp_path, "lim_rows")
    db = PostgresDb(conninfo, plugin="lim_rows", prefix="l_", max_result_rows=10)
    try:
        assert len((await db.query(f"{_counted(10)} SELECT x FROM c", [])).rows) == 10
        error = await _db_error(db, f"{_counted(11)} SELECT x FROM c")
        assert error.details["reason"] == "result-too-large"
        for sql in (
            # The last row tips it over: the statement may be over (and committed, outside a
            # transaction) by the time it is read.
            f"{_counted(11)} INSERT INTO l_t (x) SELECT x FROM c RETURNING x",
            f"{_counted(1000)} INSERT INTO l_t (x) SELECT x FROM c RETURNING x",
            # A data-modifying CTE writes without RETURNING on the statement itself.
            "WITH RECURSIVE d AS (DELETE FROM l_t), "
            "c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 11) SELECT x FROM c",
        ):
            error = await _db_error(db, sql)
            assert error.details["reason"] == "result-too-large", sql
            assert (await db.query("SELECT count(*) FROM l_t", [])).rows == ((3,),), sql
        inserted = await db.query(
            f"{_counted(7)} INSERT INTO l_t (x) SELECT x FROM c RETURNING x", []
        )
        assert (inserted.columns, inserted.rowcount) == (("x",), 7)
        assert (await db.query("SELECT count(*) FROM l_t", [])).rows == ((10,),)
    finally:
        await db.aclose()


async def test_a_postgres_result_over_the_byte_limit_is_refused(
    postgres_admin: str, tmp_path: Path
) -> None:
    conninfo = await _plugin_with_table(postgres_admin, tmp_path, "lim_bytes")
    db = PostgresDb(conninfo, plugin="lim_bytes", prefix="l_", max_result_bytes=1000)
    try:
        assert (await db.query("SELECT %s::text", ["x" * 900])).rows == (("x" * 900,),)
        error = await _db_error(db, "SELECT %s::text", ["x" * 1200])
        assert error.details["reason"] == "result-too-large"
    finally:
        await db.aclose()


async def test_the_postgres_result_limits_have_defaults(
    postgres_admin: str, tmp_path: Path
) -> None:
    # A result the size of the host's memory is never read whole.
    conninfo = await _plugin_with_table(postgres_admin, tmp_path, "lim_default")
    db = PostgresDb(conninfo, plugin="lim_default", prefix="l_")
    try:
        error = await _db_error(db, f"{_counted(100_000_000)} SELECT x FROM c")
        assert error.details["reason"] == "result-too-large"
        assert await _active_statements(postgres_admin, "lim_default") == 0
    finally:
        await db.aclose()


async def test_postgres_results_keep_their_shape(postgres_admin: str, tmp_path: Path) -> None:
    conninfo = await _plugin_with_table(postgres_admin, tmp_path, "lim_shape")
    db = PostgresDb(conninfo, plugin="lim_shape", prefix="l_")
    try:
        empty = await db.query("SELECT x AS named, x + 1 AS other FROM l_t WHERE false;", [])
        assert (empty.columns, empty.rows, empty.rowcount) == (("named", "other"), (), 0)
        update = await db.query("UPDATE l_t SET x = x + 1 WHERE x > %s", [1])
        assert (update.columns, update.rows, update.rowcount) == ((), (), 2)
        rows = await db.query("SELECT x FROM l_t ORDER BY x", [])
        assert (rows.columns, rows.rows, rows.rowcount) == (("x",), ((1,), (3,), (4,)), 3)
    finally:
        await db.aclose()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"statement_timeout": 0},
        {"statement_timeout": float("nan")},
        {"max_result_rows": 0},
        {"max_result_bytes": True},
    ],
)
def test_postgres_limits_must_be_positive(kwargs: dict[str, Any]) -> None:
    with pytest.raises(SuaveplanError) as info:
        PostgresDb("host=/nowhere", plugin="x", prefix="x_", **kwargs)
    assert info.value.code == "SAND_INVALID_ARGUMENT"
