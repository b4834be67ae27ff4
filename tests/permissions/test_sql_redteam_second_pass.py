"""Second red-team pass on the SQL gate: text the gate reads one way and the engine another.

PostgreSQL has no engine-side check on functions or catalogs (PUBLIC may call
`set_config` and read `pg_roles`), so there the gate is the boundary: any text sqlglot reads
as a literal or a comment while PostgreSQL reads it as code runs unchecked. Two such
readings were found and proven on PostgreSQL 15 (`tests/adapters/test_sql_redteam_adapters.py`
runs them as a plugin's role): a dollar-quote tag PostgreSQL does not accept (`$1,$`), and
`*/*` inside a nested comment. The gate now also reads each statement the way the engine's
own lexer does and refuses it unless both agree on what is code (`_lexically_agrees`).
"""

from __future__ import annotations

import logging
from typing import Literal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlglot.dialects.dialect import Dialect

from fuzz._sqlite_oracle import violations
from suaveplan_sandbox.permissions._decision import Allow, Deny, DenyReason
from suaveplan_sandbox.permissions._sql_gate import SqlGate, _engine_lexemes, _lexically_agrees

Dialects = Literal["sqlite", "postgres"]


def _gate(dialect: Dialects, prefix: str = "app_") -> SqlGate:
    return SqlGate(prefix, dialect=dialect, cache_size=0)


def _refused(dialect: Dialects, sql: str) -> None:
    decision = _gate(dialect).check_query(sql)
    assert isinstance(decision, Deny), sql
    assert decision.reason is DenyReason.STATEMENT_NOT_PERMITTED


# -- PostgreSQL: dollar quotes ---------------------------------------------------------------

# sqlglot took anything between two `$` for a tag; PostgreSQL's tag is an identifier without
# `$` (`[A-Za-z\x80-\xff_][A-Za-z\x80-\xff_0-9]*`), so to PostgreSQL each of these opens no
# string: `$1,$2, …` is two parameters and then code.
_FOREIGN_TAGS = [
    "SELECT $1,$2, set_config('statement_timeout', '0', false) AS h -- $1,$\n FROM app_t",
    "SELECT $1,$2, (SELECT string_agg(rolname, ',') FROM pg_roles) AS h -- $1,$\n FROM app_t",
    "SELECT $1,$2, set_config('a.b', 'c', false) AS h, %s, %s -- $1,$\n FROM app_t",
    "SELECT $1)$ , pg_sleep(1) -- $1)$\n FROM app_t",
    # PostgreSQL 14 and older read `$1a$` as the parameter `$1` and the alias `a$`.
    "SELECT $1a$, set_config('a.b', 'c', false), $1a$ FROM app_t",
    "SELECT $a-b$ x $a-b$ FROM app_t",
    "SELECT $1.$ x $1.$ FROM app_t",
]


@pytest.mark.parametrize("sql", _FOREIGN_TAGS)
def test_postgres_refuses_a_dollar_quote_whose_tag_postgres_does_not_read_as_one(
    sql: str,
) -> None:
    _refused("postgres", sql)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT $$a;b$$ FROM app_t",
        "SELECT $q$it's$q$, $_$x$_$, $é$y$é$, $A1$z$A1$ FROM app_t",
        "SELECT $a$ $b$ $a$ FROM app_t",
        "SELECT x FROM app_t WHERE x = $1 AND y = $2",
        "SELECT a$b, c$ FROM app_t",
    ],
)
def test_postgres_keeps_dollar_quotes_and_parameters_it_reads_as_postgres_does(sql: str) -> None:
    assert isinstance(_gate("postgres").check_query(sql), Allow)


# -- PostgreSQL: nested comments ---------------------------------------------------------------

# Inside a comment, sqlglot counted `*/*` as a close and then an open (sharing the `/`);
# PostgreSQL reads `*/` (a close) and then a plain `*`, so here its comment ends before the
# payload, which sqlglot took for comment text.
_NESTED_COMMENTS = [
    "SELECT 1 /* /* */* */ , set_config('statement_timeout', '0', false) AS h -- */\n FROM app_t",
    "SELECT 1 /* /* */* */ , (SELECT count(*) FROM pg_roles) AS h -- */\n FROM app_t",
    "SELECT 1 /* /* /* */* */* */ , pg_sleep(1) -- */ */\n FROM app_t",
]


