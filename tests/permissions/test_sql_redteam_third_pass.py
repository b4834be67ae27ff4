"""Third red-team pass on the SQL gate: what it decides, without an engine.

Nothing got through. These pin the probes of this pass that the first two did not cover
(`test_sql_redteam_second_pass.py`, `tests/vectors/sql.json`): statements PostgreSQL runs
outside SELECT/INSERT/UPDATE/DELETE (session state, cursors, notifications, COPY, DO, CALL,
prepared statements), row locks, casts to the types whose input looks a name up (`regclass`
and its kin, `oid`, the catalog's own row types), system names used as CTE names, and the
SQLite table-valued or schema reads not in the vectors. Each is refused; the aliases and
CTE names that only shadow a system name inside the statement stay allowed, since the
engine reads them as the statement's own. `tests/adapters/test_sql_redteam_third_pass.py`
runs the ones the gate allows on both engines.
"""

from __future__ import annotations

from typing import Literal

import pytest

from suaveplan_sandbox.permissions._decision import Allow, Deny, DenyReason
from suaveplan_sandbox.permissions._sql_gate import SqlGate

Dialects = Literal["sqlite", "postgres"]


def _decide(dialect: Dialects, sql: str) -> Allow | Deny:
    return SqlGate("r_", dialect=dialect, cache_size=0).check_query(sql)


# PostgreSQL statements that change the session, hold server-side state or run code the
# gate never parses: sqlglot reads most as a `Command`, which the walk refuses.
_POSTGRES_STATEMENTS = [
    "COPY r_t TO STDOUT",
    "COPY (SELECT x FROM r_t) TO STDOUT",
    "DO $$BEGIN PERFORM set_config('statement_timeout', '0', false); END$$",
    "CALL r_p()",
    "PREPARE p AS SELECT x FROM r_t",
    "EXECUTE p",
    "DEALLOCATE ALL",
    "LISTEN r_c",
    "NOTIFY r_c, 'x'",
    "UNLISTEN *",
    "SET LOCAL statement_timeout = 0",
    "SET statement_timeout TO 0",
    "SET SESSION statement_timeout = 0",
    "SET search_path TO public",
    "SET ROLE NONE",
    "SET SESSION AUTHORIZATION DEFAULT",
    "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY",
    "RESET statement_timeout",
    "RESET ALL",
    "DISCARD ALL",
    "SHOW search_path",
    "SELECT x INTO TEMP r_y FROM r_t",
    "SELECT * INTO UNLOGGED r_y FROM r_t",
    "CREATE TABLE r_y AS SELECT x FROM r_t",
    "CREATE TEMP TABLE r_y (a int)",
    "LOCK TABLE r_t",
    "TRUNCATE r_t",
    "DECLARE c CURSOR FOR SELECT x FROM r_t",
    "FETCH ALL FROM c",
    "UPDATE r_t SET x = 1 WHERE CURRENT OF c",
    "DELETE FROM r_t WHERE CURRENT OF c",
    "EXPLAIN ANALYZE SELECT x FROM r_t",
    "VACUUM r_t",
    "ANALYZE r_t",
    "CHECKPOINT",
    "LOAD 'x'",
    "GRANT SELECT ON r_t TO PUBLIC",
    "COMMENT ON TABLE r_t IS 'x'",
    "REFRESH MATERIALIZED VIEW r_m",
    "CLUSTER r_t",
    "REINDEX TABLE r_t",
    "START TRANSACTION",
    "SAVEPOINT a",
    "ABORT",
    "MERGE INTO r_t USING r_t AS s ON true WHEN MATCHED THEN DO NOTHING",
    # row locks (held until the session's transaction ends: another session waits)
    "SELECT x FROM r_t FOR UPDATE",
    "SELECT x FROM r_t WHERE x = 1 FOR NO KEY UPDATE",
    "SELECT x FROM r_t FOR SHARE OF r_t NOWAIT",
    "SELECT (SELECT x FROM r_t LIMIT 1 FOR SHARE)",
    # session and cluster state through functions
    "SELECT pg_advisory_lock(1)",
    "SELECT nextval('r_t_x_seq')",
    "SELECT setval('r_t_x_seq', 1)",
    "SELECT lastval()",
    "SELECT txid_current()",
    "SELECT current_setting('search_path') FROM r_t",
    "SELECT current_schemas(true)",
    "SELECT current_database()",
    "SELECT repeat('a', 100000000) FROM r_t",
    "SELECT s OPERATOR(pg_catalog.||) s FROM r_t",
    "SELECT x FROM r_t ORDER BY x USING <",
]


