"""Second red-team pass on the SQL boundary, on the real engines.

PostgreSQL: text the gate read as a literal or a comment ran as code under the plugin's own
role (a dollar-quote tag PostgreSQL does not accept, `*/*` in a nested comment): PUBLIC may
call `set_config` and read the catalogs, so the plugin switched off its statement timeout
and read the cluster's roles. And a value psycopg cannot encode escaped untranslated.

SQLite: the authorizer is the boundary, and these pin what it already refused when the
text, or the schema the host made, tried to reach past the prefix. Statements go through
`query` (gate and engine) or `_execute` (the engine alone, as past a fooled gate).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from adapters._postgres_plugin import provisioned_plugin, refusal
from suaveplan_sandbox.adapters._postgres import (
    PostgresDb,
)
from suaveplan_sandbox.adapters._sqlite import SqliteDb
from suaveplan_sandbox.errors import SuaveplanError

# Each hides `set_config('statement_timeout', '0', false)` (the session then runs without a
# time limit for every later call) and a read of `pg_roles` from the gate. Before the fix,
# PostgreSQL 15 ran both, returning the cluster's role names.
_HIDDEN_FROM_THE_GATE = [
    # `$1,$` is no dollar-quote tag to PostgreSQL: two parameters, then code.
    "SELECT $1,$2, set_config('statement_timeout', '0', false) AS h, "
    "(SELECT string_agg(rolname, ',') FROM pg_roles) AS leak, %s, %s -- $1,$\n FROM r_t",
    # `*/*` closes PostgreSQL's nested comment and leaves a `*`; sqlglot closed and reopened.
    "SELECT %s AS a, %s AS b /* /* */* */ , set_config('statement_timeout', '0', false) AS h, "
    "(SELECT string_agg(rolname, ',') FROM pg_roles) AS leak -- */\n FROM r_t",
]


@pytest.mark.parametrize("sql", _HIDDEN_FROM_THE_GATE)
async def test_code_the_gate_took_for_a_literal_or_comment_never_reaches_postgres(
    postgres_admin: str, tmp_path: Path, sql: str
) -> None:
    conninfo = await provisioned_plugin(postgres_admin, tmp_path, "rt2_hidden")
    db = PostgresDb(conninfo, plugin="rt2_hidden", prefix="r_", statement_timeout=5)
    try:
        error = await refusal(db, sql, [1, 2])
        assert error.code == "SAND_PERM_DENIED"
        assert error.details == {"capability": "db", "reason": "statement-not-permitted"}
        # Nothing ran: the session keeps the adapter's statement timeout.
        setting = await db._execute("SELECT current_setting('statement_timeout')", [])
        assert setting.rows == (("5s",),)
        assert (await db.query("SELECT x FROM r_t WHERE x = %s", [1])).rows == ((1,),)
    finally:
        await db.aclose()


# Pieces that open, close or continue a literal or a comment in one reader or the other; their
# product holds both shapes above, among others.
_OPENERS = [
    ", $1,$",
    ", $2)$",
    " /* /* */*",
    " /*/* */",
    ", '",
    ", E'",
    ", $a$",
    ", $$",
    ', "',
    " --",
]
_MIDDLES = ["", "2", " */", "*/ */", "''", "\\'", "\n", "\u00a0"]
_CLOSERS = ["$1,$", "$2)$", "*/", "*/ */", "'", "$a$", "$$", '"']


def _hiding_attempts() -> list[str]:
    return [
        f"SELECT %s AS a{opener}{middle}, set_config('rt2.hit', 'yes', false) AS h, %s"
        f" -- {closer}\n FROM r_t"
        for opener in _OPENERS
        for middle in _MIDDLES
        for closer in _CLOSERS
    ]


async def test_whatever_the_postgres_gate_allows_runs_no_code_it_did_not_see(
    postgres_admin: str, tmp_path: Path
) -> None:
    conninfo = await provisioned_plugin(postgres_admin, tmp_path, "rt2_sweep")
    db = PostgresDb(conninfo, plugin="rt2_sweep", prefix="r_", statement_timeout=5)
    try:
        for sql in _hiding_attempts():
            try:
                await db.query(sql, [1, 2])
            except SuaveplanError:
                continue
        hit = await db._execute("SELECT current_setting('rt2.hit', true)", [])
        assert hit.rows in (((None,),), (("",),))
    finally:
        await db.aclose()


@pytest.mark.parametrize(
    ("sql", "params"),
    [
        ("SELECT %s::text AS v", ["\ud800"]),
        ("SELECT %s AS v FROM r_t", ["a\udfff"]),
        ("SELECT '\ud800' AS v FROM r_t", []),
    ],
)
async def test_a_value_postgres_cannot_be_sent_is_a_coded_refusal(
    postgres_admin: str, tmp_path: Path, sql: str, params: list[Any]
) -> None:
    # psycopg raised UnicodeEncodeError, which is no psycopg.Error and escaped the adapter.
    conninfo = await provisioned_plugin(postgres_admin, tmp_path, "rt2_encode")
    db = PostgresDb(conninfo, plugin="rt2_encode", prefix="r_")
    try:
        error = await refusal(db, sql, params)
        assert error.code == "SAND_DB_ERROR"
        assert error.details == {"reason": "parameter-invalid"}
        assert error.__cause__ is None  # a UnicodeEncodeError holds the whole value
        assert (await db.query("SELECT x FROM r_t", [])).rows == ((1,),)
    finally:
        await db.aclose()


async def test_postgres_refuses_lpad_whose_one_call_outlasts_the_timeout(
    postgres_admin: str, tmp_path: Path
) -> None:
    conninfo = await provisioned_plugin(postgres_admin, tmp_path, "rt2_pad")
    db = PostgresDb(conninfo, plugin="rt2_pad", prefix="r_", statement_timeout=1)
    try:
        for sql in ("SELECT length(lpad('x', 268000000))", "SELECT rpad('', %s) FROM r_t"):
            error = await refusal(db, sql, [] if "%s" not in sql else [268000000])
            assert error.code == "SAND_PERM_DENIED"
    finally:
        await db.aclose()


# -- SQLite: the authorizer holds where the gate is not the last word -------------------------


def _sqlite(tmp_path: Path, setup: str, prefix: str = "app_") -> SqliteDb:
    with sqlite3.connect(tmp_path / "p.db") as conn:
        conn.executescript(
            "CREATE TABLE app_t (a, b); INSERT INTO app_t VALUES (1, 2);"
            "CREATE TABLE secrets (s); INSERT INTO secrets VALUES ('host secret');" + setup
        )
    conn.close()
    return SqliteDb(tmp_path / "p.db", plugin_prefix=prefix)


async def _engine_refuses(db: SqliteDb, sql: str, params: list[Any] | None = None) -> None:
    with pytest.raises(SuaveplanError) as info:
        await db._execute(sql, params or [])
    assert info.value.code == "SAND_DB_ERROR"


@pytest.mark.parametrize(
    "sql", ["SELECT * FROM app_v", "SELECT count(*) FROM app_v", "SELECT 1 FROM app_v"]
)
async def test_a_prefixed_view_over_another_table_is_refused_when_used(
    tmp_path: Path, sql: str
) -> None:
    # SQLite checks a view's tables each time the view is read, not only when it is made.
    db = _sqlite(tmp_path, "CREATE VIEW app_v AS SELECT * FROM secrets;")
    try:
        assert (await db.query("SELECT a FROM app_t", [])).rows == ((1,),)
        await _engine_refuses(db, sql)
    finally:
        db.close()


async def test_a_trigger_writing_outside_the_prefix_refuses_the_plugins_write(
    tmp_path: Path,
) -> None:
    db = _sqlite(
        tmp_path,
        "CREATE TRIGGER app_tr AFTER INSERT ON app_t BEGIN "
        "INSERT INTO secrets VALUES (new.a); END;",
    )
    try:
        with pytest.raises(SuaveplanError) as info:
            await db.query("INSERT INTO app_t VALUES (5, 6)", [])
        assert info.value.code == "SAND_DB_ERROR"
        assert (await db.query("SELECT count(*) FROM app_t", [])).rows == ((1,),)
    finally:
        db.close()
    with sqlite3.connect(tmp_path / "p.db") as conn:
        assert conn.execute("SELECT count(*) FROM secrets").fetchone() == (1,)
    conn.close()


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT name FROM pragma_table_info WHERE arg = 'secrets'",
        "SELECT * FROM pragma_table_list",
        "SELECT * FROM pragma_database_list",
    ],
)
async def test_a_pragma_prefix_reaches_no_pragma(tmp_path: Path, sql: str) -> None:
    # Under the (valid) prefix `pragma_` the gate counts SQLite's pragma table-valued
    # functions as the plugin's tables; each runs its PRAGMA, which the authorizer refuses.
    db = _sqlite(tmp_path, "CREATE TABLE pragma_own (a);", prefix="pragma_")
    try:
        with pytest.raises(SuaveplanError) as info:
            await db.query(sql, [])
        assert info.value.code == "SAND_DB_ERROR"
        assert (await db.query("SELECT count(*) FROM pragma_own", [])).rows == ((0,),)
    finally:
        db.close()


@pytest.mark.parametrize(
    "sql",
    [
        # SQLite's TCL-style parameter `@lower(…)` runs to the first `)`: the quote in it
        # opens no string, and the read of `secrets` is code.
        "SELECT a FROM app_t WHERE a = @lower(') OR a IN (SELECT s FROM secrets) --')",
        # Whitespace to sqlglot, part of a name to SQLite.
        "SELECT s FROM app_t\u00a0, secrets",
        "SELECT * FROM temp.app_t",
        "SELECT * FROM main.secrets",
        "SELECT sql FROM sqlite_master",
        "SELECT sql FROM sqlite_temp_master",
    ],
)
async def test_the_engine_refuses_what_a_fooled_gate_would_let_through(
    tmp_path: Path, sql: str
) -> None:
    db = _sqlite(tmp_path, "")
    try:
        with pytest.raises(SuaveplanError):
            await db.query(sql, [None])
        await _engine_refuses(db, sql, [None] if "@" in sql else [])
    finally:
        db.close()


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        # Past the value limit in one step: refused, or SQLite's own NULL, at once.
        ("SELECT length(zeroblob(2000000000)) FROM app_t", "value-too-large"),
        ("SELECT length(randomblob(2e9)) FROM app_t", "value-too-large"),
        ("SELECT length(printf('%!.*c', 2000000000, 'x')) FROM app_t", "value-too-large"),
        ("SELECT length(printf('%2000000000d', 1)) FROM app_t", None),
        ("SELECT length(printf('%.2000000000f', 1.5)) FROM app_t", None),
        (
            "WITH RECURSIVE r(s) AS (SELECT 'x' UNION ALL SELECT s || s FROM r) "
            "SELECT length(s) FROM r",
            "value-too-large",
        ),
        (
            "SELECT length(replace(hex(zeroblob(500000)), '0', hex(zeroblob(500000)))) FROM app_t",
            "value-too-large",
        ),
    ],
)
async def test_statements_cheap_to_parse_and_costly_to_run_are_bounded(
    tmp_path: Path, sql: str, expected: str | None
) -> None:
    db = _sqlite(tmp_path, "")
    try:
        if expected is None:
            assert (await db.query(sql, [])).rows == ((None,),)
        else:
            error = await refusal(db, sql, [])
            assert error.details.get("reason") == expected
        assert (await db.query("SELECT a FROM app_t", [])).rows == ((1,),)
    finally:
        db.close()


async def test_text_sqlite_cannot_be_given_is_a_coded_refusal(tmp_path: Path) -> None:
    db = _sqlite(tmp_path, "")
    try:
        for sql, params in (
            ("SELECT '\ud800' FROM app_t", []),
            ("SELECT ? FROM app_t", ["\ud800"]),
        ):
            error = await refusal(db, sql, params)
            assert error.code == "SAND_DB_ERROR"
            assert error.details == {"reason": "parameter-invalid"}
    finally:
        db.close()
