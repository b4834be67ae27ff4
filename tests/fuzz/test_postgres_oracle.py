"""The SQL gate's `postgres` dialect against a real PostgreSQL 15 (`fuzz._postgres_oracle`).

A role that may touch only the prefixed tables runs every statement the gate allows; a
permission error on anything else is a finding. Bounded and derandomized for CI; the cluster
is a throw-away one on a unix socket in a temp dir (no TCP).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzz._postgres_oracle import PG_BIN, PREFIX, PostgresOracle, running_postgres
from suaveplan_sandbox.permissions._sql_gate import SqlGate


@pytest.fixture(scope="module")
def oracle() -> Iterator[PostgresOracle]:
    if not (PG_BIN / "initdb").exists():
        pytest.fail("PostgreSQL 15 is not installed; .ci/run installs it (apt-get postgresql)")
    with running_postgres() as conninfo, PostgresOracle(conninfo) as pg:
        yield pg


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM users",
        "SELECT * FROM billing_x WHERE a IN (SELECT a FROM secrets)",
        "WITH billing_q AS (SELECT a FROM users) SELECT * FROM billing_q",
        "INSERT INTO billing_x (a) SELECT a FROM secrets",
        "UPDATE billing_x SET a = 1 RETURNING (SELECT count(*) FROM users)",
        "DELETE FROM billing_x USING users WHERE billing_x.a = users.a",
        "INSERT INTO billing_x (a) VALUES (1) ON CONFLICT (a) DO UPDATE SET b = "
        "(SELECT b FROM users LIMIT 1)",
    ],
)
def test_the_postgres_oracle_reports_reach_beyond_the_prefix(
    oracle: PostgresOracle, sql: str
) -> None:
    assert oracle.violations(sql)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM billing_x JOIN billing_y ON billing_x.a = billing_y.a WHERE b = $1",
        "WITH users AS (SELECT 1 AS a) SELECT a FROM users",
        "INSERT INTO billing_x (a) VALUES ($1) ON CONFLICT (a) DO UPDATE SET b = excluded.b "
        "RETURNING id",
        "UPDATE billing_x SET b = y.b FROM billing_y AS y WHERE y.a = billing_x.a",
    ],
)
def test_the_postgres_oracle_accepts_prefixed_work(oracle: PostgresOracle, sql: str) -> None:
    assert SqlGate(PREFIX, dialect="postgres").check_query(sql).allowed
    assert oracle.violations(sql) == []


_TABLES = st.sampled_from(
    ["billing_x", "billing_y", "BILLING_X", '"billing_x"', '"Billing_x"', "users", '"users"',
     "secrets", "public.billing_x", "public.users", "pg_class", "t", "billing_x AS users",
     "LATERAL (SELECT a FROM users) AS billing_l"]
)  # fmt: skip
_FUNCS = st.sampled_from(["count", "lower", "abs", "coalesce", "length", "md5", "greatest"])


@st.composite
def _selects(draw: st.DrawFn, depth: int = 0) -> str:
    table = draw(_TABLES)
    cols = draw(st.sampled_from(["*", "a", "a, b", "count(*)"]))
    if draw(st.booleans()):
        cols = f"{draw(_FUNCS)}(a)"
    sql = f"SELECT {cols} FROM {table}"
    if draw(st.booleans()):
        sql += f" JOIN {draw(_TABLES)} ON true"
    if depth < 2 and draw(st.booleans()):
        sql += f" WHERE a IN ({draw(_selects(depth + 1))})"
    elif draw(st.booleans()):
        sql += " WHERE a = $1"
    if depth < 2 and draw(st.booleans()):
        sql += f" UNION SELECT a FROM {draw(_TABLES)}"
    return sql


@st.composite
def _statements(draw: st.DrawFn) -> str:
    inner = draw(_selects())
    target = draw(_TABLES)
    shape = draw(
        st.sampled_from(["select", "cte", "shadow", "insert", "update", "delete", "upsert"])
    )
    return {
        "select": inner,
        "cte": f"WITH t AS ({inner}) SELECT * FROM t",
        "shadow": f"WITH users AS ({inner}) SELECT * FROM users",
        "insert": f"INSERT INTO {target} (a) {inner}",
        "update": f"UPDATE {target} SET a = ({inner} LIMIT 1) RETURNING a",
        "delete": f"DELETE FROM {target} USING {draw(_TABLES)} WHERE true RETURNING 1",
        "upsert": f"INSERT INTO {target} (a) VALUES (1) ON CONFLICT (a) DO UPDATE SET "
        f"b = excluded.b WHERE excluded.a IN ({inner})",
    }[shape]


_GATE = SqlGate(PREFIX, dialect="postgres", cache_size=0)


@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(_statements())
def test_an_allowed_statement_reaches_only_prefixed_tables_in_postgres(
    oracle: PostgresOracle, sql: str
) -> None:
    if _GATE.check_query(sql).allowed:
        assert oracle.violations(sql) == [], sql