@pytest.mark.parametrize("sql", _NESTED_COMMENTS)
def test_postgres_refuses_a_comment_that_ends_earlier_than_sqlglot_thinks(sql: str) -> None:
    _refused("postgres", sql)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT 1 /* /* */ */ FROM app_t",
        "SELECT 1 /**/ FROM app_t /* a */ /* b */",
        "SELECT 1 /* a /* b /* c */ */ */ FROM app_t",
        "SELECT 1 FROM app_t -- /* no comment start here",
        "SELECT 1 FROM app_t --",
    ],
)
def test_postgres_keeps_comments_both_readers_agree_on(sql: str) -> None:
    assert isinstance(_gate("postgres").check_query(sql), Allow)


# -- both engines: what else can hide text ------------------------------------------------------


@pytest.mark.parametrize(
    ("dialect", "sql"),
    [
        # Whitespace to sqlglot (str.isspace), identifier characters to both engines.
        ("postgres", "SELECT 1 FROM app_t\u00a0, pg_roles"),
        ("sqlite", "SELECT 1 FROM app_t\u3000secrets"),
        # SQLite's TCL parameter `$a(…)` runs to the first `)`: the quote inside is no string.
        ("sqlite", "SELECT a FROM app_t WHERE a = @lower(') OR a IN (SELECT s FROM secrets) --')"),
        ("sqlite", "SELECT $a(') , (SELECT s FROM secrets) AS z , $b(') FROM app_t"),
        # An unterminated literal or PostgreSQL comment: the engine refuses the text.
        ("postgres", "SELECT 1 FROM app_t /* /* */"),
        ("postgres", "SELECT 'a FROM app_t"),
        # U&"…" is an identifier PostgreSQL decodes (`U&"x0070g_roles" UESCAPE 'x'` is
        # `pg_roles`); sqlglot cannot read it, and the gate refuses it.
        ("postgres", "SELECT * FROM U&\"x0070g_roles\" UESCAPE 'x'"),
    ],
)
def test_text_the_engine_reads_as_code_but_sqlglot_does_not_is_refused(
    dialect: Dialects, sql: str
) -> None:
    _refused(dialect, sql)


@pytest.mark.parametrize(
    ("dialect", "sql"),
    [
        ("sqlite", "SELECT 0x1F, x'00', 'a''b', \"c\"\"d\", `e`, [f g] FROM app_t"),
        ("sqlite", "SELECT a FROM app_t WHERE a = $x AND b = :y AND c = @z AND d = ?3"),
        ("sqlite", "SELECT a FROM app_t /* a */ -- and a line\r still the line"),
        ("postgres", "SELECT 'a'\n  'b', B'01', X'ff', N'n' FROM app_t"),
        ("postgres", "SELECT x FROM app_t WHERE x = %s AND y LIKE '%%a' -- 100%%"),
        ("postgres", "SELECT /*+ a hint is a comment */ x FROM app_t"),
    ],
)
def test_literals_and_comments_both_readers_agree_on_pass_the_lexical_check(
    dialect: Dialects, sql: str
) -> None:
    tokens = Dialect.get_or_raise(dialect).tokenize(sql)
    assert _lexically_agrees(sql, tokens, dialect)


def test_a_migration_is_read_by_the_engines_lexer_too() -> None:
    # PostgreSQL runs the gate's rendering of a migration (`' x '` here), never its text, so
    # this reached nothing; it is refused all the same, as text the two read differently.
    decisions = _gate("postgres").check_migration(
        "CREATE TABLE app_b (y text DEFAULT $1)$ x $1)$);"
    )
    assert decisions == [Deny(capability="db", reason=DenyReason.STATEMENT_NOT_PERMITTED)]
    ok = _gate("postgres").check_migration("CREATE TABLE app_a (x text DEFAULT $$a;b$$);")
    assert ok and all(isinstance(d, Allow) for d in ok)


# -- the engine scanners, against what the engines document ------------------------------------


@pytest.mark.parametrize(
    ("dialect", "sql", "literals"),
    [
        # E'…' continues with backslash escapes after a newline; a plain string does not.
        ("postgres", "E'a'\n'\\'' x", ["E'a'", "'\\''"]),
        ("postgres", "'a'\n'\\' x", ["'a'", "'\\'"]),
        ("postgres", "'a' 'b'", ["'a'", "'b'"]),
        ("postgres", "$a$ $b$ $a$", ["$a$ $b$ $a$"]),
        ("postgres", "$a$x$$a$", ["$a$x$$a$"]),
        ("postgres", "x$a$ $b$y$b$", ["$b$y$b$"]),
        ("postgres", 'U&"a" N\'b\' "c""d"', ['U&"a"', "N'b'", '"c""d"']),
        ("sqlite", "[a]] `b``c` x'00' 'd' $e('f')", ["[a]", "`b``c`", "x'00'", "'d'"]),
        ("sqlite", "/* a /* b */ 'c'", ["'c'"]),
    ],
)
def test_the_engine_scanner_finds_the_engines_literals(
    dialect: Dialects, sql: str, literals: list[str]
) -> None:
    found = _engine_lexemes(sql, dialect)
    assert found is not None
    assert [sql[start:end] for start, end in found[0]] == literals


