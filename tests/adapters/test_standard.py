"""open_standard_adapters: one call wires every capability the manifest grants, nothing more."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from suaveplan_sandbox.adapters import (
    BeneathRootFs,
    DirectorySecrets,
    HttpxFetch,
    InProcessEventBus,
    SqliteDb,
    StandardAdapters,
    StaticSecrets,
    open_standard_adapters,
)
from suaveplan_sandbox.errors import SuaveplanError, WireValue
from suaveplan_sandbox.gateway import Gateway
from suaveplan_sandbox.permissions import PermissionChecker, PermissionPolicy
from suaveplan_sandbox.testing import FakeDb

FULL: dict[str, Any] = {
    "name": "inv",
    "version": "1.2.0",
    "permissions": {"fs": ["./uploads/*"], "fetch": ["api.example.com"]},
    "database": {"tablePrefix": "inv_", "migrations": "migrations"},
    "secrets": [{"name": "TOKEN"}],
    "events": {"publishes": ["inv.done"], "subscribes": ["inv.*"]},
}


def _plugin_root(tmp_path: Path) -> Path:
    root = tmp_path / "plugin"
    (root / "uploads").mkdir(parents=True)
    (root / "uploads" / "a.txt").write_bytes(b"hello")
    (root / "migrations").mkdir()
    (root / "migrations" / "001.sql").write_text(
        "CREATE TABLE inv_items (id INTEGER PRIMARY KEY, name TEXT);"
    )
    return root


def _policy(manifest: dict[str, Any], root: Path, **kwargs: Any) -> PermissionPolicy:
    return PermissionPolicy.from_manifest(manifest, root=root, **kwargs)


async def test_a_full_manifest_gets_every_adapter_wired_through_the_gateway(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="suaveplan_sandbox.audit")
    policy = _policy(FULL, _plugin_root(tmp_path))
    host = await open_standard_adapters(policy, data_dir=tmp_path / "data", secrets={"TOKEN": "v"})
    a = host.adapters
    assert isinstance(a.fs, BeneathRootFs)
    assert isinstance(a.fetch, HttpxFetch)
    assert isinstance(a.db, SqliteDb)
    assert isinstance(a.secrets, StaticSecrets)
    assert isinstance(a.events, InProcessEventBus)
    assert host.applied_migrations == ("001.sql",)
    assert (tmp_path / "data" / "inv.sqlite3").is_file()
    gateway = Gateway(checker=PermissionChecker(policy), adapters=a, audit=host.audit)
    assert await gateway.dispatch("fs", "read_bytes", {"path": "/uploads/a.txt"}) == b"hello"
    await gateway.dispatch(
        "db", "query", {"sql": "INSERT INTO inv_items (name) VALUES (?)", "params": ["x"]}
    )
    rows = await gateway.dispatch("db", "query", {"sql": "SELECT name FROM inv_items"})
    assert rows == {"columns": ["name"], "rows": [["x"]], "rowcount": -1}
    assert await gateway.dispatch("secrets", "get", {"name": "TOKEN"}) == "v"
    got: list[tuple[str, WireValue]] = []

    async def handler(topic: str, payload: WireValue) -> None:
        got.append((topic, payload))

    await gateway.dispatch("events", "subscribe", {"topic": "inv.*"}, handler=handler)
    await gateway.dispatch("events", "publish", {"topic": "inv.done", "payload": 1})
    assert got == [("inv.done", 1)]
    # Default fetch refuses non-public addresses (no opt-in was given).
    with pytest.raises(SuaveplanError) as info:
        await a.fetch.vet("127.0.0.1", 443, "api.example.com")
    assert info.value.code == "SAND_FETCH_ADDRESS_REFUSED"
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name.endswith("audit")]
    assert [(e["capability"], e["decision"]) for e in lines][:2] == [
        ("fs", "allow"),
        ("db", "allow"),
    ]
    assert all("resource" not in e for e in lines)  # not logged unless the operator opts in
    await gateway.close()
    await host.aclose()
    await host.aclose()  # idempotent
    assert host.closed
    with pytest.raises(SuaveplanError) as info:
        await a.fs.read_bytes("uploads/a.txt", max_bytes=10)
    assert info.value.code == "SAND_FS_IO_ERROR"
    # Opening again for the same version applies nothing twice.
    async with await open_standard_adapters(
        policy, data_dir=tmp_path / "data", secrets={"TOKEN": "v"}
    ) as again:
        assert again.applied_migrations == ()


async def test_a_manifest_that_grants_nothing_gets_no_adapters(tmp_path: Path) -> None:
    policy = _policy({"name": "bare"}, tmp_path)
    async with await open_standard_adapters(policy, data_dir=tmp_path, secrets={"X": "y"}) as host:
        a = host.adapters
        assert (a.fs, a.fetch, a.db, a.secrets, a.events) == (None, None, None, None, None)
        assert repr(host) == "StandardAdapters(none)"


async def test_secrets_come_only_from_what_the_host_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOKEN", "from-the-environment")
    manifest = {"name": "sec", "secrets": [{"name": "TOKEN"}]}
    policy = _policy(manifest, tmp_path)
    async with await open_standard_adapters(policy) as host:
        gateway = Gateway(checker=PermissionChecker(policy), adapters=host.adapters)
        with pytest.raises(SuaveplanError) as info:
            await gateway.dispatch("secrets", "get", {"name": "TOKEN"})
        assert info.value.code == "SAND_ADAPTER_MISSING"
    mount = tmp_path / "mount"
    mount.mkdir()
    (mount / "TOKEN").write_text("from-the-mount\n")
    async with await open_standard_adapters(policy, secrets=mount) as host:
        assert isinstance(host.adapters.secrets, DirectorySecrets)
        assert await host.adapters.secrets.get("TOKEN") == "from-the-mount"
    with pytest.raises(SuaveplanError) as info:
        await open_standard_adapters(policy, secrets=tmp_path / "missing")
    assert info.value.code == "SAND_INVALID_ARGUMENT"


async def test_a_database_needs_a_data_dir_or_an_adapter(tmp_path: Path) -> None:
    manifest = {"name": "dbp", "database": {"tablePrefix": "dbp_"}}
    with pytest.raises(SuaveplanError) as info:
        await open_standard_adapters(_policy(manifest, tmp_path))
    assert info.value.code == "SAND_INVALID_ARGUMENT"
    postgres = _policy(manifest, tmp_path, sql_dialect="postgres")
    with pytest.raises(SuaveplanError) as info:
        await open_standard_adapters(postgres, data_dir=tmp_path)
    assert info.value.code == "SAND_INVALID_ARGUMENT"
    given = FakeDb()
    async with await open_standard_adapters(postgres, db=given) as host:
        assert host.adapters.db is given


async def test_a_migration_outside_the_prefix_fails_the_factory(tmp_path: Path) -> None:
    root = _plugin_root(tmp_path)
    (root / "migrations" / "002.sql").write_text("CREATE TABLE other (x INTEGER);")
    with pytest.raises(SuaveplanError) as info:
        await open_standard_adapters(_policy(FULL, root), data_dir=tmp_path / "data")
    assert info.value.code == "SAND_DB_MIGRATION_FAILED"


async def test_plugins_sharing_one_bus_see_each_others_events(tmp_path: Path) -> None:
    bus = InProcessEventBus()
    pub = _policy({"name": "pub", "events": {"publishes": ["orders.*"]}}, tmp_path)
    sub = _policy({"name": "sub", "events": {"subscribes": ["orders.created"]}}, tmp_path)
    hosts: list[StandardAdapters] = [
        await open_standard_adapters(pub, events=bus),
        await open_standard_adapters(sub, events=bus),
    ]
    gw_pub, gw_sub = (
        Gateway(checker=PermissionChecker(p), adapters=h.adapters)
        for p, h in zip((pub, sub), hosts, strict=True)
    )
    got: list[tuple[str, WireValue]] = []

    async def handler(topic: str, payload: WireValue) -> None:
        got.append((topic, payload))

    await gw_sub.dispatch("events", "subscribe", {"topic": "orders.created"}, handler=handler)
    await gw_pub.dispatch("events", "publish", {"topic": "orders.created", "payload": {"id": 3}})
    await gw_pub.dispatch("events", "publish", {"topic": "orders.paid", "payload": 4})
    assert got == [("orders.created", {"id": 3})]
    for host in hosts:
        await host.aclose()
