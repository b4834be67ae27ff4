"""A plugin's migration text that the gate and SQLite would read differently.

A NUL is an identifier character to sqlglot and the end of the text to C-string code:
`sqlite3.complete_statement`, which splits a migration into statements, raised a bare
`ValueError` on it. The gate passed such a file, so `apply_migrations` had already sent its
`BEGIN`: the error escaped untranslated and left the connection inside a transaction that
every later plugin statement then ran in, never committed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from suaveplan_sandbox.adapters._sqlite import SqliteDb, apply_migrations
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions._decision import Deny, DenyReason
from suaveplan_sandbox.permissions._sql_gate import SqlGate


@pytest.mark.parametrize(
    "sql",
    [
        "CREATE TABLE app_x (a);\x00",
        "CREATE TABLE app_x (a\x00b);",
        "CREATE TABLE app_x (a);\x00CREATE TABLE users (a);",
    ],
)
@pytest.mark.parametrize("dialect", ["sqlite", "postgres"])
def test_the_gate_refuses_a_migration_holding_a_nul(sql: str, dialect: str) -> None:
    decisions = SqlGate("app_", dialect=dialect).check_migration(sql)  # type: ignore[arg-type]
    assert decisions
    assert all(isinstance(d, Deny) for d in decisions)
    assert {d.reason for d in decisions if isinstance(d, Deny)} == {
        DenyReason.STATEMENT_NOT_PERMITTED
    }


@pytest.mark.parametrize("text", ["CREATE TABLE app_x (a\x00b);", "CREATE TABLE app_x (a);\x00"])
async def test_a_migration_holding_a_nul_is_a_coded_failure_and_leaves_no_transaction(
    tmp_path: Path, text: str
) -> None:
    mig = tmp_path / "migrations"
    mig.mkdir()
    (mig / "001.sql").write_text(text)
    db = SqliteDb(tmp_path / "p.db", plugin_prefix="app_")
    try:
        with pytest.raises(SuaveplanError) as info:
            await apply_migrations(db, mig, plugin="p")
        assert info.value.code == "SAND_DB_MIGRATION_FAILED"
        (mig / "001.sql").write_text("CREATE TABLE app_x (a);")
        assert await apply_migrations(db, mig, plugin="p") == ["001.sql"]
        await db.query("INSERT INTO app_x (a) VALUES (1)", [])
    finally:
        db.close()
    reopened = SqliteDb(tmp_path / "p.db", plugin_prefix="app_")
    try:
        assert (await reopened.query("SELECT a FROM app_x", [])).rows == ((1,),)
    finally:
        reopened.close()