@pytest.mark.parametrize("sql", _POSTGRES_STATEMENTS)
def test_postgres_refuses_statements_that_are_not_plain_dml_or_change_state(sql: str) -> None:
    decision = _decide("postgres", sql)
    assert isinstance(decision, Deny), sql
    assert decision.reason is DenyReason.STATEMENT_NOT_PERMITTED


# Input functions that look a name up in the catalogs (whether a table, function, role or
# schema exists, and its oid), the catalog's own types, and types sqlglot does not know.
_POSTGRES_LOOKUP_CASTS = [
    "SELECT 'pg_authid'::regclass",
    "SELECT 'pg_authid'::regclass::oid FROM r_t",
    "SELECT CAST('secret' AS REGCLASS)",
    "SELECT s::text::regclass FROM r_t",
    "SELECT '{}'::regclass[]",
    "SELECT tableoid::regclass FROM r_t",
    "SELECT x::regproc FROM r_t",
    "SELECT 'pg_read_file'::regprocedure",
    "SELECT 'int4'::regtype",
    "SELECT 'postgres'::regrole",
    "SELECT 'public'::regnamespace",
    "SELECT 'english'::regconfig",
    "SELECT '1'::oid FROM r_t",
    "SELECT '1'::xid",
    "SELECT 'x=r/y'::aclitem",
    "SELECT '0/0'::pg_lsn",
    "SELECT NULL::pg_catalog.text",
    "SELECT NULL::public.secret",
    "SELECT NULL::secret",
    "SELECT NULL::pg_authid",
    'SELECT NULL::"char"',
    "SELECT regclass('pg_authid')",
    "SELECT to_regclass('pg_authid')",
]


@pytest.mark.parametrize("sql", _POSTGRES_LOOKUP_CASTS)
def test_postgres_refuses_casts_whose_input_looks_up_the_catalog(sql: str) -> None:
    decision = _decide("postgres", sql)
    assert isinstance(decision, Deny), sql
    assert decision.reason is DenyReason.STATEMENT_NOT_PERMITTED


# A system name is refused in every position that names a relation, a CTE's name included
# (the statement would read its own CTE, but a gate that let the name through as a CTE
# would have to agree with the engine on every scope rule to stay safe).
@pytest.mark.parametrize(
    ("dialect", "sql"),
    [
        ("postgres", "WITH pg_roles AS (SELECT 1 AS rolname) SELECT rolname FROM pg_roles"),
        ("postgres", "WITH r_x AS (SELECT 1) SELECT * FROM r_x, pg_temp.r_t"),
        ("postgres", "SELECT * FROM pg_temp.r_t"),
        ("postgres", 'SELECT * FROM U&"r_t"'),
        ("postgres", 'SELECT * FROM U&"\\0072_t"'),
        ("postgres", "SELECT * FROM ROWS FROM (r_t)"),
        ("postgres", "SELECT * FROM r_t TABLESAMPLE SYSTEM (50)"),
        ("postgres", "SELECT ARRAY(SELECT v FROM secret)"),
        ("sqlite", "WITH sqlite_master AS (SELECT 1) SELECT * FROM sqlite_master"),
        ("sqlite", "SELECT x FROM r_t WHERE x IN temp.r_t"),
        (
            "sqlite",
            "SELECT * FROM r_t WHERE x = 1 UNION ALL SELECT rowid, name, sql "
            "FROM sqlite_temp_schema",
        ),
        ("sqlite", "SELECT * FROM r_t WHERE x MATCH 'a'"),
        ("sqlite", "SELECT * FROM r_t WHERE x REGEXP 'a'"),
        ("sqlite", "SELECT x FROM r_t WHERE x IN json_each('[1]')"),
        ("sqlite", "SELECT sqlite_compileoption_get(0)"),
    ],
)
def test_system_names_and_table_valued_reads_are_refused(dialect: Dialects, sql: str) -> None:
    decision = _decide(dialect, sql)
    assert isinstance(decision, Deny), sql
    assert decision.reason is DenyReason.STATEMENT_NOT_PERMITTED


