"""PostgresDb against hostile statements on a real PostgreSQL: what the server parses must be
what the gate checked, and a plugin's call leaves no state behind for its next one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from adapters._postgres_plugin import provisioned_plugin, refusal
from suaveplan_sandbox.adapters import _postgres
from suaveplan_sandbox.adapters._postgres import (
    PostgresDb,
    apply_postgres_migrations,
    provision_postgres_plugin,
)
from suaveplan_sandbox.errors import SuaveplanError

# psycopg turns every `%s` of the text into `$n` before PostgreSQL parses it, inside string
# literals too. Glued to `$q` that `$` finishes a dollar-quote delimiter the gate never saw:
# the gate reads `$q % s` and then a string literal; PostgreSQL reads a dollar-quoted string
# and then, as code, what the gate took for the literal's contents.
_HIDDEN_IN_LITERAL = [
    # reads the catalog (roles of the whole cluster)
    "SELECT $q%s, '$q$ AS hidden, (SELECT string_agg(rolname, ',') FROM pg_roles) AS leak, "
    "%s AS tail --' AS x FROM r_t",
    # changes the session: no statement_timeout for every later call of this plugin
    "SELECT $q%s, '$q$ AS hidden, set_config($a$statement_timeout$a$, $a$0$a$, false) AS leak, "
    "%s AS tail --' AS x FROM r_t",
    # `$$` from a lone `$` before the placeholder
    "SELECT $%s, '$$ AS hidden, (SELECT string_agg(rolname, ',') FROM pg_roles) AS leak, "
    "%s AS tail --' AS x FROM r_t",
]


@pytest.mark.parametrize("sql", _HIDDEN_IN_LITERAL)
async def test_a_placeholder_cannot_open_a_dollar_quote_the_gate_did_not_see(
    postgres_admin: str, tmp_path: Path, sql: str
) -> None:
    conninfo = await provisioned_plugin(postgres_admin, tmp_path, "rt_dollar")
    db = PostgresDb(conninfo, plugin="rt_dollar", prefix="r_", statement_timeout=5)
    try:
        error = await refusal(db, sql, [1, 2])
        assert error.code == "SAND_DB_ERROR"
        assert error.details["reason"] == "placeholder-changes-statement"
        # Nothing ran: the session still has the adapter's statement_timeout.
        result = await db._execute("SELECT current_setting('statement_timeout')", [])
        assert result.rows == (("5s",),)
        assert (await db.query("SELECT x FROM r_t WHERE x = %s", [1])).rows == ((1,),)
    finally:
        await db.aclose()


@pytest.mark.parametrize(
    ("sql", "params", "rows"),
    [
        ("SELECT x FROM r_t WHERE x = %s", [1], ((1,),)),
        ("SELECT x FROM r_t WHERE x = %s AND %s = 'a%%'", [1, "a%"], ((1,),)),
        ("SELECT %s::text || 'x' AS v FROM r_t", ["$q$"], (("$q$x",),)),
        ("SELECT $q$%%$q$ AS v FROM r_t", [], (("%",),)),
    ],
)
async def test_ordinary_placeholders_and_percent_signs_still_work(
    postgres_admin: str, tmp_path: Path, sql: str, params: list[Any], rows: tuple[Any, ...]
) -> None:
    conninfo = await provisioned_plugin(postgres_admin, tmp_path, "rt_plain")
    db = PostgresDb(conninfo, plugin="rt_plain", prefix="r_")
    try:
        assert (await db.query(sql, params)).rows == rows
    finally:
        await db.aclose()


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT $q%s, '$q$ x --' FROM r_t",
        "SELECT %s, %b, %t, '%%', $q$%s$q$ -- %s\n",
        "SELECT 'a%%b' || %s /* %s */",
        "SELECT x FROM r_t WHERE x = %s\n%\n",
        "SELECT 1 %",
        "SELECT %(name)s",
        "SELECT %x",
        "SELECT %(",
        "SELECT %é",
        "SELECT 1",
    ],
)
def test_the_adapter_models_psycopgs_own_placeholder_rewrite(sql: str) -> None:
    from psycopg import _queries

    try:
        sent: str | None = _queries._query2pg_nocache(sql.encode(), "utf-8")[0].decode()
        if _queries._query2pg_nocache(sql.encode(), "utf-8")[2] is not None:
            sent = None  # named placeholders: psycopg refuses them with a list of values
    except (psycopg.ProgrammingError, UnicodeDecodeError):  # psycopg 3.3 on `%é`
        sent = None
    assert _postgres._psycopg_text(sql) == sent


@pytest.mark.parametrize("sql", ["SELECT 'a%é' AS v FROM r_t", "SELECT x FROM r_t -- 100%!"])
async def test_a_percent_sign_psycopg_cannot_read_is_a_coded_refusal(
    postgres_admin: str, tmp_path: Path, sql: str
) -> None:
    # psycopg itself fails on `%` before a non-ASCII character with a UnicodeDecodeError,
    # which is no psycopg.Error and escaped the adapter untranslated.
    conninfo = await provisioned_plugin(postgres_admin, tmp_path, "rt_percent")
    db = PostgresDb(conninfo, plugin="rt_percent", prefix="r_")
    try:
        error = await refusal(db, sql, [])
        assert error.code == "SAND_DB_ERROR"
        assert error.details["reason"] == "placeholder-not-supported"
        assert (await db.query("SELECT x FROM r_t", [])).rows == ((1,),)
    finally:
        await db.aclose()


# PostgreSQL runs LIKE and `strpos`/`replace`/`split_part` in loops no statement_timeout
# interrupts, in time the product of the two lengths (a 200,000-character pattern over a
# 400,000-character value: 78 s past a 100 ms timeout). The gate lets a pattern be built of
# short literals and parameters; the adapter bounds those parameters.
_LONG_PATTERN = "%" + "a" * 2000 + "b"


@pytest.mark.parametrize(
    ("sql", "params"),
    [
        ("SELECT x FROM r_t WHERE %s LIKE %s", ["a" * 4000, _LONG_PATTERN]),
        ("SELECT x FROM r_t WHERE %s ILIKE '%%' || %s", ["a" * 4000, _LONG_PATTERN]),
        ("SELECT strpos(%s, %s) FROM r_t", ["a" * 4000, _LONG_PATTERN]),
        ("SELECT replace(%s, %s, 'y') FROM r_t", ["a" * 4000, _LONG_PATTERN.encode()]),
        ("SELECT split_part(%s, %s, 2) FROM r_t", ["a" * 4000, _LONG_PATTERN]),
    ],
)
async def test_a_long_pattern_parameter_is_refused_before_it_runs(
    postgres_admin: str, tmp_path: Path, sql: str, params: list[Any]
) -> None:
    conninfo = await provisioned_plugin(postgres_admin, tmp_path, "rt_pattern")
    db = PostgresDb(conninfo, plugin="rt_pattern", prefix="r_")
    try:
        error = await refusal(db, sql, params)
        assert error.code == "SAND_DB_ERROR"
        assert error.details == {"reason": "pattern-too-long", "limit": 1000}
        ok = await db.query(sql, [params[0], "%a%"])
        assert len(ok.rows) == 1
    finally:
        await db.aclose()


# With `standard_conforming_strings = off` (a legacy server, database or role setting) a
# backslash escapes a quote in an ordinary string literal, where the gate reads it as a
# character: text the gate took for a string literal ran as code (the role list, here).
_BACKSLASH_QUOTE = (
    "SELECT 'x\\' , ' AS a, (SELECT string_agg(rolname, ',') FROM pg_roles) AS leak, "
    "' -- ' FROM r_t"
)


@pytest.mark.parametrize("scope", ["ROLE {role}", "DATABASE postgres"])
async def test_a_server_without_standard_conforming_strings_reads_literals_as_the_gate_does(
    postgres_admin: str, tmp_path: Path, scope: str
) -> None:
    conninfo = await provisioned_plugin(postgres_admin, tmp_path, "rt_scs")
    target = scope.format(role="suaveplan_rt_scs")
    async with await psycopg.AsyncConnection.connect(postgres_admin, autocommit=True) as admin:
        await admin.execute(f"ALTER {target} SET standard_conforming_strings = off")
    db = PostgresDb(conninfo, plugin="rt_scs", prefix="r_")
    try:
        result = await db.query(_BACKSLASH_QUOTE, [])
        # Three string literals, as the gate read them; no role name.
        assert result.rows == (
            ("x\\", " AS a, (SELECT string_agg(rolname, ", ") FROM pg_roles) AS leak, "),
        )
    finally:
        await db.aclose()
        async with await psycopg.AsyncConnection.connect(postgres_admin, autocommit=True) as admin:
            await admin.execute(f"ALTER {target} RESET standard_conforming_strings")


# The same on the admin's connection that runs migrations, where it was worse: a migration
# the gate read as one CREATE TABLE with two string defaults ran, with the backslash escaping
# a quote, `RESET ROLE` (back to the admin from the plugin's owner role) and then anything.
_MIGRATION_ESCAPE = (
    "CREATE TABLE r_esc (a TEXT DEFAULT 'x\\', b TEXT DEFAULT '); RESET ROLE; "
    "CREATE TABLE public.rt_pwned (a int); --');\n"
)


async def test_a_migration_cannot_leave_the_owner_role_through_a_backslash_quote(
    postgres_admin: str, tmp_path: Path
) -> None:
    await provision_postgres_plugin(postgres_admin, "rt_mig_scs", "r_")
    folder = tmp_path / "migrations"
    folder.mkdir()
    (folder / "001.sql").write_text(_MIGRATION_ESCAPE)
    async with await psycopg.AsyncConnection.connect(postgres_admin, autocommit=True) as admin:
        await admin.execute("ALTER DATABASE postgres SET standard_conforming_strings = off")
    try:
        await apply_postgres_migrations(postgres_admin, folder, plugin="rt_mig_scs", prefix="r_")
    finally:
        async with await psycopg.AsyncConnection.connect(postgres_admin, autocommit=True) as admin:
            await admin.execute("ALTER DATABASE postgres RESET standard_conforming_strings")
            found = await (
                await admin.execute("SELECT to_regclass('public.rt_pwned') IS NOT NULL")
            ).fetchone()
            await admin.execute("DROP TABLE IF EXISTS public.rt_pwned")
    assert found == (False,)


# Defence in depth: whatever the gate passed goes to PostgreSQL as one statement, over the
# extended protocol, so a reading of the text the gate did not share (as above) can never
# add a second statement. psycopg sends a text without parameters over the simple protocol,
# which runs every statement in it.
async def test_a_migration_statement_is_sent_as_exactly_one_statement(
    postgres_admin: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await provision_postgres_plugin(postgres_admin, "rt_one_mig", "r_")
    folder = tmp_path / "migrations"
    folder.mkdir()
    (folder / "001.sql").write_text("CREATE TABLE r_a (a int);")
    two = "CREATE TABLE r_a (a int); RESET ROLE; CREATE TABLE public.rt_two (a int)"
    monkeypatch.setattr(_postgres, "_plan", lambda gate, file: ([two], "0" * 64))
    try:
        with pytest.raises(SuaveplanError) as info:
            await apply_postgres_migrations(
                postgres_admin, folder, plugin="rt_one_mig", prefix="r_"
            )
        assert info.value.code == "SAND_DB_MIGRATION_FAILED"
    finally:
        async with await psycopg.AsyncConnection.connect(postgres_admin, autocommit=True) as admin:
            found = await (
                await admin.execute("SELECT to_regclass('public.rt_two') IS NOT NULL")
            ).fetchone()
            await admin.execute("DROP TABLE IF EXISTS public.rt_two")
    assert found == (False,)


async def test_a_runtime_write_is_sent_as_exactly_one_statement(
    postgres_admin: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A statement the gate shaped as a write without rows (no RETURNING) ran on its own path.
    conninfo = await provisioned_plugin(postgres_admin, tmp_path, "rt_one_run")
    db = PostgresDb(conninfo, plugin="rt_one_run", prefix="r_")
    monkeypatch.setattr(db, "_shape", lambda sql: (False, True))
    try:
        with pytest.raises(SuaveplanError) as info:
            await db._execute("UPDATE r_t SET x = 2; UPDATE r_t SET x = 3", [])
        assert info.value.code == "SAND_DB_ERROR"
        monkeypatch.undo()
        assert (await db.query("SELECT x FROM r_t", [])).rows == ((1,),)
    finally:
        await db.aclose()


async def test_a_role_with_another_client_encoding_still_gets_the_plugins_text_exactly(
    postgres_admin: str, tmp_path: Path
) -> None:
    # A role (or database) whose `client_encoding` cannot encode the plugin's text made
    # psycopg raise an untranslated UnicodeEncodeError (and would decode rows wrongly): the
    # session pins UTF8, the wire's own encoding.
    conninfo = await provisioned_plugin(postgres_admin, tmp_path, "rt_enc")
    async with await psycopg.AsyncConnection.connect(postgres_admin, autocommit=True) as admin:
        await admin.execute("ALTER ROLE suaveplan_rt_enc SET client_encoding = 'LATIN1'")
    db = PostgresDb(conninfo, plugin="rt_enc", prefix="r_")
    try:
        result = await db.query("SELECT %s AS t", ["naïve € 漢字 \U0001f600"])
        assert result.rows == (("naïve € 漢字 \U0001f600",),)
    finally:
        await db.aclose()
        async with await psycopg.AsyncConnection.connect(postgres_admin, autocommit=True) as admin:
            await admin.execute("ALTER ROLE suaveplan_rt_enc RESET client_encoding")
