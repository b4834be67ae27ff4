"""The engine-side rule (SQLite's authorizer) on which tables are the plugin's, as the gate has
it: `RESERVED_TABLE_PREFIXES` is the one list of reserved prefixes, and a plugin prefix that
covers a reserved one (`p` covers `pg_`) still grants none of its names; names fold as SQLite
folds them (ASCII only). Statements go through `_execute`, the engine path past the gate."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from suaveplan_sandbox.adapters._sqlite import SqliteDb
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions._table_names import RESERVED_TABLE_PREFIXES

# For each reserved prefix: a table under it the host can create, and a read of it.
_RESERVED_TABLES = {
    "pg_": ("CREATE TABLE pg_roles (rolname TEXT)", "SELECT * FROM pg_roles"),
    "sqlite_": (
        "CREATE TABLE counter (id INTEGER PRIMARY KEY AUTOINCREMENT, x)",
        "SELECT * FROM sqlite_sequence",
    ),
}


def test_every_reserved_prefix_has_a_case_here() -> None:
    assert set(_RESERVED_TABLES) == set(RESERVED_TABLE_PREFIXES)


@pytest.mark.parametrize("reserved", RESERVED_TABLE_PREFIXES)
@pytest.mark.parametrize("covering", [True, False])
async def test_the_authorizer_refuses_names_under_every_reserved_prefix(
    tmp_path: Path, reserved: str, covering: bool
) -> None:
    create, read = _RESERVED_TABLES[reserved]
    with sqlite3.connect(tmp_path / "p.db") as setup:
        setup.execute(create)
        setup.execute("CREATE TABLE counter2 (id INTEGER PRIMARY KEY AUTOINCREMENT, x)")
        setup.execute("INSERT INTO counter2 (x) VALUES (1)")
    setup.close()
    prefix = reserved[:1] if covering else reserved
    db = SqliteDb(tmp_path / "p.db", plugin_prefix=prefix)
    try:
        with pytest.raises(SuaveplanError) as info:
            await db._execute(read, [])
        assert info.value.code == "SAND_DB_ERROR"
    finally:
        db.close()


async def test_a_prefix_that_only_looks_alike_still_reads_its_tables(tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / "p.db") as setup:
        setup.execute("CREATE TABLE pgx_t (a)")
        setup.execute("INSERT INTO pgx_t VALUES (1)")
    setup.close()
    db = SqliteDb(tmp_path / "p.db", plugin_prefix="p")
    try:
        result = await db._execute("SELECT a FROM pgx_t", [])
        assert result.rows == ((1,),)
    finally:
        db.close()


async def test_a_table_whose_name_only_python_folds_onto_the_prefix_is_refused(
    tmp_path: Path,
) -> None:
    # SQLite compares names ASCII-case-insensitively: `\u212ab_host` (KELVIN SIGN) is no
    # `kb_` table, though `str.lower()` makes it `kb_host`.
    with sqlite3.connect(tmp_path / "p.db") as setup:
        setup.execute("CREATE TABLE \u212ab_host (a)")
        setup.execute("INSERT INTO \u212ab_host VALUES ('host data')")
        setup.execute("CREATE TABLE KB_mine (a)")
    setup.close()
    db = SqliteDb(tmp_path / "p.db", plugin_prefix="kb_")
    try:
        with pytest.raises(SuaveplanError) as info:
            await db._execute("SELECT a FROM \u212ab_host", [])
        assert info.value.code == "SAND_DB_ERROR"
        assert (await db._execute("SELECT a FROM kb_MINE", [])).rows == ()
    finally:
        db.close()
