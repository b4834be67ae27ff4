"""Without `proxies=`, a sandbox gets the standard adapter set for its manifest and owns it."""

from __future__ import annotations

from pathlib import Path

import pytest

from suaveplan_sandbox.adapters import Adapters
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.testing import InMemoryEvents, InMemoryFs
from suaveplan_sandbox.vm import create_vm_sandbox

SOURCE = """
from suaveplan import db, events, fs, secrets

GOT = []


@events.subscribe("pings.*")
def on_ping(payload):
    GOT.append(payload)


def read():
    return fs.read_text("./data/a.txt")


def ping():
    events.publish("pings.one", 1)
    return GOT


def one():
    return db.query("SELECT 1 AS x", [])


def secret():
    return secrets.get("TOKEN")
"""


def _policy(tmp: Path, *, database: bool) -> PermissionPolicy:
    (tmp / "data").mkdir(exist_ok=True)
    (tmp / "data" / "a.txt").write_text("on disk")
    (tmp / "p.py").write_text(SOURCE)
    manifest: dict[str, object] = {
        "name": "defaults",
        "permissions": {"fs": ["./data/*"]},
        "events": {"publishes": ["pings.*"], "subscribes": ["pings.*"]},
        "secrets": [{"name": "TOKEN"}],
    }
    if database:
        manifest["database"] = {"tablePrefix": "defaults_"}
    return PermissionPolicy.from_manifest(manifest, root=tmp)


async def test_the_default_set_serves_fs_from_disk_and_events_on_a_private_bus(
    tmp_path: Path,
) -> None:
    policy = _policy(tmp_path, database=False)
    async with await create_vm_sandbox(plugin_module_path=tmp_path / "p.py", policy=policy) as sb:
        assert await sb.call("read") == "on disk"
        await sb.call("ping")
        # Each delivery is queued behind the call that published it.
        assert await sb.call("ping") == [1]
        assert await sb.call("ping") == [1, 1]
        with pytest.raises(SuaveplanError) as info:
            await sb.call("secret")  # secrets only ever come from the host, explicitly
        assert info.value.code == "SAND_ADAPTER_MISSING"


async def test_a_declared_database_without_data_dir_fails_closed_at_call_time(
    tmp_path: Path,
) -> None:
    policy = _policy(tmp_path, database=True)
    async with await create_vm_sandbox(plugin_module_path=tmp_path / "p.py", policy=policy) as sb:
        with pytest.raises(SuaveplanError) as info:
            await sb.call("one")
        assert info.value.code == "SAND_ADAPTER_MISSING"


async def test_a_declared_database_with_data_dir_gets_sqlite_there(tmp_path: Path) -> None:
    policy = _policy(tmp_path, database=True)
    data_dir = tmp_path / "state"
    async with await create_vm_sandbox(
        plugin_module_path=tmp_path / "p.py", policy=policy, data_dir=data_dir
    ) as sb:
        assert await sb.call("one") == [{"x": 1}]
    assert (data_dir / "defaults.sqlite3").exists()


async def test_explicit_proxies_replace_the_default_set(tmp_path: Path) -> None:
    policy = _policy(tmp_path, database=False)
    fs, bus = InMemoryFs({"data/a.txt": b"in memory"}), InMemoryEvents()
    async with await create_vm_sandbox(
        plugin_module_path=tmp_path / "p.py", policy=policy, proxies=Adapters(fs=fs, events=bus)
    ) as sb:
        assert await sb.call("read") == "in memory"
        await sb.call("ping")
        assert bus.published == [("defaults", "pings.one", 1)]
        with pytest.raises(SuaveplanError) as info:
            await sb.call("one")  # no db adapter was given
        assert info.value.code == "SAND_ADAPTER_MISSING"
