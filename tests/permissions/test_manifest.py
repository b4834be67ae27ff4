"""Manifests load from dicts, JSON and TOML; every invalid input names its field and index."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import PermissionPolicy, load_manifest

GOOD: dict[str, Any] = {
    "name": "invoices",
    "permissions": {
        "fs": ["./uploads/*", "rw:./out/*"],
        "fetch": ["api.stripe.com", "*.stripe.com"],
        "budgets": {"cpuPercent": 50, "memoryMb": 128, "wallClockMs": 30000},
    },
    "database": {"tablePrefix": "billing_"},
    "secrets": [{"name": "STRIPE_SECRET_KEY"}],
    "events": {"publishes": ["invoice.created"], "subscribes": ["payment.*"]},
}

TOML = """
name = "invoices"
[permissions]
fs = ["./uploads/*", "rw:./out/*"]
fetch = ["api.stripe.com", "*.stripe.com"]
[permissions.budgets]
cpuPercent = 50
memoryMb = 128
wallClockMs = 30000
[database]
tablePrefix = "billing_"
[[secrets]]
name = "STRIPE_SECRET_KEY"
[events]
publishes = ["invoice.created"]
subscribes = ["payment.*"]
"""


def _invalid(data: object) -> SuaveplanError:
    with pytest.raises(SuaveplanError) as info:
        load_manifest(data)  # type: ignore[arg-type]
    assert info.value.code == "SAND_MANIFEST_INVALID"
    return info.value


def test_dict_json_and_toml_manifests_load_identically(tmp_path: Path) -> None:
    (tmp_path / "m.json").write_text(json.dumps(GOOD))
    (tmp_path / "m.toml").write_text(TOML)
    from_dict = load_manifest(GOOD)
    assert load_manifest(tmp_path / "m.json") == from_dict
    assert load_manifest(str(tmp_path / "m.toml")) == from_dict
    assert from_dict.permissions.budgets.cpu_percent == 50
    assert from_dict.table_prefix == "billing_"
    assert from_dict.secret_names == ("STRIPE_SECRET_KEY",)


def test_policy_exposes_the_rules_verbatim() -> None:
    policy = PermissionPolicy.from_manifest(GOOD, root="/srv/plugin")
    assert policy.fs_rules == ("./uploads/*", "rw:./out/*")
    assert policy.fetch_rules == ("api.stripe.com", "*.stripe.com")
    assert policy.table_prefix == "billing_"
    assert policy.secrets == ("STRIPE_SECRET_KEY",)
    assert policy.publishes == ("invoice.created",)
    assert policy.subscribes == ("payment.*",)
    assert policy.budgets.wall_clock_ms == 30000
    assert str(policy.root) == "/srv/plugin"


@pytest.mark.parametrize(
    ("patch", "path", "index"),
    [
        ({"permissions": {"fs": ["./ok/*", "/etc/*"]}}, "permissions.fs[1]", 1),
        ({"permissions": {"fs": ["../up/*"]}}, "permissions.fs[0]", 0),
        ({"permissions": {"fs": ["./a/../../b"]}}, "permissions.fs[0]", 0),
        (
            {"permissions": {"fetch": ["api.x.com", "https://evil.com/path"]}},
            "permissions.fetch[1]",
            1,
        ),
        ({"permissions": {"fetch": ["ex*ample.com"]}}, "permissions.fetch[0]", 0),
        ({"permissions": {"fetch": ["host:99999"]}}, "permissions.fetch[0]", 0),
        ({"events": {"publishes": ["ok", "bad topic"]}}, "events.publishes[1]", 1),
        ({"secrets": [{"name": "A"}, {"name": "A"}]}, "secrets[1]", 1),
    ],
)
def test_bad_rules_name_the_field_path_and_rule_index(
    patch: dict[str, Any], path: str, index: int
) -> None:
    err = _invalid({"name": "p", **patch})
    assert err.details["path"] == path
    assert err.details["index"] == index


@pytest.mark.parametrize(
    ("data", "path"),
    [
        ({"name": "p", "permissions": {"fs": "./uploads/*"}}, "permissions.fs"),
        (
            {"name": "p", "permissions": {"budgets": {"memoryMb": -1}}},
            "permissions.budgets.memoryMb",
        ),
        (
            {"name": "p", "permissions": {"budgets": {"wallClockMs": "30"}}},
            "permissions.budgets.wallClockMs",
        ),
        (
            {"name": "p", "permissions": {"budgets": {"cpuPercent": 0}}},
            "permissions.budgets.cpuPercent",
        ),
        ({"name": "p", "permissions": {"network": []}}, "permissions.network"),
        ({"name": "p", "extra": 1}, "extra"),
        ({"permissions": {}}, "name"),
        ({"name": "Bad Name"}, "name"),
        ({"name": "p", "database": {"tablePrefix": ""}}, "database.tablePrefix"),
        ({"name": "p", "database": {"tablePrefix": "billing"}}, "database.tablePrefix"),
        ({"name": "p", "secrets": [{"name": 5}]}, "secrets[0].name"),
        ({"name": "p", "events": {"publishes": [1]}}, "events.publishes[0]"),
    ],
)
def test_wrong_types_unknown_keys_and_negative_budgets_are_invalid(
    data: dict[str, Any], path: str
) -> None:
    err = _invalid(data)
    assert err.details["path"] == path
    errors = cast(list[dict[str, Any]], err.details["errors"])
    assert all("path" in e and "message" in e for e in errors)


def test_every_problem_is_listed_not_just_the_first() -> None:
    err = _invalid({"name": "p", "permissions": {"fs": ["/abs"], "fetch": [7]}, "zzz": 1})
    paths = {e["path"] for e in cast(list[dict[str, Any]], err.details["errors"])}
    assert {"permissions.fs[0]", "permissions.fetch[0]", "zzz"} <= paths


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", "name = "])
def test_unparsable_files_are_manifest_errors(tmp_path: Path, content: str) -> None:
    suffix = ".toml" if "=" in content else ".json"
    path = tmp_path / f"m{suffix}"
    path.write_text(content)
    _invalid(path)


def test_missing_file_and_unknown_suffix_are_manifest_errors(tmp_path: Path) -> None:
    _invalid(tmp_path / "absent.json")
    (tmp_path / "m.yaml").write_text("name: p")
    _invalid(tmp_path / "m.yaml")


def test_a_non_mapping_manifest_is_invalid() -> None:
    _invalid(["name", "p"])