@pytest.mark.parametrize(
    ("dialect", "sql"),
    [
        ("postgres", "/* /* */"),
        ("postgres", "$a$ x $b$"),
        ("postgres", "E'\\'"),
        ("sqlite", "'a"),
        ("sqlite", "$a(x y)"),
        ("sqlite", "@"),
    ],
)
def test_text_the_engine_refuses_to_read_has_no_lexemes(dialect: Dialects, sql: str) -> None:
    assert _engine_lexemes(sql, dialect) is None


# -- a property: SQLite as the oracle -----------------------------------------------------------

# Pieces that open, close or escape a literal, a comment or a parameter in one reader or the
# other, around a read of an unprefixed table.
_PIECES = [
    "'", '"', "`", "[", "]", "$", "$a$", "$$", "@a(", "$a(", ":a::b", ")", "/*", "*/", "*/*",
    "--", "\n", "\r", "\v", "\u00a0", "\\", "x'", "''", "?1", " ", ",", "(", "1",
]  # fmt: skip
_HIDDEN = ", (SELECT secret FROM users) AS h"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    before=st.lists(st.sampled_from(_PIECES), max_size=5),
    after=st.lists(st.sampled_from(_PIECES), max_size=5),
)
def test_whatever_the_sqlite_gate_allows_sqlite_runs_inside_the_prefix(
    before: list[str], after: list[str]
) -> None:
    sql = f"SELECT 1 AS c {''.join(before)}{_HIDDEN}{''.join(after)}\n FROM billing_x"
    if isinstance(SqlGate("billing_", cache_size=0).check_query(sql), Allow):
        assert violations(sql) == []


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([*_PIECES, "a", "E'", "U&'", "N'", "B'"]), max_size=12))
def test_the_check_never_raises_and_agrees_with_itself(pieces: list[str]) -> None:
    sql = "".join(pieces)
    for dialect in ("sqlite", "postgres"):
        try:
            tokens = Dialect.get_or_raise(dialect).tokenize(sql)
        except Exception:  # sqlglot refuses the text: so does the gate
            continue
        assert _lexically_agrees(sql, tokens, dialect) in (True, False)


# -- PostgreSQL: functions whose one call outlasts the statement timeout ---------------------


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT lpad('x', 268000000)",
        "SELECT rpad(x, 268000000, 'ab') FROM app_t",
        'SELECT "lpad"(x, %s) FROM app_t',
        "SELECT LPAD(x, 10) FROM app_t",
    ],
)
def test_postgres_refuses_lpad_and_rpad(sql: str) -> None:
    # A length of 268,000,000 allocates 1 GB and fills it in one loop that no statement
    # timeout interrupts (3.5 s past a 100 ms timeout on PostgreSQL 15, and as much again for
    # each further call in the expression), like `format`, refused for the same reason.
    _refused("postgres", sql)


# -- what the gate lets into the host's log ---------------------------------------------------


@pytest.mark.parametrize(
    ("dialect", "sql"),
    [
        ("sqlite", "SELECT a -> '$[plugin-text-in-a-json-path' FROM app_t"),
        ("postgres", "SET ROLE plugin_text_in_a_command"),
        ("postgres", "DO $$ plugin text in a command $$"),
    ],
)
def test_sqlglot_logs_nothing_of_the_plugins_text_while_the_gate_decides(
    dialect: Dialects, sql: str, caplog: pytest.LogCaptureFixture
) -> None:
    # sqlglot warned, quoting the text, on the host's `sqlglot` logger: unredacted, and as
    # often as a plugin sent a new statement.
    gate = _gate(dialect)
    with caplog.at_level(logging.DEBUG):
        gate.check_query(sql)
        gate.check_migration(sql)
    assert not [r for r in caplog.records if "plugin" in r.getMessage()]


def test_sqlglot_still_logs_for_the_host_outside_the_gate(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import sqlglot

    with caplog.at_level(logging.WARNING, logger="sqlglot"):
        sqlglot.parse_one("SET ROLE host_text", read="postgres")
    assert any("host_text" in r.getMessage() for r in caplog.records)
