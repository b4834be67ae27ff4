"""Third red-team pass on the SQL boundary, on the real engines: nothing got through.

What the gate allows of this pass's probes (`tests/permissions/test_sql_redteam_third_pass.py`
pins what it refuses) runs here, as a plugin's role on PostgreSQL 15 and under the
authorizer on SQLite, and touches only the plugin's own table: aliases and CTEs that shadow
a system or foreign name, system columns, whole-row references, XML whose DTD names a file
(PostgreSQL never loads it). On SQLite a prefix that covers the engine's own eponymous
virtual tables (`pragma_`) lets the gate pass `SELECT * FROM pragma_database_list`; the
authorizer refuses it, so the engine stays the boundary there.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from adapters._postgres_plugin import provisioned_plugin, refusal
from suaveplan_sandbox.adapters._postgres import PostgresDb
from suaveplan_sandbox.adapters._sqlite import SqliteDb

_POSTGRES_IN_SCOPE = [
    ("SELECT x FROM r_t AS pg_class", ((1,),)),
    ("SELECT pg_class.x FROM r_t AS pg_class", ((1,),)),
    ("WITH secret AS (SELECT 2 AS v) SELECT v FROM secret", ((2,),)),
    ("WITH pg_x AS (SELECT 3 AS v) SELECT v FROM pg_x", None),  # a system name: refused
    ("SELECT x FROM r_t * secret", ((1,),)),
    ("TABLE r_t", ((1,),)),
    ("SELECT r_t::text FROM r_t", (("(1)",),)),
    ("SELECT tableoid > 0, xmin IS NOT NULL FROM r_t", ((True, True),)),
    (
        "SELECT '<!DOCTYPE f [<!ENTITY e SYSTEM \"file:///etc/hostname\">]><f>&e;</f>'::xml::text"
        " FROM r_t",
        (('<!DOCTYPE f [<!ENTITY e SYSTEM "file:///etc/hostname">]><f>&e;</f>',),),
    ),
]


async def test_what_the_postgres_gate_allows_of_this_pass_stays_in_the_plugins_table(
    postgres_admin: str, tmp_path: Path
) -> None:
    conninfo = await provisioned_plugin(postgres_admin, tmp_path, "rt3_scope")
    db = PostgresDb(conninfo, plugin="rt3_scope", prefix="r_", statement_timeout=5)
    try:
        for sql, rows in _POSTGRES_IN_SCOPE:
            if rows is None:
                error = await refusal(db, sql, [])
                assert error.code == "SAND_PERM_DENIED", sql
                continue
            assert (await db.query(sql, [])).rows == rows, sql
        # The writes through an alias named like a catalog go to the plugin's table.
        await db.query("INSERT INTO r_t AS pg_roles (x) VALUES (7) RETURNING pg_roles.x", [])
        result = await db.query("UPDATE r_t AS secret SET x = 8 WHERE secret.x = 7", [])
        assert result.rowcount == 1
        assert (await db.query("SELECT x FROM r_t ORDER BY x", [])).rows == ((1,), (8,))
    finally:
        await db.aclose()


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM pragma_database_list",
        "SELECT name FROM pragma_function_list",
        "SELECT * FROM pragma_table_list",
        "SELECT * FROM pragma_compile_options",
    ],
)
async def test_sqlite_authorizer_refuses_pragma_tables_a_pragma_prefix_lets_past_the_gate(
    tmp_path: Path, sql: str
) -> None:
    with sqlite3.connect(tmp_path / "p.db") as conn:
        conn.executescript("CREATE TABLE secrets (v text); INSERT INTO secrets VALUES ('s');")
    conn.close()
    db = SqliteDb(tmp_path / "p.db", plugin_prefix="pragma_")
    try:
        assert db._gate.check_query(sql).__class__.__name__ == "Allow"
        error = await refusal(db, sql, [])
        assert error.code == "SAND_DB_ERROR"
    finally:
        db.close()


@pytest.mark.parametrize(
    ("sql", "rows"),
    [
        ("SELECT * FROM [r_t]", ((1,),)),
        ("SELECT * FROM `r_t`", ((1,),)),
        ("SELECT sqlite_master.x FROM r_t AS sqlite_master", ((1,),)),
        ("WITH Secrets AS (SELECT 2 AS v) SELECT * FROM r_t, (SELECT * FROM sEcReTs)", ((1, 2),)),
        ("WITH secrets AS (SELECT 1 AS v) SELECT x FROM r_t WHERE x IN secrets", ((1,),)),
    ],
)
async def test_sqlite_quoting_and_shadowing_reads_only_the_plugins_table(
    tmp_path: Path, sql: str, rows: tuple[tuple[int, ...], ...]
) -> None:
    with sqlite3.connect(tmp_path / "p.db") as conn:
        conn.executescript(
            "CREATE TABLE secrets (v int); INSERT INTO secrets VALUES (99);"
            "CREATE TABLE r_t (x int); INSERT INTO r_t VALUES (1);"
        )
    conn.close()
    db = SqliteDb(tmp_path / "p.db", plugin_prefix="r_")
    try:
        assert (await db.query(sql, [])).rows == rows
    finally:
        db.close()
