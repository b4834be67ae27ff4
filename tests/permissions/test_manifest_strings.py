"""Every string in a manifest is UTF-8: a lone surrogate is refused in every field.

A Python `str` may hold a lone surrogate (`"data/\\ud800"`, or JSON's `"\\ud800"` escape), a
code point with no UTF-8 encoding. Before, fields without a pattern took one: an fs rule
`data\\udcff/*` matched no request (requests are encoded and refused) but named, through
the filesystem encoding's `surrogateescape`, the directory `b"data\\xff"` to anything that
opened it (a WASM preopen), and the version, description, entry and migrations carried it
into logs and JSON that cannot encode it. Now each is `SAND_MANIFEST_INVALID` with the field's
path and type `string_not_utf8`, and the error itself never holds the surrogate.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import Manifest, PermissionPolicy, load_manifest

BASE: dict[str, Any] = {
    "name": "p",
    "version": "1.0",
    "description": "d",
    "entry": "plugin.py",
    "permissions": {"fs": ["./ok/*"], "fetch": ["a.example"]},
    "database": {"tablePrefix": "p_", "migrations": "migrations"},
    "secrets": [{"name": "TOKEN"}],
    "events": {"publishes": ["a.b"], "subscribes": ["c.*"]},
}

# (where the string goes, the path the error names, a valid value to spoil)
FIELDS: list[tuple[list[str | int], str, str]] = [
    (["name"], "name", "p"),
    (["version"], "version", "1.0"),
    (["description"], "description", "d"),
    (["entry"], "entry", "plugin.py"),
    (["permissions", "fs", 0], "permissions.fs[0]", "data/"),
    (["permissions", "fs", 0], "permissions.fs[0]", "rw:data/"),
    (["permissions", "fetch", 0], "permissions.fetch[0]", "a.example"),
    (["database", "tablePrefix"], "database.tablePrefix", "p_"),
    (["database", "migrations"], "database.migrations", "migrations/"),
    (["secrets", 0, "name"], "secrets[0].name", "TOKEN"),
    (["events", "publishes", 0], "events.publishes[0]", "a.b"),
    (["events", "subscribes", 0], "events.subscribes[0]", "c.*"),
]
SURROGATES = ["\ud800", "\udcff", "\udfff"]  # \udcff: surrogateescape's b"\xff"


def _with(where: list[str | int], value: str) -> dict[str, Any]:
    data = json.loads(json.dumps(BASE))
    parent: Any = data
    for step in where[:-1]:
        parent = parent[step]
    parent[where[-1]] = value
    return cast(dict[str, Any], data)


def _refused(source: object) -> dict[str, Any]:
    with pytest.raises(SuaveplanError) as info:
        load_manifest(source)  # type: ignore[arg-type]
    err = info.value
    assert err.code == "SAND_MANIFEST_INVALID"
    # The error is UTF-8 itself: it can be logged and sent as JSON.
    json.dumps(err.to_wire(), ensure_ascii=False).encode("utf-8")
    str(err).encode("utf-8")
    errors = cast(list[dict[str, Any]], err.details["errors"])
    return errors[0]


def test_the_base_manifest_is_valid() -> None:
    load_manifest(BASE)


@pytest.mark.parametrize("surrogate", SURROGATES, ids=["d800", "dcff", "dfff"])
@pytest.mark.parametrize(("where", "path", "valid"), FIELDS, ids=[f"{p}-{v}" for _, p, v in FIELDS])
def test_a_lone_surrogate_is_refused_in_every_string_field(
    where: list[str | int], path: str, valid: str, surrogate: str
) -> None:
    problem = _refused(_with(where, valid + surrogate))
    assert (problem["path"], problem["type"]) == (path, "string_not_utf8")


@pytest.mark.parametrize("surrogate", SURROGATES, ids=["d800", "dcff", "dfff"])
def test_a_lone_surrogate_in_a_key_is_refused_without_naming_the_key(surrogate: str) -> None:
    problem = _refused({"name": "p", "permissions": {"fs" + surrogate: []}})
    assert (problem["path"], problem["type"]) == ("permissions", "string_not_utf8")


def test_a_json_file_escape_that_decodes_to_a_lone_surrogate_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    path.write_text('{"name": "p", "permissions": {"fs": ["data/\\ud800/*"]}}')
    problem = _refused(path)
    assert (problem["path"], problem["type"]) == ("permissions.fs[0]", "string_not_utf8")


def test_a_manifest_object_holding_a_surrogate_is_refused_when_validated_again() -> None:
    made = Manifest.model_construct(name="p", permissions={"fs": ["data\udcff/*"]})
    with pytest.raises(SuaveplanError) as info:
        PermissionPolicy.from_manifest(made, root="/r")
    assert cast(list[dict[str, Any]], info.value.details["errors"])[0]["type"] == (
        "string_not_utf8"
    )


@pytest.mark.parametrize(
    "rule",
    ["data/\u00e9t\u00e9/*", "\U0001f600/*", "rw:\u65e5\u672c/*"],
    ids=["latin", "emoji", "cjk"],
)
def test_non_ascii_that_is_valid_utf8_is_still_accepted(rule: str) -> None:
    assert load_manifest({"name": "p", "permissions": {"fs": [rule]}}).permissions.fs == (rule,)
