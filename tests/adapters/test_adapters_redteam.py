"""Red-team findings against the host adapters: each test is a bypass that was once possible."""

from __future__ import annotations

import socket
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from suaveplan_sandbox.adapters._fetch import HttpxFetch, Resolver
from suaveplan_sandbox.adapters._sqlite import SqliteDb
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions._decision import Allow
from suaveplan_sandbox.permissions._fetch_rules import FetchRuleSet

# -- fetch.connect: the name dialled is the name the checker judged ------------------------


@pytest.fixture
def listener() -> Iterator[int]:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        yield sock.getsockname()[1]


def _recording_resolver(asked: list[str], answer: str = "192.0.2.1") -> Resolver:
    async def resolve(host: str, port: int) -> list[str]:
        asked.append(host)
        return [answer]

    return resolve


async def test_connect_resolves_the_idna_name_the_checker_approved_not_the_plugins_spelling(
    listener: int,
) -> None:
    # The checker reads `straße.de` per WHATWG (UTS #46, non-transitional): xn--strae-oqa.de.
    # getaddrinfo, handed the plugin's text, encodes it with Python's IDNA 2003 codec:
    # strasse.de, another domain that no rule grants.
    rules = FetchRuleSet(["straße.de"])
    decision = rules.check_host("straße.de", 443)
    assert decision == Allow(rule="straße.de", target="xn--strae-oqa.de:443")
    assert rules.check_host("strasse.de", 443).allowed is False
    assert "straße.de".encode("idna") == b"strasse.de"  # what the default resolver would ask

    # Only loopback is ever dialled: the resolver answers with the test's own listener.
    asked: list[str] = []
    fetch = HttpxFetch(resolver=_recording_resolver(asked, "127.0.0.1"), allow_private=True)
    try:
        sock = await fetch.connect("straße.de", listener, rule="straße.de")
        sock.close()
    finally:
        await fetch.aclose()
    assert asked == ["xn--strae-oqa.de"]


@pytest.mark.parametrize("spelling", ["127.1", "0x7f.0.0.1", "2130706433", "127.0.0.1."])
async def test_connect_to_another_spelling_of_an_ip_rule_dials_that_ip(
    spelling: str, listener: int
) -> None:
    # `check_host` grants these under the rule `127.0.0.1`; the adapter must see the same
    # literal (not a name for the resolver, whose loopback answer is then refused).
    assert FetchRuleSet(["127.0.0.1"]).check_host(spelling, listener).allowed
    asked: list[str] = []
    fetch = HttpxFetch(resolver=_recording_resolver(asked, "127.0.0.1"))
    try:
        sock = await fetch.connect(spelling, listener, rule="127.0.0.1")
        assert sock.getpeername()[:2] == ("127.0.0.1", listener)
        sock.close()
    finally:
        await fetch.aclose()
    assert asked == []  # an IP literal is never handed to a resolver


async def test_connect_refuses_a_host_the_checker_could_not_have_approved() -> None:
    fetch = HttpxFetch(resolver=_recording_resolver([]))
    try:
        for host in ("a b.test", "a/b.test", "", "user@a.test"):
            with pytest.raises(SuaveplanError) as info:
                await fetch.connect(host, 443, rule="a.test")
            assert info.value.code == "SAND_FETCH_FAILED"
    finally:
        await fetch.aclose()


# -- SQLite: the authorizer never treats SQLite's own tables as the plugin's --------------


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT name, sql FROM sqlite_master",
        "SELECT * FROM sqlite_schema",
        "SELECT * FROM sqlite_temp_master",
        "SELECT * FROM sqlite_sequence",
        "DELETE FROM sqlite_sequence",
    ],
)
async def test_a_table_prefix_of_sqlite_does_not_open_sqlites_own_tables_to_the_engine(
    tmp_path: Path, sql: str
) -> None:
    # `sqlite_` is a valid manifest tablePrefix, but SQLite reserves the name: no plugin table
    # can carry it, and the only tables it would grant are SQLite's schema and bookkeeping.
    # The gate refuses them by name; the authorizer (the engine-side rule, called here past
    # the gate as `_execute` is) must too.
    with sqlite3.connect(tmp_path / "p.db") as setup:  # the host's own table, as a migration
        setup.execute("CREATE TABLE counter (id INTEGER PRIMARY KEY AUTOINCREMENT, x)")
        setup.execute("INSERT INTO counter (x) VALUES (1)")
    setup.close()
    db = SqliteDb(tmp_path / "p.db", plugin_prefix="sqlite_")
    try:
        with pytest.raises(SuaveplanError) as info:
            await db._execute(sql, [])
        assert info.value.code == "SAND_DB_ERROR"
    finally:
        db.close()


# -- SQLite: printf's `%c` repeat count is one engine step no deadline reaches -------------


@pytest.mark.parametrize(
    ("sql", "params"),
    [
        ("SELECT printf('%.2000000000c', 'x')", []),
        ("SELECT format('%.2000000000c', 'x')", []),
        ("SELECT printf('%.*c', ?, 'x')", [2_000_000_000]),
        ("SELECT printf('%.*c', ?, 'x')", ["2000000000"]),
        ("SELECT printf('%5.*c', ?, 'x')", [-2_000_000_000]),
        ("SELECT printf('%.600000c%.600000c', 'x', 'y')", []),
        ("SELECT printf('%.' || ? || 'c', 'x')", ["9" * 5000]),
        ("SELECT printf('%.*c', ?, 'x')", ["1e12"]),
        ("SELECT printf('%.*c', ?, 'x')", [1e300]),
    ],
)
async def test_a_printf_repeat_count_past_the_value_limit_is_refused_before_it_runs(
    tmp_path: Path, sql: str, params: list[object]
) -> None:
    # SQLite (3.40 here) appends a `%c` with precision N one character at a time, N times,
    # even once the result is past the length limit: about four seconds per 10^9, inside one
    # step that neither the progress handler nor `interrupt()` can stop, so a statement of
    # many such conversions held the worker thread for hours past `statement_timeout`.
    db = SqliteDb(tmp_path / "p.db", plugin_prefix="pfx_", statement_timeout=1.0)
    try:
        started = time.monotonic()
        with pytest.raises(SuaveplanError) as info:
            await db.query(sql, params)  # type: ignore[arg-type]
        assert time.monotonic() - started < 0.5
        assert info.value.code == "SAND_DB_ERROR"
        assert info.value.details.get("reason") == "value-too-large"
    finally:
        db.close()


@pytest.mark.parametrize(
    ("sql", "params", "expected"),
    [
        ("SELECT printf('%.3c|%5.2c|%-3c|', 'xyz', 'a', 'b')", [], "xxx|   aa|b  |"),
        ("SELECT printf('%.*c%s', ?, 'ab', ?)", [4, "!"], "aaaa!"),
        ("SELECT format('%d %5.1f %q %%', 3, 2.25, 'it''s')", [], "3   2.3 it''s %"),
        ("SELECT printf('%s', NULL) IS NULL, printf() IS NULL", [], 0),
        ("SELECT printf(?, ?, ?)", ["%x-%s", 255, b"hi"], "ff-hi"),
        ("SELECT printf('%.1000c', 'z') = printf('%.1000c', 'z')", [], 1),
    ],
)
async def test_printf_within_the_limit_keeps_sqlites_own_results(
    tmp_path: Path, sql: str, params: list[object], expected: object
) -> None:
    db = SqliteDb(tmp_path / "p.db", plugin_prefix="pfx_")
    try:
        result = await db.query(sql, params)  # type: ignore[arg-type]
        assert result.rows[0][0] == expected
    finally:
        db.close()
