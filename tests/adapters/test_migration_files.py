"""A plugin's migrations folder is the plugin's own: a folder that is a symbolic link (to a host
directory full of SQL the host would otherwise run as the plugin's) is refused with
`SAND_DB_MIGRATION_FAILED`, reason `symlink`, like a linked file inside it."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from suaveplan_sandbox.adapters._migration_files import read_migration
from suaveplan_sandbox.adapters._sqlite import SqliteDb, apply_migrations
from suaveplan_sandbox.errors import SuaveplanError

HOST_SQL = "CREATE TABLE p_host (v TEXT); -- hunter2\n"  # in-prefix: it would run if followed


@pytest.fixture
def db(tmp_path: Path) -> Iterator[SqliteDb]:
    database = SqliteDb(tmp_path / "host.db", plugin_prefix="p_")
    yield database
    database.close()


def _host_folder(tmp_path: Path) -> Path:
    host = tmp_path / "host-sql"
    host.mkdir()
    (host / "001_init.sql").write_text(HOST_SQL)
    return host


def _tables(tmp_path: Path) -> set[str]:
    with sqlite3.connect(tmp_path / "host.db") as conn:
        return {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}


async def test_a_migrations_folder_linked_to_a_host_folder_is_refused_and_nothing_runs(
    db: SqliteDb, tmp_path: Path
) -> None:
    plugin = tmp_path / "plugin"
    plugin.mkdir()
    (plugin / "migrations").symlink_to(_host_folder(tmp_path), target_is_directory=True)
    with pytest.raises(SuaveplanError) as info:
        await apply_migrations(db, plugin / "migrations", plugin="p")
    assert info.value.code == "SAND_DB_MIGRATION_FAILED"
    assert info.value.details == {"migrations": "migrations", "reason": "symlink"}
    assert "hunter2" not in repr(info.value.to_wire())
    assert "p_host" not in _tables(tmp_path)


async def test_a_relative_link_inside_the_plugin_is_refused_too(
    db: SqliteDb, tmp_path: Path
) -> None:
    # Following none is the rule: a link that stays inside the plugin is refused as well.
    plugin = tmp_path / "plugin"
    (plugin / "sql").mkdir(parents=True)
    (plugin / "sql" / "001_init.sql").write_text("CREATE TABLE p_mine (v TEXT);\n")
    (plugin / "migrations").symlink_to("sql", target_is_directory=True)
    with pytest.raises(SuaveplanError) as info:
        await apply_migrations(db, plugin / "migrations", plugin="p")
    assert info.value.details == {"migrations": "migrations", "reason": "symlink"}


def test_a_file_read_through_a_linked_folder_is_refused(tmp_path: Path) -> None:
    linked = tmp_path / "migrations"
    linked.symlink_to(_host_folder(tmp_path), target_is_directory=True)
    with pytest.raises(SuaveplanError) as info:
        read_migration(linked / "001_init.sql")
    assert info.value.details == {"migrations": "migrations", "reason": "symlink"}


def test_a_folder_swapped_for_a_link_after_listing_is_refused(tmp_path: Path) -> None:
    # The loader lists the folder, then reads each file: the folder is opened again, without
    # following a link, for every read, so a swap in between reads nothing of the host's.
    folder = tmp_path / "migrations"
    folder.mkdir()
    (folder / "001_init.sql").write_text("CREATE TABLE p_a (v TEXT);\n")
    listed = sorted(folder.glob("*.sql"))
    assert read_migration(listed[0]).startswith("CREATE TABLE p_a")
    host = _host_folder(tmp_path)
    os.rename(folder, tmp_path / "moved")
    folder.symlink_to(host, target_is_directory=True)
    with pytest.raises(SuaveplanError) as info:
        read_migration(listed[0])
    assert info.value.details == {"migrations": "migrations", "reason": "symlink"}


def test_a_missing_folder_is_a_coded_refusal(tmp_path: Path) -> None:
    with pytest.raises(SuaveplanError) as info:
        read_migration(tmp_path / "gone" / "001_init.sql")
    assert info.value.details == {"migrations": "gone", "reason": "unreadable"}


def test_a_file_in_a_real_folder_still_reads_and_a_linked_file_is_still_refused(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "migrations"
    folder.mkdir()
    (folder / "001_init.sql").write_text("CREATE TABLE p_a (v TEXT);\n")
    (folder / "002_link.sql").symlink_to(_host_folder(tmp_path) / "001_init.sql")
    assert read_migration(folder / "001_init.sql") == "CREATE TABLE p_a (v TEXT);\n"
    with pytest.raises(SuaveplanError) as info:
        read_migration(folder / "002_link.sql")
    assert info.value.details == {"migration": "002_link.sql", "reason": "symlink"}


# -- the whole path from the plugin's root: `root=` (what `standard_adapters` passes) ------


def _plugin_root(tmp_path: Path) -> Path:
    root = tmp_path / "plugin"
    root.mkdir()
    return root


async def test_a_link_above_the_migrations_folder_is_refused_under_root(
    db: SqliteDb, tmp_path: Path
) -> None:
    # `migrations = "db/migrations"` with `db` a link to a host folder: the folder's own
    # name is no link, so only a walk from the root sees it.
    root = _plugin_root(tmp_path)
    host = tmp_path / "host-db"
    (host / "migrations").mkdir(parents=True)
    (host / "migrations" / "001_init.sql").write_text(HOST_SQL)
    (root / "db").symlink_to(host)
    with pytest.raises(SuaveplanError) as info:
        await apply_migrations(db, root / "db" / "migrations", plugin="p", root=root)
    assert info.value.code == "SAND_DB_MIGRATION_FAILED"
    assert info.value.details == {"migrations": "migrations", "reason": "symlink"}
    assert "p_host" not in _tables(tmp_path)


async def test_a_linked_folder_without_sql_files_is_refused_too(
    db: SqliteDb, tmp_path: Path
) -> None:
    # Nothing would run, but the link is the plugin's claim on a host folder all the same:
    # refused, not silently read (its listing is a host directory's).
    root = _plugin_root(tmp_path)
    empty = tmp_path / "host-empty"
    empty.mkdir()
    (root / "migrations").symlink_to(empty)
    with pytest.raises(SuaveplanError) as info:
        await apply_migrations(db, root / "migrations", plugin="p", root=root)
    assert info.value.details["reason"] == "symlink"


@pytest.mark.parametrize("shape", ["missing", "a-file"])
async def test_no_migrations_folder_under_root_applies_nothing(
    db: SqliteDb, tmp_path: Path, shape: str
) -> None:
    root = _plugin_root(tmp_path)
    if shape == "a-file":
        (root / "migrations").write_text("not a folder")
    assert await apply_migrations(db, root / "migrations", plugin="p", root=root) == []


async def test_a_folder_outside_the_root_is_refused(db: SqliteDb, tmp_path: Path) -> None:
    root = _plugin_root(tmp_path)
    with pytest.raises(SuaveplanError) as info:
        await apply_migrations(db, _host_folder(tmp_path), plugin="p", root=root)
    assert info.value.details["reason"] == "outside-root"
    assert "p_host" not in _tables(tmp_path)


async def test_plain_migrations_under_root_apply(db: SqliteDb, tmp_path: Path) -> None:
    root = _plugin_root(tmp_path)
    (root / "db" / "migrations").mkdir(parents=True)
    (root / "db" / "migrations" / "001_init.sql").write_text("CREATE TABLE p_t (v TEXT);\n")
    assert await apply_migrations(db, root / "db" / "migrations", plugin="p", root=root) == [
        "001_init.sql"
    ]
    assert "p_t" in _tables(tmp_path)
