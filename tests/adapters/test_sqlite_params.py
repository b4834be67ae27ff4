"""A list of values binds to a SQLite statement by parameter index, for every placeholder
style, on every supported Python, without the sequence-with-named-placeholders warning
(3.12, 3.13) that Python 3.14 turns into an error."""

from __future__ import annotations

import sqlite3
import sys
import warnings
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from suaveplan_sandbox.adapters._sqlite import SqliteDb, apply_migrations
from suaveplan_sandbox.adapters._sqlite_params import ParameterNames
from suaveplan_sandbox.errors import SuaveplanError

pytestmark = pytest.mark.filterwarnings("error")


@pytest.fixture
async def db(tmp_path: Path) -> object:
    database = SqliteDb(tmp_path / "host.db", plugin_prefix="p_")
    mig = tmp_path / "migrations"
    mig.mkdir()
    (mig / "001.sql").write_text("CREATE TABLE p_t (a, b, c);")
    await apply_migrations(database, mig, plugin="p", version="1.0.0")
    yield database
    database.close()


class _Recording(sqlite3.Connection):
    """A connection that records each statement text it is asked to run."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[str] = []

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        self.seen.append(sql)
        return super().execute(sql, *args)


@pytest.fixture
def conn() -> Iterator[_Recording]:
    connection = sqlite3.connect(":memory:", factory=_Recording)
    yield connection
    connection.close()


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SELECT ?, ?, ?", (1, 2, 3)),
        ("SELECT ?1, ?2, ?3", (1, 2, 3)),
        ("SELECT ?3, ?1, ?2", (3, 1, 2)),
        ("SELECT :a, :b, :c", (1, 2, 3)),
        ("SELECT :c, :b, :a", (1, 2, 3)),  # by index: the first named is parameter 1
        ("SELECT @a, $b, :c", (1, 2, 3)),
        ("SELECT :a, :b, :a, :c", (1, 2, 1, 3)),  # one name, one parameter
        ("SELECT ?2, :x, ?1", (2, 3, 1)),  # :x takes the next index after the largest
        ("SELECT ':a', ?, ?, ?", (":a", 1, 2, 3)),  # a colon in a string literal
    ],
)
async def test_each_placeholder_style_binds_by_index_without_a_warning(
    db: SqliteDb, sql: str, expected: tuple[object, ...]
) -> None:
    await db.query("INSERT INTO p_t (a, b, c) VALUES (1, 2, 3)", [])
    result = await db.query(sql + " FROM p_t", [1, 2, 3])
    assert result.rows == (expected,)


async def test_named_parameters_write_the_values_at_their_indexes(db: SqliteDb) -> None:
    await db.query("INSERT INTO p_t (a, b, c) VALUES (:first, :second, $third)", ["x", "y", "z"])
    await db.query("UPDATE p_t SET c = @c WHERE a = @a", ["Z", "x"])
    result = await db.query("SELECT a, b, c FROM p_t WHERE b = :b", ["y"])
    assert result.rows == (("x", "y", "Z"),)


@pytest.mark.parametrize("values", [[1], [1, 2, 3]])
async def test_a_wrong_number_of_values_is_refused_before_anything_runs(
    db: SqliteDb, values: list[int]
) -> None:
    with pytest.raises(SuaveplanError) as info:
        await db.query("INSERT INTO p_t (a, b) VALUES (:a, :b)", values)
    assert info.value.code == "SAND_DB_ERROR"
    assert f"takes 2 parameter(s) and {len(values)} were given" in info.value.message
    assert (await db.query("SELECT count(*) FROM p_t", [])).rows == ((0,),)


async def test_parameters_differing_only_in_prefix_are_refused_before_anything_runs(
    db: SqliteDb,
) -> None:
    with pytest.raises(SuaveplanError) as info:
        await db.query("INSERT INTO p_t (a, b) VALUES (:a, @a)", [1, 2])
    assert info.value.code == "SAND_DB_ERROR"
    assert "prefix" in info.value.message
    assert (await db.query("SELECT count(*) FROM p_t", [])).rows == ((0,),)


async def test_named_parameters_in_a_statement_reading_a_cte(db: SqliteDb) -> None:
    # The CTE's name is no table: the authorizer refuses the first prepare (the probe's) and
    # the adapter prepares again with the CTE let through; the binding survives the retry.
    await db.query("INSERT INTO p_t (a, b, c) VALUES (1, 2, 3), (4, 5, 6)", [])
    result = await db.query(
        "WITH picked AS (SELECT a FROM p_t WHERE b = :b) SELECT a + :add FROM picked", [5, 10]
    )
    assert result.rows == ((14,),)


async def test_the_authorizer_still_refuses_a_statement_with_named_parameters(
    db: SqliteDb,
) -> None:
    # Past the gate, straight to the engine: the probe's prepare is refused as the
    # statement's own would be, and nothing is read.
    with pytest.raises(SuaveplanError) as info:
        await db._execute("SELECT name FROM sqlite_master WHERE name = :n", ["p_t"])
    assert info.value.code == "SAND_DB_ERROR"


def test_sqlite_is_asked_once_per_statement_text(conn: _Recording) -> None:
    names = ParameterNames()
    for _ in range(3):
        conn.execute("SELECT :a, :b", names.bindings(conn, "SELECT :a, :b", [1, 2])).close()
    assert conn.seen == ["EXPLAIN SELECT :a, :b"] + ["SELECT :a, :b"] * 3


def test_statements_without_a_named_parameter_are_not_probed(conn: _Recording) -> None:
    assert ParameterNames().bindings(conn, "SELECT ?, ?", [1, 2]) == (1, 2)
    assert conn.seen == []


def test_the_cache_keeps_the_latest_texts(conn: _Recording) -> None:
    names = ParameterNames(cache_size=2)
    for sql in ("SELECT :a", "SELECT :b", "SELECT :a", "SELECT :c", "SELECT :b"):
        names.bindings(conn, sql, [1])
    # :a is kept by its second use, :b is dropped when :c comes, so :b is asked again.
    assert [s.removeprefix("EXPLAIN ") for s in conn.seen] == [
        "SELECT :a",
        "SELECT :b",
        "SELECT :c",
        "SELECT :b",
    ]


def test_a_probe_runs_nothing(conn: _Recording) -> None:
    conn.execute("CREATE TABLE t (a)")
    assert ParameterNames().bindings(conn, "INSERT INTO t VALUES (:a)", [1]) == {"a": 1}
    assert conn.execute("SELECT count(*) FROM t").fetchone() == (0,)


async def test_a_nameless_placeholder_mixed_with_named_ones_binds_as_python_does(
    db: SqliteDb,
) -> None:
    # It cannot be bound from a mapping (the `?` has no name), so it keeps the sequence:
    # 3.11 binds it by index; 3.12 and 3.13 warn, which a host running with warnings as
    # errors (as this test does) gets as SAND_DB_ERROR, never as an adapter failure; Python
    # 3.14 refuses it (SAND_DB_ERROR too). Nothing runs.
    await db.query("INSERT INTO p_t (a) VALUES (1)", [])
    if sys.version_info < (3, 12):
        assert (await db.query("SELECT :x, ? FROM p_t", [1, 2])).rows == ((1, 2),)
        return
    with pytest.raises(SuaveplanError) as info:
        await db.query("INSERT INTO p_t (a, b) VALUES (:x, ?)", [1, 2])
    assert info.value.code == "SAND_DB_ERROR"
    assert "mixes nameless" in info.value.message
    assert (await db.query("SELECT count(*) FROM p_t", [])).rows == ((1,),)


# -- against SQLite's own binding of a sequence -----------------------------------------------

_PLACEHOLDERS = st.one_of(
    st.sampled_from(["?"]),
    st.integers(1, 5).map(lambda n: f"?{n}"),
    st.tuples(st.sampled_from(":@$"), st.sampled_from(["a", "b", "c"])).map("".join),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_PLACEHOLDERS, min_size=1, max_size=6), st.integers(0, 6))
def test_binding_matches_sqlite_binding_the_sequence_by_index(
    placeholders: list[str], count: int
) -> None:
    """Whatever the placeholders, the mapping binds what SQLite binds from the sequence by
    index (the meaning up to Python 3.13), or refuses where that would fail or bind two
    parameters `sqlite3` cannot tell apart, and never binds anything else."""
    sql = "SELECT " + ", ".join(placeholders)
    values = [100 + i for i in range(count)]
    with closing(sqlite3.connect(":memory:")) as reference, warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            expected: tuple[object, ...] | None = reference.execute(sql, values).fetchone()
        except sqlite3.ProgrammingError:
            expected = None
    with closing(sqlite3.connect(":memory:")) as conn:
        try:
            bindings = ParameterNames().bindings(conn, sql, values)
        except SuaveplanError as exc:
            assert exc.code == "SAND_DB_ERROR"
            stripped = {p[1:] for p in placeholders if p != "?"}
            named = {p for p in placeholders if p != "?"}
            assert expected is None or len(stripped) < len(named)
            return
        if isinstance(bindings, tuple):
            # Only a statement no mapping can bind: a nameless `?`, or an index no
            # placeholder names (`?3` with no `?1`). It binds as it always has.
            assert bindings == tuple(values)
            assert "?" in placeholders or _has_unnamed_index(placeholders)
            return
        assert conn.execute(sql, bindings).fetchone() == expected


def _has_unnamed_index(placeholders: list[str]) -> bool:
    """SQLite's numbering, for placeholders without a nameless `?`: `?N` is index N, a new
    name the next index after the largest so far, a repeated name its first index."""
    top, named, seen = 0, set(), set()
    for p in placeholders:
        if p[0] == "?":
            index = int(p[1:])
        elif p in seen:
            continue
        else:
            index = top + 1
            seen.add(p)
        named.add(index)
        top = max(top, index)
    return named != set(range(1, top + 1))


@pytest.mark.parametrize(
    "value",
    [
        2**63,  # msgpack carries unsigned 64-bit ints; SQLite's INTEGER is signed
        2**64 - 1,
        -(2**63) - 1,
        "\ud800",  # a lone surrogate has no UTF-8 form
    ],
)
@pytest.mark.parametrize("sql", ["SELECT ?", "INSERT INTO p_t (a) VALUES (?) RETURNING a"])
async def test_a_value_sqlite_cannot_bind_is_a_coded_refusal_and_writes_nothing(
    db: SqliteDb, value: int | str, sql: str
) -> None:
    # It raised OverflowError / UnicodeEncodeError, past the adapter's translation.
    with pytest.raises(SuaveplanError) as info:
        await db.query(sql, [value])
    assert info.value.code == "SAND_DB_ERROR"
    assert info.value.details == {"reason": "parameter-invalid"}
    assert (await db.query("SELECT count(*) FROM p_t", [])).rows == ((0,),)
    await db.query("INSERT INTO p_t (a) VALUES (?) RETURNING a", [2**63 - 1])
