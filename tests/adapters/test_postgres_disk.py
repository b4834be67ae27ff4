"""PostgreSQL and the host's disk: the plugin's runtime role runs under a `temp_file_limit` that
provisioning sets and the plugin cannot raise, the adapter reports what is in force, and a
statement past it (or a full disk) is a coded refusal."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from suaveplan_sandbox.adapters._postgres import (
    DEFAULT_TEMP_FILE_LIMIT_BYTES,
    PostgresDb,
    _disk_reason,
    apply_postgres_migrations,
    provision_postgres_plugin,
)
from suaveplan_sandbox.errors import SuaveplanError

# A window over a sort of ~300,000 hashes: ~20 MB to sort, past `work_mem` (4 MB), so it
# spills to temporary files; returns one row.
_BIG_SORT = "SELECT max(r) FROM (SELECT row_number() OVER (ORDER BY md5(v)) AS r FROM t_rows) AS s"
_SMALL_SORT = _BIG_SORT.replace("FROM t_rows", "FROM t_rows WHERE id <= 100")


async def _admin(admin: str, statement: sql.Composed | str) -> None:
    async with await psycopg.AsyncConnection.connect(admin, autocommit=True) as conn:
        await conn.execute(statement)


async def _plugin_with_rows(admin: str, tmp_path: Path, plugin: str, **provision: object) -> str:
    conninfo = await provision_postgres_plugin(admin, plugin, "t_", **provision)  # type: ignore[arg-type]
    folder = tmp_path / plugin
    folder.mkdir()
    (folder / "001.sql").write_text("CREATE TABLE t_rows (id int PRIMARY KEY, v text);")
    await apply_postgres_migrations(admin, folder, plugin=plugin, prefix="t_")
    await _admin(
        admin,
        sql.SQL(
            "INSERT INTO {} SELECT g, g::text FROM generate_series(1, 300000) AS g "
            "ON CONFLICT DO NOTHING"
        ).format(sql.Identifier(f"suaveplan_{plugin}", "t_rows")),
    )
    return conninfo


async def test_a_sort_past_the_roles_temp_file_limit_is_refused_with_the_reason(
    postgres_admin: str, tmp_path: Path
) -> None:
    conninfo = await _plugin_with_rows(
        postgres_admin, tmp_path, "spill", temp_file_limit_bytes=1 << 20
    )
    db = PostgresDb(conninfo, plugin="spill", prefix="t_")
    try:
        assert await db.temp_file_limit_bytes() == 1 << 20
        assert (await db.query(_SMALL_SORT, [])).rows == ((100,),)
        with pytest.raises(SuaveplanError) as info:
            await db.query(_BIG_SORT, [])
        assert info.value.code == "SAND_DB_ERROR"
        assert info.value.details == {"reason": "statement-write-limit"}
        assert (await db.query(_SMALL_SORT, [])).rows == ((100,),)  # the session goes on
    finally:
        await db.aclose()


async def test_the_same_sort_runs_under_the_default_limit(
    postgres_admin: str, tmp_path: Path
) -> None:
    conninfo = await _plugin_with_rows(postgres_admin, tmp_path, "roomy")
    db = PostgresDb(conninfo, plugin="roomy", prefix="t_")
    try:
        assert await db.temp_file_limit_bytes() == DEFAULT_TEMP_FILE_LIMIT_BYTES
        assert (await db.query(_BIG_SORT, [])).rows == ((300000,),)
    finally:
        await db.aclose()


async def test_the_plugin_cannot_raise_its_limit(postgres_admin: str) -> None:
    conninfo = await provision_postgres_plugin(
        postgres_admin, "raiser", "r_", temp_file_limit_bytes=1 << 20
    )
    # On a raw connection with its own credentials: a superuser-only setting.
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await conn.execute("SET temp_file_limit = '1TB'")
    db = PostgresDb(conninfo, plugin="raiser", prefix="r_")
    try:
        for statement in ("SET temp_file_limit = '1TB'", "RESET temp_file_limit"):
            with pytest.raises(SuaveplanError) as info:
                await db.query(statement, [])
            assert info.value.code == "SAND_PERM_DENIED"
        assert await db.temp_file_limit_bytes() == 1 << 20
    finally:
        await db.aclose()


async def test_none_leaves_the_roles_setting_to_the_dba(postgres_admin: str) -> None:
    fresh = await provision_postgres_plugin(
        postgres_admin, "unset", "u_", temp_file_limit_bytes=None
    )
    db = PostgresDb(fresh, plugin="unset", prefix="u_")
    try:
        assert await db.temp_file_limit_bytes() is None  # reported as unlimited
    finally:
        await db.aclose()
    await provision_postgres_plugin(postgres_admin, "kept", "k_", temp_file_limit_bytes=5 << 20)
    again = await provision_postgres_plugin(
        postgres_admin, "kept", "k_", temp_file_limit_bytes=None
    )
    db = PostgresDb(again, plugin="kept", prefix="k_")
    try:
        assert await db.temp_file_limit_bytes() == 5 << 20
    finally:
        await db.aclose()


async def test_an_admin_that_may_not_set_the_limit_gets_a_coded_error_and_no_roles(
    postgres_admin: str,
) -> None:
    await _admin(postgres_admin, "DROP ROLE IF EXISTS lesser_admin")
    await _admin(postgres_admin, "CREATE ROLE lesser_admin LOGIN CREATEROLE")
    await _admin(postgres_admin, "GRANT CREATE ON DATABASE postgres TO lesser_admin")
    params = conninfo_to_dict(postgres_admin)
    params["user"] = "lesser_admin"
    lesser = make_conninfo(**{k: str(v) for k, v in params.items() if v is not None})
    with pytest.raises(SuaveplanError) as info:
        await provision_postgres_plugin(lesser, "denied", "d_")
    assert info.value.code == "SAND_DB_ERROR"
    assert info.value.details == {"reason": "temp-file-limit-not-settable"}
    async with await psycopg.AsyncConnection.connect(postgres_admin) as conn:
        rows = await (
            await conn.execute(
                "SELECT rolname FROM pg_roles WHERE rolname LIKE 'suaveplan_denied%'"
            )
        ).fetchall()
    assert rows == []  # rolled back whole


@pytest.mark.parametrize("value", [0, -1, 1.5, True, 2**41 + 1])
async def test_the_limit_is_a_positive_int_of_at_most_2_tib(
    postgres_admin: str, value: object
) -> None:
    with pytest.raises(SuaveplanError) as info:
        await provision_postgres_plugin(
            postgres_admin,
            "badlimit",
            "b_",
            temp_file_limit_bytes=value,  # type: ignore[arg-type]
        )
    assert info.value.code == "SAND_INVALID_ARGUMENT"


def test_server_errors_about_disk_space_have_their_reasons() -> None:
    assert _disk_reason(psycopg.errors.ConfigurationLimitExceeded("x")) == "statement-write-limit"
    assert _disk_reason(psycopg.errors.DiskFull("x")) == "database-full"
    assert _disk_reason(psycopg.errors.UniqueViolation("x")) is None
