"""The SQL gate: vectors, per-construct units, and a differential check against real SQLite."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path
from typing import Any, Literal

import pytest

from fuzz._sqlite_oracle import null_bindings, violations
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.permissions._decision import Allow, Deny, DenyReason
from suaveplan_sandbox.permissions._sql_gate import (
    POSTGRES_SAFE_FUNCTIONS,
    SQLITE_SAFE_FUNCTIONS,
    SqlGate,
)

_VECTORS: list[dict[str, Any]] = json.loads(
    (Path(__file__).parent.parent / "vectors" / "sql.json").read_text(encoding="utf-8")
)["cases"]


def _outcome(decision: Allow | Deny) -> str:
    return "allow" if isinstance(decision, Allow) else decision.reason.value


def _id(case: dict[str, Any]) -> str:
    return f"{case['dialect']}-{case['expect']}-{case['note']}"


@pytest.mark.parametrize("case", _VECTORS, ids=[_id(c) for c in _VECTORS])
def test_vector_decides_as_recorded(case: dict[str, Any]) -> None:
    gate = SqlGate(case["prefix"], dialect=case["dialect"])
    assert _outcome(gate.check_query(case["sql"])) == case["expect"]


def test_vector_file_has_enough_cases_with_both_sides() -> None:
    assert len(_VECTORS) >= 80
    assert sum(c["expect"] == "allow" for c in _VECTORS) >= 20
    assert sum(c["expect"] != "allow" for c in _VECTORS) >= 50


GATE = SqlGate("billing_")


def test_allow_carries_the_prefix_rule_and_the_sql_text_verbatim() -> None:
    sql = "  select * from billing_x ; "
    assert GATE.check_query(sql) == Allow(rule="billing_", target=sql)


@pytest.mark.parametrize("sql", [None, 1, b"select 1", "", "   ", ["select 1"]])
def test_non_string_or_empty_sql_is_a_malformed_payload(sql: object) -> None:
    assert GATE.check_query(sql) == Deny(capability="db", reason=DenyReason.MALFORMED_PAYLOAD)


@pytest.mark.parametrize("params", [None, "ab", {"a": 1}, [[1]], [object()], ({1},), 5])
def test_params_must_be_a_sequence_of_plain_scalars(params: object) -> None:
    decision = GATE.check_query("select * from billing_x where a = ?", params)
    assert decision == Deny(capability="db", reason=DenyReason.MALFORMED_PAYLOAD)


def test_plain_scalar_params_are_accepted() -> None:
    sql = "select * from billing_x where a = ?"
    assert GATE.check_query(sql, [None, True, 1, 1.5, "s", b"b"]).allowed
    assert GATE.check_query(sql, (1,)).allowed


def test_a_repeated_statement_is_served_from_the_cache() -> None:
    gate = SqlGate("billing_", cache_size=2)
    first = gate.check_query("select * from billing_x")
    assert gate.check_query("select * from billing_x") is first


def test_the_cache_is_bounded_and_evicts_least_recently_used() -> None:
    gate = SqlGate("billing_", cache_size=2)
    a = gate.check_query("select 1 from billing_a")
    gate.check_query("select 1 from billing_b")
    gate.check_query("select 1 from billing_a")
    gate.check_query("select 1 from billing_c")
    assert gate.check_query("select 1 from billing_a") is a
    assert len(gate._cache) == 2


def test_cache_does_not_skip_param_validation() -> None:
    gate = SqlGate("billing_")
    assert gate.check_query("select * from billing_x", ()).allowed
    assert not gate.check_query("select * from billing_x", [object()]).allowed


@pytest.mark.parametrize("prefix", [None, ""])
def test_no_prefix_puts_every_table_out_of_scope(prefix: str | None) -> None:
    gate = SqlGate(prefix)
    assert gate.check_query("SELECT 1").allowed
    assert _outcome(gate.check_query("select * from x")) == "table-out-of-scope"
    assert _outcome(gate.check_table("x")) == "table-out-of-scope"


def test_unknown_dialect_is_refused_at_construction() -> None:
    with pytest.raises(ValueError, match="dialect"):
        SqlGate("billing_", dialect="mysql")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "expect"),
    [
        ("billing_invoices", "allow"),
        ("BILLING_invoices", "allow"),
        ("users", "table-out-of-scope"),
        ("billingx", "table-out-of-scope"),
        ("main.billing_x", "table-out-of-scope"),
        ("billing_x; drop table users", "table-out-of-scope"),
        ('"billing_x"', "table-out-of-scope"),
        ("b\u0456lling_x", "table-out-of-scope"),
        ("", "malformed-payload"),
        (None, "malformed-payload"),
        (3, "malformed-payload"),
    ],
)
def test_table_payload_must_be_a_plain_prefixed_identifier(name: object, expect: str) -> None:
    assert _outcome(GATE.check_table(name)) == expect


def test_referenced_tables_excludes_cte_names_and_folds_case() -> None:
    sql = (
        "with t as (select * from Billing_A) "
        'select * from t join "billing_B" on 1 where exists (select 1 from users)'
    )
    assert GATE.referenced_tables(sql) == frozenset({"billing_a", "billing_B", "users"})


def test_referenced_tables_of_unparsable_sql_is_empty() -> None:
    assert GATE.referenced_tables("select * from") == frozenset()


def test_migration_allows_ddl_on_prefixed_objects_and_denies_the_rest() -> None:
    decisions = SqlGate("billing_").check_migration(
        """
        CREATE TABLE billing_x (id INTEGER PRIMARY KEY, a TEXT NOT NULL DEFAULT '');
        CREATE INDEX billing_x_a ON billing_x (a);
        INSERT INTO billing_x (a) VALUES ('seed');
        CREATE TABLE users (id INTEGER);
        CREATE INDEX idx ON billing_x (a);
        DROP TABLE billing_x;
        ATTACH DATABASE '/tmp/x' AS x;
        PRAGMA journal_mode = WAL;
        """
    )
    assert [_outcome(d) for d in decisions] == [
        "allow",
        "allow",
        "allow",
        "table-out-of-scope",
        "table-out-of-scope",
        "allow",
        "statement-not-permitted",
        "statement-not-permitted",
    ]


def test_migration_that_does_not_parse_is_denied() -> None:
    assert [_outcome(d) for d in GATE.check_migration("CREATE TABLE (")] == [
        "statement-not-permitted"
    ]


def test_function_allowlists_are_lower_case_and_exclude_dangerous_functions() -> None:
    for names in (SQLITE_SAFE_FUNCTIONS, POSTGRES_SAFE_FUNCTIONS):
        assert all(n == n.lower() for n in names)
        assert not names & {"load_extension", "readfile", "writefile", "pg_read_file",
                            "lo_import", "dblink", "json_each", "generate_series"}  # fmt: skip


# -- differential: what SQLite itself touches for every allowed sqlite vector ---------------

_SQLITE_ALLOWED = [
    c for c in _VECTORS if c["dialect"] == "sqlite" and c["expect"] == "allow" and c["prefix"]
]
_TABLE_ACTIONS = {sqlite3.SQLITE_READ, sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE,
                  sqlite3.SQLITE_DELETE}  # fmt: skip


_DECOYS = frozenset({"users", "a", "b", "t", "u", "r"})


def _database_for(gate: SqlGate, sql: str) -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:")
    # Decoys named like the vectors' CTEs: if SQLite resolved a CTE name to a real table, the
    # authorizer would report the decoy and the assertion below would fail.
    tables = set(gate.referenced_tables(sql)) | {"billing_x", "billing_y"} | _DECOYS
    for table in tables:
        quoted = '"' + table.replace('"', '""') + '"'
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {quoted} "  # names from our own vectors
            "(id INTEGER PRIMARY KEY, a UNIQUE, b, c, doc, name, x, ts)"
        )
    return conn


def _bindings_needed(conn: sqlite3.Connection, sql: str) -> int:
    """How many parameters SQLite counts in `sql` (`?1` twice is one, `:a` is one)."""
    try:
        conn.execute(f"EXPLAIN {sql}", ())
    except sqlite3.ProgrammingError as exc:
        found = re.search(r"uses (\d+), and there are 0 supplied", str(exc))
        if found:
            return int(found.group(1))
        raise
    return 0


@pytest.mark.parametrize("case", _SQLITE_ALLOWED, ids=[_id(c) for c in _SQLITE_ALLOWED])
def test_sqlite_engine_touches_only_prefixed_tables_for_allowed_vectors(
    case: dict[str, Any],
) -> None:
    """The shared oracle (`fuzz._sqlite_oracle`): SQLite's authorizer, CTE reads told apart
    from reads of real tables of the same name; and every allowed vector is real SQLite."""
    sql = case["sql"]
    assert violations(sql, case["prefix"]) == []
    conn = _database_for(SqlGate(case["prefix"]), sql)
    conn.execute(sql, null_bindings(sql, _bindings_needed(conn, sql)))


def test_engine_authorizer_sees_the_table_the_parser_sees_in_a_cte_body() -> None:
    sql = "with t as (select * from billing_x) select * from t"
    conn = _database_for(GATE, sql)
    touched: set[str] = set()

    def authorizer(action: int, arg1: str | None, *_: str | None) -> int:
        if action == sqlite3.SQLITE_READ and arg1 is not None:
            touched.add(arg1)
        return sqlite3.SQLITE_OK

    conn.set_authorizer(authorizer)
    conn.execute(sql)
    assert touched == {"billing_x"}
    assert GATE.referenced_tables(sql) == frozenset({"billing_x"})


def test_migration_views_and_renames_need_the_prefix_on_both_sides() -> None:
    decisions = GATE.check_migration(
        """
        CREATE VIEW billing_v AS SELECT a FROM billing_x;
        CREATE VIEW billing_w AS SELECT a FROM users;
        CREATE VIEW v AS SELECT a FROM billing_x;
        ALTER TABLE billing_x RENAME TO users;
        ALTER TABLE billing_x ADD COLUMN c TEXT;
        CREATE TABLE billing_c AS SELECT * FROM sqlite_master;
        """
    )
    assert [_outcome(d) for d in decisions] == [
        "allow",
        "table-out-of-scope",
        "table-out-of-scope",
        "table-out-of-scope",
        "allow",
        "statement-not-permitted",
    ]


@pytest.mark.parametrize(
    "sql",
    [
        "with users as (select 1) insert into users values (1)",
        "with users as (select 1) update users set a = 1",
        "with users as (select 1) delete from users",
    ],
)
def test_a_cte_never_covers_a_dml_target(sql: str) -> None:
    assert _outcome(GATE.check_query(sql)) == "table-out-of-scope"


@pytest.mark.parametrize(
    "sql",
    [
        "replace into billing_x (a) values (?1)",
        "update or replace billing_x set a = ?2 where b = ?1",
        "with q as (select 1 as a) replace into billing_x (a) select a from q",
    ],
)
def test_sqlite_synonyms_are_decided_but_the_original_text_is_what_runs(sql: str) -> None:
    assert GATE.check_query(sql) == Allow(rule="billing_", target=sql)
    assert GATE.referenced_tables(sql) == frozenset({"billing_x"})


@pytest.mark.parametrize(
    "sql",
    [
        "replace into billing_x (a) values (1)",
        "update or replace billing_x set a = 1",
        "select * from billing_x where a = ?1",
    ],
)
def test_postgres_does_not_take_sqlite_only_spellings(sql: str) -> None:
    gate = SqlGate("billing_", dialect="postgres")
    assert _outcome(gate.check_query(sql)) == "statement-not-permitted"


def test_cte_names_lists_every_scope_folded_as_sqlite_compares() -> None:
    sql = 'WITH A AS (SELECT 1), "Bq" AS (SELECT * FROM a) SELECT (WITH c AS (SELECT 1) SELECT 1)'
    assert GATE.cte_names(sql) == frozenset({"a", "bq", "c"})
    assert GATE.cte_names("SELECT 1; SELECT 2") == frozenset()


@pytest.mark.parametrize("dialect", ["sqlite", "postgres"])
def test_sql_longer_than_the_limit_is_refused_before_it_is_parsed(
    dialect: Literal["sqlite", "postgres"], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Parsing costs ~10 µs and hundreds of bytes a token on the host's event loop: one frame
    # of `SELECT 1,1,…` held it for minutes. The limit is in characters, before tokenizing.
    gate = SqlGate("billing_", dialect=dialect, max_sql_length=64)
    fits = "SELECT a FROM billing_x WHERE a IN (1, 2, 3)".ljust(64)
    assert isinstance(gate.check_query(fits), Allow)
    assert _outcome(gate.check_query(fits + " ")) == "statement-not-permitted"

    def no_parsing(*_: object, **__: object) -> object:
        raise AssertionError("the gate tokenized SQL over its length limit")

    monkeypatch.setattr(gate._dialect_obj, "tokenize", no_parsing)
    assert _outcome(gate.check_query("SELECT 1," + " 1," * 5000 + " 1")) == (
        "statement-not-permitted"
    )
    assert _outcome(SqlGate("billing_", dialect=dialect).check_query("SELECT 1" + ",1" * 9000)) == (
        "statement-not-permitted"
    )


@pytest.mark.parametrize("value", [0, -1, True, 1.5])
def test_the_sql_length_limit_is_a_positive_int(value: Any) -> None:
    assert isinstance(SqlGate("billing_", max_sql_length=8).check_query("SELECT 1"), Allow)
    with pytest.raises((TypeError, ValueError)):
        SqlGate("billing_", max_sql_length=value)


@pytest.mark.parametrize("dialect", ["sqlite", "postgres"])
def test_a_migration_too_deep_to_render_is_refused_not_raised(
    dialect: Literal["sqlite", "postgres"],
) -> None:
    # Deep enough that sqlglot's parse and the walk get through and its rendering recurses
    # past Python's limit: a RecursionError escaped the adapters' migrations uncoded.
    depth = 100
    sql = (
        "INSERT INTO billing_x SELECT * FROM "
        + "(SELECT * FROM " * depth
        + "billing_x"
        + ")" * depth
    )
    gate = SqlGate("billing_", dialect=dialect)
    assert [_outcome(d) for d in gate.check_migration(sql)] == ["statement-not-permitted"]


@pytest.mark.parametrize(
    ("sql", "shape"),
    [
        ("SELECT 1", (True, False)),
        ("SELECT 1 UNION SELECT 2", (True, False)),
        ("INSERT INTO billing_x (a) VALUES (1)", (False, True)),
        ("UPDATE billing_x SET a = 1 WHERE a IN (SELECT 1)", (False, True)),
        ("DELETE FROM billing_x RETURNING a", (True, True)),
        ("WITH q AS (SELECT 1) INSERT INTO billing_x (a) SELECT * FROM q", (False, True)),
        ("WITH d AS (DELETE FROM billing_x RETURNING a) SELECT * FROM d", (True, True)),
        ("WITH d AS (DELETE FROM billing_x) SELECT 1", (True, True)),
        ("not sql at all", (True, True)),
    ],
)
def test_query_shape_says_whether_a_statement_returns_rows_and_may_write(
    sql: str, shape: tuple[bool, bool]
) -> None:
    assert SqlGate("billing_", dialect="postgres").query_shape(sql) == shape


def test_a_policy_passes_its_sql_length_limit_to_its_gate() -> None:
    manifest = {"name": "billing", "version": "1.0.0", "database": {"tablePrefix": "billing_"}}
    long_sql = "SELECT a FROM billing_x WHERE a IN (" + ", ".join(["1"] * 6000) + ")"
    default = PermissionPolicy.from_manifest(manifest, root=".")
    assert _outcome(default.sql.check_query(long_sql)) == "statement-not-permitted"
    wider = PermissionPolicy.from_manifest(manifest, root=".", max_sql_length=64 * 1024)
    assert isinstance(wider.sql.check_query(long_sql), Allow)
    narrow = PermissionPolicy.from_manifest(manifest, root=".", max_sql_length=16)
    assert _outcome(narrow.sql.check_query("SELECT a FROM billing_x")) == "statement-not-permitted"
