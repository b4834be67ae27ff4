"""The engines' own table-name prefixes (`pg_`, `sqlite_`) are never a plugin's scope: the
manifest refuses them as a `tablePrefix`, and the SQL gate refuses such names whatever prefix
it was built with (a PostgreSQL catalog view named unqualified, `pg_roles`, resolves to
`pg_catalog`)."""

from __future__ import annotations

import pytest

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.permissions._decision import Allow, Deny
from suaveplan_sandbox.permissions._sql_gate import SqlGate


def _manifest(prefix: str) -> dict[str, object]:
    return {"name": "p", "version": "1.0.0", "database": {"tablePrefix": prefix}}


@pytest.mark.parametrize("prefix", ["pg_", "pg_stat_", "sqlite_", "sqlite_x_"])
def test_a_manifest_declaring_a_reserved_prefix_is_invalid_and_says_why(
    prefix: str, tmp_path: object
) -> None:
    with pytest.raises(SuaveplanError) as caught:
        PermissionPolicy.from_manifest(_manifest(prefix), root=str(tmp_path))
    assert caught.value.code == "SAND_MANIFEST_INVALID"
    assert "database.tablePrefix" in str(caught.value)
    assert "'pg_' or 'sqlite_'" in str(caught.value)


@pytest.mark.parametrize("prefix", ["pgx_", "sqlitex_", "app_pg_", "billing_"])
def test_prefixes_that_only_look_alike_are_valid(prefix: str, tmp_path: object) -> None:
    policy = PermissionPolicy.from_manifest(_manifest(prefix), root=str(tmp_path))
    assert policy is not None


@pytest.mark.parametrize("dialect", ["sqlite", "postgres"])
@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM pg_roles",
        "SELECT query FROM pg_stat_activity",
        "SELECT name, setting FROM pg_settings",
        "SELECT * FROM sqlite_sequence",
        "SELECT a.id FROM pg_app AS a",
    ],
)
def test_a_gate_built_with_a_reserved_prefix_still_refuses_engine_names(
    dialect: str, sql: str
) -> None:
    # A host may build a gate itself, bypassing the manifest: the names stay out of scope.
    for prefix in ("pg_", "sqlite_"):
        gate = SqlGate(prefix, dialect=dialect)  # type: ignore[arg-type]
        assert isinstance(gate.check_query(sql), Deny), (prefix, sql)


def test_table_payloads_with_engine_names_are_refused_and_plugin_names_pass() -> None:
    gate = SqlGate("pg_")
    for name in ("pg_roles", "PG_AUTHID", "pg_app_users", "sqlite_master"):
        assert isinstance(gate.check_table(name), Deny), name
    assert isinstance(SqlGate("billing_").check_table("billing_pg_x"), Allow)
