"""The postgres gate against casts whose input functions look names up in the catalog.

PostgreSQL resolves an unqualified type name through the search path, which always holds
`pg_catalog`; sqlglot parses a type it does not know as `USERDEFINED` with the name as text.
Proven on PostgreSQL 15 as a plugin's runtime role: `'{public.host_secret}'::_regclass`
answers whether the host has that table, `'nobody=r/admin'::aclitem` whether a role exists.
"""

from __future__ import annotations

import pytest

from suaveplan_sandbox.permissions._decision import Allow, Deny, DenyReason
from suaveplan_sandbox.permissions._sql_gate import SqlGate


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT '{public.host_secret}'::_regclass::text",
        "SELECT CAST('{pg_authid}' AS _regclass)",
        "SELECT '{pg_sleep}'::_regproc",
        "SELECT '{\"pg_sleep(double precision)\"}'::_regprocedure",
        "SELECT '{public}'::_regnamespace",
        "SELECT '{admin}'::_regrole",
        "SELECT 'nobody=r/admin'::aclitem",
        "SELECT '{nobody=r/admin}'::_aclitem",
        "SELECT x::_regtype[] FROM a_t",
        'SELECT x::"_regclass" FROM a_t',
        "SELECT x::pg_authid FROM a_t",
        "SELECT x::other_table FROM a_t",
    ],
)
def test_postgres_refuses_casts_to_types_nobody_reviewed(sql: str) -> None:
    decision = SqlGate("a_", dialect="postgres").check_query(sql)
    assert isinstance(decision, Deny)
    assert decision.reason is DenyReason.STATEMENT_NOT_PERMITTED


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT x::int, x::text, x::jsonb, x::timestamptz FROM a_t",
        "SELECT '10.0.0.0/8'::cidr, '08:00:2b:01:02:03'::macaddr",
        "SELECT to_char(x::date, 'YYYY') FROM a_t",
        "SELECT 'a b'::tsvector, 'a & b'::tsquery, '$.a'::jsonpath",
        "SELECT '{1,2}'::int[], CAST(x AS text[]) FROM a_t",
    ],
)
def test_postgres_keeps_casts_to_ordinary_types(sql: str) -> None:
    assert isinstance(SqlGate("a_", dialect="postgres").check_query(sql), Allow)


def test_sqlite_type_names_stay_free_text() -> None:
    # SQLite reads any type name for its affinity; nothing is looked up.
    assert isinstance(SqlGate("a_").check_query("SELECT CAST(x AS whatever) FROM a_t"), Allow)
