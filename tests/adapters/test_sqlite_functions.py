"""The linear `replace`, `instr`, `trim`, `ltrim` and `rtrim` answer as SQLite's own do."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import closing

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from suaveplan_sandbox.adapters._sqlite_functions import LinearTextFunctions, SqliteValue

_CALLS = {
    "replace": "replace(?, ?, ?)",
    "instr": "instr(?, ?)",
    "trim": "trim(?, ?)",
    "ltrim": "ltrim(?, ?)",
    "rtrim": "rtrim(?, ?)",
}
_ALPHABET = st.sampled_from(["a", "b", "é", "\x00", " ", "ß", "😀", "1", "."])
_TEXT = st.text(_ALPHABET, max_size=8)
_VALUES: st.SearchStrategy[SqliteValue] = st.one_of(
    st.none(),
    _TEXT,
    _TEXT.map(lambda t: t.encode("utf-8")),  # a BLOB that is UTF-8
    st.binary(max_size=6),  # most are not
    st.integers(-1000, 1000),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
)


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[sqlite3.Connection, sqlite3.Connection]]:
    """(SQLite's own functions, the overrides)."""
    functions = LinearTextFunctions(max_value_bytes=1024 * 1024)
    with closing(sqlite3.connect(":memory:")) as own, closing(sqlite3.connect(":memory:")) as ours:
        functions.install(ours)
        yield own, ours
    functions.close()


def _answer(
    conn: sqlite3.Connection, call: str, args: tuple[SqliteValue, ...]
) -> tuple[str, bytes | None] | str:
    """(type, raw bytes) of the call's result, or the error's class when it fails."""
    try:
        row = conn.execute(f"SELECT typeof({call}), CAST({call} AS BLOB)", args + args).fetchone()
    except sqlite3.Error:
        return "error"
    return row[0], row[1]


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(sorted(_CALLS)), st.lists(_VALUES, min_size=3, max_size=3))
def test_each_override_answers_as_sqlite_does(
    pair: tuple[sqlite3.Connection, sqlite3.Connection], name: str, values: list[SqliteValue]
) -> None:
    own, ours = pair
    call = _CALLS[name]
    args = tuple(values[: call.count("?")])
    expected, got = _answer(own, call, args), _answer(ours, call, args)
    if got == "error" and expected != "error":
        # The one difference: a TEXT result that is not UTF-8 (from a BLOB that is not),
        # which Python cannot read back from SQLite's own function.
        assert isinstance(expected, tuple)
        kind, raw = expected
        assert kind == "text"
        assert raw is not None
        with pytest.raises(UnicodeDecodeError):
            raw.decode("utf-8")
        return
    assert got == expected


@pytest.mark.parametrize(
    ("call", "args", "expected"),
    [
        ("replace(?, ?, ?)", (5, "", "x"), (5,)),  # an empty pattern keeps X, type and all
        ("replace(?, ?, ?)", (2.5, "", None), (2.5,)),
        ("replace(?, ?, ?)", (b"ab", "", None), ("ab",)),  # a BLOB comes back as TEXT
        ("replace(?, ?, ?)", ("a\x00b", "\x00b", "c"), ("a\x00b",)),  # a pattern cut at NUL
        ("replace(?, ?, ?)", (5, b"\x00\xff", None), (5,)),  # …even one that is not UTF-8
        ("replace(?, ?, ?)", (1234, 3, 9), ("1294",)),
        ("instr(?, ?)", (b"\x00\xff\x01", b"\x01"), (3,)),  # two BLOBs: a byte offset
        ("instr(?, ?)", ("éa", "a"), (2,)),  # text: a character offset
        ("instr(?, ?)", ("abc", ""), (1,)),
        ("trim(?, ?)", ("xxaxx", "x\x00a"), ("a",)),  # the set ends at its first NUL
        ("rtrim(?, ?)", (1200, 0), ("12",)),
        ("ltrim(?, ?)", ("abc", None), (None,)),
    ],
)
def test_edge_cases_match_sqlite(
    pair: tuple[sqlite3.Connection, sqlite3.Connection],
    call: str,
    args: tuple[SqliteValue, ...],
    expected: tuple[object, ...],
) -> None:
    own, ours = pair
    assert own.execute(f"SELECT {call}", args).fetchone() == expected
    assert ours.execute(f"SELECT {call}", args).fetchone() == expected


def test_a_trim_set_of_many_characters_is_linear_too(
    pair: tuple[sqlite3.Connection, sqlite3.Connection],
) -> None:
    _, ours = pair
    chars = "".join(chr(c) for c in range(0x4E00, 0x4E00 + 20_000))
    text = chars * 4 + "end" + chars
    assert ours.execute("SELECT trim(?, ?)", (text, chars)).fetchone() == ("end",)
