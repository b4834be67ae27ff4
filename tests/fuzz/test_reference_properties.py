"""Hypothesis properties: the URL check and the SQL gate against their independent oracles.

The same oracles the atheris targets use (`fuzz._reference.reference_fetch`, SQLite's own
authorizer in `fuzz._sqlite_oracle`), here driven by structured generators that reach the
interesting corners quickly: URL notations from the WHATWG and SSRF families, and SQL built
from a small grammar over prefixed tables, decoys, CTEs and a mix of safe and unsafe functions.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzz._reference import reference_fetch
from fuzz._sqlite_oracle import PREFIX, reads_schema_table, violations
from suaveplan_sandbox.permissions import Allow, Deny
from suaveplan_sandbox.permissions._fetch_rules import FetchRuleSet
from suaveplan_sandbox.permissions._sql_gate import SqlGate

RULE_POOL = [
    "api.stripe.com",
    "*.stripe.com",
    "http:localhost:8080",
    "127.0.0.1",
    "[::1]:8080",
    "bücher.de",
    "*.example.com:8443",
    "http:*.internal.test",
    "API.Example.ORG.",
    "10.0.0.1:443",
]
_HOSTS = st.sampled_from(
    ["api.stripe.com", "API.STRIPE.COM", "api.stripe.com.", "eu.api.stripe.com", "stripe.com",
     "evilstripe.com", "stripe.com.evil.com", "localhost", "127.0.0.1", "0x7f.0.0.1",
     "2130706433", "0177.0.0.1", "127.1", "[::1]", "[0:0:0:0:0:0:0:1]", "[::ffff:127.0.0.1]",
     "bücher.de", "xn--bcher-kva.de", "BÜCHER.de", "a.example.com", "example.com",
     "x.internal.test", "api.example.org", "10.0.0.1", "%31%30.0.0.1", "a..stripe.com",
     "xn--", "*.stripe.com", "api。stripe。com", "\uff41\uff50\uff49.stripe.com", ""]
)  # fmt: skip
_URLS = st.builds(
    lambda scheme, sep, user, host, port, path, ws: ws.join(
        [scheme + sep + user + host + port + path]
    ),
    st.sampled_from(["https", "http", "HTTPS", "HtTp", "ftp", "file", "ws", "javascript"]),
    st.sampled_from(["://", ":/", ":\\\\", ":///", "://\t", ":"]),
    st.sampled_from(["", "user@", "user:pw@", "api.stripe.com@", "a@b@", "@"]),
    _HOSTS,
    st.sampled_from(["", ":443", ":80", ":8080", ":8443", ":0", ":65536", ":", ":0443"]),
    st.sampled_from(["", "/", "/v1?x=1#f", "\\v1", "#@evil.com", "?@evil.com", "/%2e%2e/"]),
    st.sampled_from(["", "\n", "\t"]),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(RULE_POOL), min_size=1, max_size=4, unique=True), _URLS)
def test_fetch_decisions_agree_with_the_reference_model(rules: list[str], url: str) -> None:
    decision = FetchRuleSet(rules).check(url)
    expected = reference_fetch(rules, url)
    if isinstance(decision, Allow):
        got = ("allow", decision.rule, decision.target)
    else:
        assert isinstance(decision, Deny)
        got = (decision.reason.value, None, None)
    assert got == (expected.outcome, expected.rule, expected.href)


_TABLES = st.sampled_from(
    ["billing_x", "billing_y", "BILLING_X", '"billing_x"', "[billing_y]", "`billing_x`",
     "users", '"users"', "[users]", "secrets", "main.billing_x", "temp.users",
     "sqlite_master", "sqlite_schema", "t", '"Billing_x"', "billing_x AS users"]
)  # fmt: skip
_FUNCS = st.sampled_from(
    ["count", "lower", "abs", "coalesce", "json_extract", "printf", "date", "length",
     "load_extension", "readfile", "sqlite_version", "json_each", "pragma_table_info",
     "fts3_tokenizer", "zeroblob", "unhex", "likelihood"]
)  # fmt: skip


@st.composite
def _selects(draw: st.DrawFn, depth: int = 0) -> str:
    table = draw(_TABLES)
    cols = draw(st.sampled_from(["*", "a", "a, b", "count(*)", "x.a"]))
    if draw(st.booleans()):
        cols = f"{draw(_FUNCS)}(a)"
    sql = f"SELECT {cols} FROM {table}"
    if draw(st.booleans()):
        sql += f" JOIN {draw(_TABLES)} ON 1 = 1"
    if depth < 2 and draw(st.booleans()):
        sql += f" WHERE a IN ({draw(_selects(depth + 1))})"
    elif draw(st.booleans()):
        # SQLite's `expr IN table-name`, which sqlglot reads as a column.
        sql += f" WHERE a {draw(st.sampled_from(['IN', 'NOT IN']))} {draw(_TABLES)}"
    if depth < 2 and draw(st.booleans()):
        sql += f" UNION SELECT a FROM {draw(_TABLES)}"
    return sql


@st.composite
def _statements(draw: st.DrawFn) -> str:
    inner = draw(_selects())
    shape = draw(
        st.sampled_from(
            ["select", "cte", "recursive", "insert", "update", "delete", "shadow", "shadowed",
             "replace", "update_or", "upsert", "returning"]
        )
    )  # fmt: skip
    target = draw(_TABLES)
    body = {
        "select": inner,
        "cte": f"WITH t AS ({inner}) SELECT * FROM t",
        "recursive": f"WITH RECURSIVE t(a) AS (SELECT 1 UNION ALL SELECT a + 1 FROM t "
        f"WHERE a < 5) SELECT a FROM t, ({inner})",
        "insert": f"INSERT INTO {target} (a) {inner}",
        "update": f"UPDATE {target} SET a = ({inner}) RETURNING a",
        "delete": f"DELETE FROM {target} WHERE a IN ({inner})",
        # CTEs named like real unprefixed tables: the oracle must tell CTE reads apart.
        "shadow": f"WITH users AS ({inner}) SELECT * FROM users",
        "shadowed": f"WITH users AS (SELECT ?1 AS a), t AS (SELECT * FROM users) {inner}",
        "replace": f"REPLACE INTO {target} (a) {inner}",
        "update_or": f"UPDATE OR REPLACE {target} SET a = ({inner}) WHERE b = :b",
        "upsert": f"INSERT INTO {target} (a) VALUES (x'00') ON CONFLICT (a) DO UPDATE SET "
        f"b = excluded.b WHERE excluded.a IN ({inner})",
        "returning": f"DELETE FROM {target} WHERE a = ?1 RETURNING (SELECT count(*) FROM "
        f"({inner}))",
    }[shape]
    return body + draw(st.sampled_from(["", ";", " -- c", "; SELECT 1", "\x00"]))


_GATE = SqlGate(PREFIX, cache_size=0)


# derandomize: CI explores the same 300 statements every run, so a finding reproduces instead
# of flaking; new ground is `make fuzz`'s job.
@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(_statements())
def test_an_allowed_statement_touches_only_prefixed_tables_in_sqlite(sql: str) -> None:
    if _GATE.check_query(sql).allowed:
        assert violations(sql) == [], sql


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM users",
        "SELECT * FROM billing_x JOIN users ON 1 = 1",
        "SELECT load_extension('x')",
        "PRAGMA table_info(billing_x)",
        "ATTACH ':memory:' AS other",
        "SELECT * FROM billing_x WHERE a = '\x00'",
        # Real reads next to, or shadowed by, a CTE of the same name are still findings.
        "SELECT 1 FROM users",
        "WITH a AS (SELECT 1) SELECT 1 FROM users",
        "SELECT (WITH users AS (SELECT 1) SELECT count(*) FROM users), "
        "(SELECT count(*) FROM users)",
        "WITH users AS (SELECT 1 AS a) DELETE FROM users",
        "WITH users AS (SELECT 1 AS a) SELECT 1 FROM main.users",
        "SELECT 1 WHERE 1 IN users",
        "REPLACE INTO users (a) VALUES (1)",
        "INSERT INTO billing_x (a) VALUES (1) ON CONFLICT (a) DO UPDATE SET b = "
        "(SELECT b FROM users)",
    ],
)
def test_the_sqlite_oracle_reports_reach_beyond_the_prefix(sql: str) -> None:
    assert violations(sql)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM billing_x",
        "WITH users AS (SELECT 1 AS a) SELECT a FROM users",
        "UPDATE billing_x SET a = (SELECT count(*) FROM billing_y) RETURNING a",
        # SQLite's authorizer names a CTE read like a table read; these read only CTEs.
        "WITH a AS (SELECT 1), b AS (SELECT * FROM a) SELECT 0 FROM b",
        "WITH users AS (SELECT 1) SELECT 1 FROM users",
        "WITH users AS (SELECT 1 AS a) SELECT 1 FROM Users AS u, USERS AS v",
        "WITH users AS (SELECT 1 AS a) SELECT 1 WHERE 1 IN users",
        "WITH RECURSIVE users(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM users WHERE n < 3) "
        "SELECT count(*) FROM users",
        "WITH users AS (SELECT 1 AS a) INSERT INTO billing_x (a) SELECT a FROM users",
    ],
)
def test_the_sqlite_oracle_accepts_prefixed_work(sql: str) -> None:
    assert violations(sql) == []


def test_the_oracle_tells_a_cte_read_from_a_schema_table_read() -> None:
    assert reads_schema_table("SELECT 1 FROM users", "users")
    assert not reads_schema_table("WITH users AS (SELECT 1) SELECT 1 FROM users", "users")
    assert reads_schema_table(
        "WITH users AS (SELECT 1) SELECT 1 FROM users, (SELECT 1 FROM secrets)", "secrets"
    )
