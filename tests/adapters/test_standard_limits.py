"""open_standard_adapters gives the adapters it builds the host's limits (`fs_limits`,
`sqlite_limits`), every one of them, and the adapters' own defaults otherwise."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from suaveplan_sandbox.adapters import (
    BeneathRootFs,
    FsLimits,
    SqliteDb,
    SqliteLimits,
    StandardAdapters,
    open_standard_adapters,
)
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import PermissionPolicy

BLOCK = 4096
MANIFEST: dict[str, Any] = {
    "name": "lim",
    "permissions": {"fs": ["rw:./uploads/*"]},
    "database": {"tablePrefix": "lim_", "migrations": "migrations"},
}
_ROWS = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < {n})"


def _root(tmp_path: Path) -> Path:
    root = tmp_path / "plugin"
    (root / "uploads").mkdir(parents=True)
    (root / "uploads" / "a.txt").write_bytes(b"hello")
    (root / "uploads" / "b.txt").write_bytes(b"")
    (root / "migrations").mkdir()
    (root / "migrations" / "001.sql").write_text("CREATE TABLE lim_t (x INTEGER, b BLOB);")
    return root  # three files: three blocks


async def _open(tmp_path: Path, **limits: Any) -> StandardAdapters:
    policy = PermissionPolicy.from_manifest(MANIFEST, root=_root(tmp_path))
    return await open_standard_adapters(policy, data_dir=tmp_path / "data", **limits)


async def _code(coro: Any) -> tuple[str, object]:
    with pytest.raises(SuaveplanError) as info:
        await coro
    return info.value.code, info.value.details.get("reason")


async def test_fs_limits_reach_the_files_adapter(tmp_path: Path) -> None:
    limits = FsLimits(max_read_bytes=4, max_write_bytes=2 * BLOCK, max_list_entries=1)
    async with await _open(tmp_path, fs_limits=limits) as host:
        fs = host.adapters.fs
        assert isinstance(fs, BeneathRootFs)
        read = fs.read_bytes("uploads/a.txt", max_bytes=100)
        assert (await _code(read))[0] == "SAND_FS_TOO_LARGE"
        assert (await _code(fs.list_dir("uploads")))[0] == "SAND_FS_TOO_LARGE"
        too_big = fs.write_bytes("uploads/c.txt", b"x" * (2 * BLOCK + 1))
        assert (await _code(too_big))[0] == "SAND_FS_TOO_LARGE"


async def test_the_fs_quota_reaches_the_files_adapter(tmp_path: Path) -> None:
    async with await _open(tmp_path, fs_limits=FsLimits(max_root_bytes=5 * BLOCK)) as host:
        fs = host.adapters.fs
        assert isinstance(fs, BeneathRootFs)
        await fs.write_bytes("uploads/c.txt", b"x" * (2 * BLOCK))  # five blocks: full
        assert await _code(fs.write_bytes("uploads/d.txt", b"")) == (
            "SAND_FS_TOO_LARGE",
            "quota-exceeded",
        )


async def test_sqlite_limits_reach_the_database_adapter(tmp_path: Path) -> None:
    limits = SqliteLimits(
        statement_timeout=0.2,
        max_result_rows=2,
        max_result_bytes=100,
        max_result_columns=2,
        max_value_bytes=1000,
        max_db_bytes=64 * 1024,
        max_statement_write_bytes=1 << 20,
    )
    async with await _open(tmp_path, sqlite_limits=limits) as host:
        db = host.adapters.db
        assert isinstance(db, SqliteDb)
        runaway = _ROWS.format(n=10**12) + " SELECT count(*) FROM c"
        with pytest.raises(SuaveplanError) as info:
            await db.query(runaway, [])
        assert info.value.details == {"reason": "statement-timeout", "limit_ms": 200}
        rows = _ROWS.format(n=3) + " SELECT x FROM c"
        assert await _code(db.query(rows, [])) == ("SAND_DB_ERROR", "result-too-large")
        wide = "SELECT 'a', 'b', 'c'"
        assert (await _code(db.query(wide, [])))[0] == "SAND_DB_ERROR"
        bulky = "SELECT randomblob(200)"
        assert await _code(db.query(bulky, [])) == ("SAND_DB_ERROR", "result-too-large")
        value = "SELECT length(zeroblob(1001))"
        assert await _code(db.query(value, [])) == ("SAND_DB_ERROR", "value-too-large")
        fill = _ROWS.format(n=100) + " INSERT INTO lim_t (x, b) SELECT x, randomblob(900) FROM c"
        assert await _code(db.query(fill, [])) == ("SAND_DB_ERROR", "database-full")
        spill = (
            _ROWS.format(n=5000) + " SELECT x FROM c ORDER BY randomblob(900) LIMIT -1 OFFSET 4999"
        )
        assert await _code(db.query(spill, [])) == ("SAND_DB_ERROR", "statement-write-limit")


async def test_without_limits_the_adapters_keep_their_own_defaults(tmp_path: Path) -> None:
    async with await _open(tmp_path) as host:
        fs = host.adapters.fs
        assert isinstance(fs, BeneathRootFs)
        defaults = BeneathRootFs(tmp_path)
        try:
            for name in ("max_read_bytes", "max_write_bytes", "max_list_entries", "max_root_bytes"):
                assert getattr(fs, name) == getattr(defaults, name) == getattr(FsLimits(), name)
        finally:
            defaults.close()
    sqlite_defaults = SqliteDb.__init__.__kwdefaults__
    assert sqlite_defaults is not None
    for field in dataclasses.fields(SqliteLimits):
        assert getattr(SqliteLimits(), field.name) == sqlite_defaults[field.name], field.name


@pytest.mark.parametrize("make", [FsLimits, SqliteLimits])
def test_limits_refuse_values_that_are_not_positive_numbers(make: Any) -> None:
    for field in dataclasses.fields(make):
        for bad in (0, -1, True, float("nan")):
            with pytest.raises(SuaveplanError) as info:
                make(**{field.name: bad})
            assert info.value.code == "SAND_INVALID_ARGUMENT", (field.name, bad)
    assert FsLimits(max_root_bytes=None).max_root_bytes is None
    with pytest.raises(SuaveplanError):
        SqliteLimits(max_db_bytes=1.5)  # type: ignore[arg-type]