# Out of the prefix wherever the name appears: the CTE that only wraps another table, a
# CTE named like a prefixed table, a parenthesised join.
@pytest.mark.parametrize(
    ("dialect", "sql"),
    [
        ("postgres", "WITH r_x AS (SELECT v FROM secret) SELECT * FROM r_x"),
        ("postgres", "SELECT * FROM (r_t JOIN secret ON true)"),
        ("postgres", "TABLE secret"),
        ("postgres", "SELECT x FROM r_t * , secret"),
        ("postgres", "SELECT x FROM secret *"),
        ("sqlite", "WITH r_t AS (SELECT v AS x FROM secret) SELECT * FROM r_t"),
        (
            "sqlite",
            "WITH a AS (SELECT 1) SELECT * FROM a, "
            "(WITH secret AS (SELECT 1 AS v) SELECT * FROM secret) b, secret",
        ),
        ("sqlite", 'WITH "Secret" AS (SELECT 1 AS v) SELECT v FROM secret'),
        ("sqlite", 'WITH secret AS (SELECT 1 AS v) SELECT v FROM "Secret"'),
        ("sqlite", "SELECT x FROM r_t LIMIT (SELECT count(*) FROM secret)"),
        ("sqlite", "SELECT * FROM r_t NATURAL JOIN secret"),
        # eponymous virtual tables read as tables (the adapter test runs them under a
        # prefix that covers them: the authorizer refuses them there)
        ("sqlite", "SELECT name FROM pragma_function_list"),
        ("sqlite", "SELECT * FROM r_t, pragma_database_list"),
    ],
)
def test_tables_outside_the_prefix_are_out_of_scope_wherever_named(
    dialect: Dialects, sql: str
) -> None:
    decision = _decide(dialect, sql)
    assert isinstance(decision, Deny), sql
    assert decision.reason is DenyReason.TABLE_OUT_OF_SCOPE


# Allowed: these read or write only the plugin's own table (the adapter tests run them).
_ALLOWED = [
    ("postgres", "SELECT x FROM r_t AS pg_class"),
    ("postgres", "SELECT pg_class.x FROM r_t AS pg_class"),
    ("postgres", "WITH secret AS (SELECT 1 AS v) SELECT v FROM secret"),
    ("postgres", "INSERT INTO r_t AS secret (x) VALUES (7) RETURNING secret.x"),
    ("postgres", "UPDATE r_t AS pg_roles SET s = 'z' RETURNING pg_roles.x"),
    ("postgres", "SELECT x FROM r_t * secret"),
    ("postgres", "SELECT ctid, xmin, tableoid FROM r_t"),
    ("postgres", "TABLE r_t"),
    ("postgres", "SELECT r_t FROM r_t"),
    ("sqlite", "SELECT * FROM [r_t]"),
    ("sqlite", "SELECT * FROM `r_t`"),
    ("sqlite", "SELECT * FROM R_T"),
    ("sqlite", "SELECT sqlite_master.x FROM r_t AS sqlite_master"),
    ("sqlite", "WITH Secret AS (SELECT 1 AS v) SELECT * FROM r_t, (SELECT * FROM sEcReT)"),
    ("sqlite", "WITH secret AS (SELECT 1 AS v) SELECT * FROM r_t WHERE x IN secret"),
]


@pytest.mark.parametrize(("dialect", "sql"), _ALLOWED)
def test_aliases_and_ctes_that_shadow_a_name_stay_allowed(dialect: Dialects, sql: str) -> None:
    assert isinstance(_decide(dialect, sql), Allow), sql
