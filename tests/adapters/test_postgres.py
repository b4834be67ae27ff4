"""PostgresDb against a real PostgreSQL: the gate, and a role that cannot cross plugins."""

from __future__ import annotations

import psycopg
import pytest

from suaveplan_sandbox.adapters._postgres import PostgresDb, provision_postgres_plugin
from suaveplan_sandbox.errors import SuaveplanError


async def test_a_plugin_role_cannot_read_another_plugins_table(postgres_admin: str) -> None:
    alpha = await provision_postgres_plugin(postgres_admin, "alpha", "a_")
    beta = await provision_postgres_plugin(postgres_admin, "beta", "b_")
    async with await psycopg.AsyncConnection.connect(beta, autocommit=True) as conn:
        await conn.execute("CREATE TABLE IF NOT EXISTS b_secret (v text)")
        await conn.execute("INSERT INTO b_secret VALUES ('beta-only')")
    async with await psycopg.AsyncConnection.connect(alpha, autocommit=True) as conn:
        await conn.execute("CREATE TABLE IF NOT EXISTS a_items (v text)")
        for raw in ("SELECT * FROM suaveplan_beta.b_secret", "SELECT * FROM b_secret"):
            with pytest.raises(psycopg.Error):
                await conn.execute(raw)
    db = PostgresDb(alpha, plugin="alpha", prefix="a_")
    await db.query("INSERT INTO a_items (v) VALUES (%s)", ["x'); DROP TABLE a_items; --"])
    result = await db.query("SELECT v FROM a_items", [])
    assert result.rows == (("x'); DROP TABLE a_items; --",),)
    with pytest.raises(SuaveplanError) as info:
        await db.query("SELECT * FROM b_secret", [])
    assert info.value.code == "SAND_PERM_DENIED"
    with pytest.raises(SuaveplanError) as info:
        await db._execute("SELECT * FROM suaveplan_beta.b_secret", [])
    assert info.value.code == "SAND_DB_ERROR"
    await db.aclose()
