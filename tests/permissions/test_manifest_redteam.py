"""Manifests an attacker wrote: every file the parsers choke on is a coded
`SAND_MANIFEST_INVALID`, and a manifest means one thing to every reader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import load_manifest
from suaveplan_sandbox.permissions._manifest import MAX_MANIFEST_BYTES


def _refused(path: Path) -> SuaveplanError:
    with pytest.raises(SuaveplanError) as info:
        load_manifest(path)
    assert info.value.code == "SAND_MANIFEST_INVALID"
    return info.value


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("deep.json", '{"name": "x", "version": ' + "[" * 100_000 + "]" * 100_000 + "}"),
        ("deep.toml", 'name = "x"\nversion = ' + "[" * 100_000 + "]" * 100_000 + "\n"),
        ("tables.toml", 'name = "x"\nversion = ' + "{a=" * 50_000 + "1" + "}" * 50_000 + "\n"),
    ],
)
def test_nesting_deeper_than_the_parser_can_follow_is_unparsable_not_a_crash(
    tmp_path: Path, name: str, text: str
) -> None:
    assert len(text.encode()) <= MAX_MANIFEST_BYTES
    path = tmp_path / name
    path.write_text(text)
    assert _refused(path).details["reason"] == "unparsable"


def test_a_json_key_given_twice_is_refused_not_silently_the_last(tmp_path: Path) -> None:
    # Python keeps the last, other readers (a review tool) the first: the grants would differ.
    path = tmp_path / "dup.json"
    first, second = '{"fs": ["./uploads/*"]}', '{"fs": ["rw:./*"]}'
    path.write_text(f'{{"name": "x", "permissions": {first}, "permissions": {second}}}')
    err = _refused(path)
    assert err.details["reason"] == "unparsable"
    assert "'permissions'" in err.message


def test_a_duplicate_key_deep_inside_is_refused_too(tmp_path: Path) -> None:
    path = tmp_path / "dup.json"
    path.write_text('{"name": "x", "database": {"tablePrefix": "a_", "tablePrefix": "b_"}}')
    assert _refused(path).details["reason"] == "unparsable"


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_non_finite_json_budgets_are_refused(tmp_path: Path, value: str) -> None:
    path = tmp_path / "m.json"
    budgets = '{"budgets": {"cpuPercent": ' + value + "}}"
    path.write_text('{"name": "x", "permissions": ' + budgets + "}")
    assert _refused(path).details["field"] == "permissions.budgets.cpuPercent"


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_non_finite_toml_budgets_are_refused(tmp_path: Path, value: str) -> None:
    path = tmp_path / "m.toml"
    path.write_text(f'name = "x"\n[permissions.budgets]\ncpuPercent = {value}\n')
    assert _refused(path).details["field"] == "permissions.budgets.cpuPercent"


@pytest.mark.parametrize("name", ["x\n", "x\u0131", "\uff58", "x\x1b[2J"])
def test_a_plugin_name_with_a_trailing_newline_or_look_alike_is_refused(
    tmp_path: Path, name: str
) -> None:
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"name": name}))
    assert _refused(path).details["field"] == "name"
