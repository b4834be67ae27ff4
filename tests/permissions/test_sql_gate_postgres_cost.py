"""The postgres gate against built-ins that hold a backend past `statement_timeout`.

PostgreSQL stops a statement only where its code checks for interrupts, and some text
built-ins run one long loop without such a check. Measured on PostgreSQL 15 as a runtime
role with `statement_timeout = 100ms`: `format('%1000000000s', 'x')` allocated 1 GB and ran
7 s; `btrim($1, $2)` with two 200,000-character values ran 167 s (the time is the product of
the two lengths: `dotrim` scans the set once per trimmed character), `ltrim`/`rtrim`/`trim(...
FROM ...)` alike; `LIKE` with a 200,000-character pattern over a 400,000-character value
78 s, `strpos` with a 200,000-character needle 20 s. No timeout, cancel or
`pg_terminate_backend` reaches them. So `format` is not on the postgres allowlist, the set of
characters to trim must be a short literal, and a LIKE/ILIKE pattern or a
`strpos`/`position`/`replace`/`split_part` needle must be built of string literals (at most
`MAX_POSTGRES_PATTERN` characters in all) and parameters, which `PostgresDb` bounds as well.
(SQLite runs replacements of its own for these, bounded by `max_value_bytes`, and limits
LIKE patterns itself.)
"""

from __future__ import annotations

import pytest

from suaveplan_sandbox.permissions._decision import Allow, Deny, DenyReason
from suaveplan_sandbox.permissions._sql_gate import MAX_POSTGRES_PATTERN, SqlGate

_LONG = "x" * (MAX_POSTGRES_PATTERN + 1)
_SHORT = "x" * MAX_POSTGRES_PATTERN


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT format('%1000000000s', 'x')",
        "SELECT format('%-1000000000s', 'x')",
        "SELECT format('%*s', 1000000000, 'x')",
        "SELECT format(a, b) FROM a_t",
        "SELECT btrim(a, b) FROM a_t",
        "SELECT btrim(a, %s) FROM a_t",
        "SELECT ltrim(a, %s) FROM a_t",
        "SELECT rtrim(a, %s) FROM a_t",
        "SELECT trim(BOTH %s FROM a) FROM a_t",
        "SELECT trim(LEADING b FROM a) FROM a_t",
        "SELECT btrim(a, 'x' || b) FROM a_t",
        "SELECT btrim(a, '" + "x" * 33 + "') FROM a_t",
        "SELECT a FROM a_t WHERE a LIKE b",
        "SELECT a FROM a_t WHERE a ILIKE b || '%'",
        "SELECT a FROM a_t WHERE a NOT LIKE upper(%s)",
        f"SELECT a FROM a_t WHERE a LIKE '{_LONG}'",
        f"SELECT a FROM a_t WHERE a LIKE '{_SHORT}' || '%%'",
        "SELECT strpos(a, b) FROM a_t",
        "SELECT position(b IN a) FROM a_t",
        "SELECT replace(a, b, 'y') FROM a_t",
        "SELECT split_part(a, b, 2) FROM a_t",
        f"SELECT strpos(a, '{_LONG}') FROM a_t",
    ],
)
def test_postgres_refuses_text_built_ins_that_run_past_the_statement_timeout(sql: str) -> None:
    decision = SqlGate("a_", dialect="postgres").check_query(sql)
    assert isinstance(decision, Deny)
    assert decision.reason is DenyReason.STATEMENT_NOT_PERMITTED


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT btrim(a), ltrim(a), rtrim(a), trim(a) FROM a_t",
        "SELECT btrim(a, ' -'), trim(BOTH 'xy' FROM a), ltrim(a, '0') FROM a_t",
        "SELECT trim(LEADING FROM a) FROM a_t",
        "SELECT btrim(a, '" + "x" * 32 + "') FROM a_t",
    ],
)
def test_postgres_keeps_trimming_whitespace_or_a_short_literal_set(sql: str) -> None:
    assert isinstance(SqlGate("a_", dialect="postgres").check_query(sql), Allow)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT a FROM a_t WHERE a LIKE %s",
        "SELECT a FROM a_t WHERE a ILIKE '%%' || %s || '%%'",
        "SELECT a FROM a_t WHERE a LIKE concat('%%', %s, '%%') ESCAPE '!'",
        "SELECT a FROM a_t WHERE a NOT ILIKE $1",
        "SELECT a FROM a_t WHERE a LIKE (%s || '%%')",
        f"SELECT a FROM a_t WHERE a LIKE '{_SHORT}'",
        "SELECT strpos(a, ','), position('-' IN a), split_part(a, ',', 2) FROM a_t",
        "SELECT replace(a, %s, b), replace(a, 'x', repeat_me) FROM a_t",
    ],
)
def test_postgres_keeps_patterns_of_literals_and_parameters(sql: str) -> None:
    assert isinstance(SqlGate("a_", dialect="postgres").check_query(sql), Allow)


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SELECT a FROM a_t WHERE a LIKE $2 AND b = $1", {2}),
        ("SELECT a FROM a_t WHERE a ILIKE '%' || $1 || '%' AND b LIKE $3", {1, 3}),
        ("SELECT strpos(a, $1), replace(a, $2, $3), split_part(a, $4, 1) FROM a_t", {1, 2, 4}),
        ("SELECT a FROM a_t WHERE a = $1", set()),
        ("SELECT a FROM a_t WHERE a LIKE 'x'", set()),
    ],
)
def test_the_gate_names_the_parameters_a_pattern_is_built_from(
    sql: str, expected: set[int]
) -> None:
    assert SqlGate("a_", dialect="postgres").bounded_parameters(sql) == expected


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT format('%s-%s', a, b) FROM a_t",
        "SELECT printf('%.5d', a) FROM a_t",
        "SELECT trim(a, b) FROM a_t",
    ],
)
def test_sqlite_keeps_them_under_its_own_bounded_versions(sql: str) -> None:
    assert isinstance(SqlGate("a_").check_query(sql), Allow)
