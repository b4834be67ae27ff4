"""A provisioned PostgreSQL plugin for the adapter red-team tests, and a refused query's error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from suaveplan_sandbox.adapters._postgres import (
    PostgresDb,
    apply_postgres_migrations,
    provision_postgres_plugin,
)
from suaveplan_sandbox.adapters._sqlite import SqliteDb
from suaveplan_sandbox.errors import SuaveplanError


async def provisioned_plugin(admin: str, tmp_path: Path, plugin: str) -> str:
    """A provisioned plugin (prefix `r_`) with `r_t (x int)` holding one row: its conninfo."""
    conninfo = await provision_postgres_plugin(admin, plugin, "r_")
    folder = tmp_path / plugin
    folder.mkdir()
    (folder / "001.sql").write_text("CREATE TABLE r_t (x int);")
    await apply_postgres_migrations(admin, folder, plugin=plugin, prefix="r_")
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
        await conn.execute("DELETE FROM r_t")  # a plugin name may come back (parametrize)
        await conn.execute("INSERT INTO r_t VALUES (1)")
    return conninfo


async def refusal(db: PostgresDb | SqliteDb, sql: str, params: list[Any]) -> SuaveplanError:
    """The coded error `db.query(sql, params)` raises (the test fails if it raises none)."""
    with pytest.raises(SuaveplanError) as info:
        await db.query(sql, params)
    return info.value
