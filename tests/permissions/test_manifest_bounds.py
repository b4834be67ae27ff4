"""A manifest given as data is bounded as a whole, from the attacker's side.

Every field already had its own bound, but nothing bounded the manifest: a million fs rules,
a 100 MB description or a self-referencing dict cost the host memory and CPU before any
field refused them. Now the data is copied into plain, bounded data first (a dict of at most
`MAX_MANIFEST_KEYS` keys, lists of at most `MAX_MANIFEST_RULES` entries, strings of at most
`MAX_MANIFEST_STRING_BYTES`, nesting of at most `MAX_MANIFEST_DEPTH`, `MAX_MANIFEST_BYTES` in
all, as a file may be), and only that copy is validated and compiled. What the host passed
is read through the built-in types' own storage: a subclass's overridden methods never run,
and a type that is not plain data is refused. The refusal is `SAND_MANIFEST_INVALID` naming
where, never the value. "Before expensive work" is shown by counting compiled rules, not by
timing.
"""

from __future__ import annotations

import importlib
import itertools
import json
import types
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar, cast

import pytest

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import (
    Manifest,
    PermissionPolicy,
    _fetch_rules,
    _fs_rules,
    _manifest,
    load_manifest,
)
from suaveplan_sandbox.permissions._topic_rules import validate_topic_rule

# The bounds, as the module documents them (looked up when a test runs, not at import).
LIMITS = {
    "rules": "MAX_MANIFEST_RULES",
    "keys": "MAX_MANIFEST_KEYS",
    "string": "MAX_MANIFEST_STRING_BYTES",
    "key": "MAX_MANIFEST_KEY_BYTES",
    "depth": "MAX_MANIFEST_DEPTH",
    "bytes": "MAX_MANIFEST_BYTES",
    "problems": "MAX_MANIFEST_PROBLEMS",
}
_fresh = itertools.count()
DATA_MODULE = "suaveplan_sandbox.permissions._manifest_data"


def limit(name: str) -> int:
    # The bounds live with the walk that enforces them; the problem cap with the error.
    module = _manifest if name == "problems" else importlib.import_module(DATA_MODULE)
    value = getattr(module, LIMITS[name], None)
    assert isinstance(value, int), f"{module.__name__}.{LIMITS[name]} is not defined"
    return value


def _refused(data: object) -> SuaveplanError:
    with pytest.raises(SuaveplanError) as info:
        load_manifest(data)  # type: ignore[arg-type]
    err = info.value
    assert err.code == "SAND_MANIFEST_INVALID"
    # Whatever was refused, the error is small and serialisable.
    wire = json.dumps(err.to_wire())
    assert len(wire) < 16 * 1024, len(wire)
    return err


def _problem(err: SuaveplanError) -> dict[str, Any]:
    errors = cast(list[dict[str, Any]], err.details["errors"])
    assert errors
    return errors[0]


@pytest.fixture
def compiled(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How many fs and fetch rules got compiled, and topic rules checked."""
    counts = {"fs": 0, "fetch": 0, "topics": 0}
    fs_compile, fetch_compile = _fs_rules._compile_rule, _fetch_rules._compile_rule
    validate_topic = validate_topic_rule

    def count_fs(index: int, text: object) -> Any:
        counts["fs"] += 1
        return fs_compile(index, text)

    def count_fetch(index: int, text: object) -> Any:
        counts["fetch"] += 1
        return fetch_compile(index, text)

    def count_topic(rule: object) -> str | None:
        counts["topics"] += 1
        return validate_topic(rule)

    monkeypatch.setattr(_fs_rules, "_compile_rule", count_fs)
    monkeypatch.setattr(_fetch_rules, "_compile_rule", count_fetch)
    monkeypatch.setattr(_manifest, "validate_topic_rule", count_topic)
    return counts


def _rules(capability: str, count: int) -> dict[str, Any]:
    """A manifest with `count` fresh, valid rules for `capability` (fresh: no cache hit)."""
    tag = next(_fresh)
    if capability == "fs":
        return {"permissions": {"fs": [f"./b{tag}x{i}/*" for i in range(count)]}}
    if capability == "fetch":
        return {"permissions": {"fetch": [f"h{tag}x{i}.example" for i in range(count)]}}
    if capability == "secrets":
        return {"secrets": [{"name": f"S{tag}_{i}"} for i in range(count)]}
    return {"events": {capability: [f"t{tag}.{i}" for i in range(count)]}}


LISTS = [
    ("fs", "permissions.fs"),
    ("fetch", "permissions.fetch"),
    ("secrets", "secrets"),
    ("publishes", "events.publishes"),
    ("subscribes", "events.subscribes"),
]


@pytest.mark.parametrize(("capability", "field"), LISTS, ids=[c for c, _ in LISTS])
def test_more_rules_than_the_bound_are_refused_before_any_rule_is_compiled(
    compiled: dict[str, int], capability: str, field: str
) -> None:
    err = _refused({"name": "p", **_rules(capability, limit("rules") + 1)})
    problem = _problem(err)
    assert (problem["path"], problem["type"]) == (field, "too_long")
    assert err.details["field"] == field
    assert compiled == {"fs": 0, "fetch": 0, "topics": 0}


def test_a_million_fs_rules_compile_none_and_report_one_problem(
    compiled: dict[str, int],
) -> None:
    err = _refused({"name": "p", "permissions": {"fs": ["./a/*"] * 1_000_000}})
    assert len(cast(list[object], err.details["errors"])) == 1
    assert compiled["fs"] == 0


def test_exactly_the_bound_is_accepted() -> None:
    # The benchmarks build policies of 10,000 rules: the bound must not be below that.
    assert limit("rules") >= 10_000
    policy = PermissionPolicy.from_manifest(
        {"name": "p", **_rules("fs", limit("rules"))}, root="/r"
    )
    assert len(policy.fs_rules) == limit("rules")


def test_more_in_total_than_a_manifest_file_may_hold_is_refused_before_compiling(
    compiled: dict[str, int],
) -> None:
    # Each rule and each list is within its own bound; together they are over 1 MiB.
    tag = next(_fresh)
    count = limit("bytes") // 1000 + 10
    rules = [f"./{tag}/{i:06d}/" + "d" * 990 + "/*" for i in range(count)]
    assert count <= limit("rules")
    err = _refused({"name": "p", "permissions": {"fs": rules}})
    assert (_problem(err)["path"], _problem(err)["type"]) == ("", "manifest_too_large")
    assert compiled["fs"] == 0


def test_a_dict_as_large_as_a_manifest_file_may_be_is_accepted() -> None:
    # What fits in a 1 MiB JSON file fits as a dict: the dict is measured no larger.
    rules = [f"./d{i:04d}/" + "x" * 200 + "/*" for i in range(4500)]
    data = {"name": "p", "permissions": {"fs": rules}}
    assert len(json.dumps(data, separators=(",", ":"))) <= limit("bytes")
    assert load_manifest(data).permissions.fs == tuple(rules)


GIANT_FIELDS: list[tuple[list[str | int], str]] = [
    (["description"], "description"),
    (["version"], "version"),
    (["name"], "name"),
    (["entry"], "entry"),
    (["permissions", "fs", 1], "permissions.fs[1]"),
    (["permissions", "fetch", 0], "permissions.fetch[0]"),
    (["secrets", 0, "name"], "secrets[0].name"),
    (["events", "publishes", 0], "events.publishes[0]"),
    (["database", "tablePrefix"], "database.tablePrefix"),
]


def _with(where: list[str | int], value: str) -> dict[str, Any]:
    """A valid manifest with `value` put at `where`."""
    data: dict[str, Any] = {
        "name": "p",
        "permissions": {"fs": ["./ok/*", "./ok2/*"], "fetch": ["a.example"]},
        "secrets": [{"name": "A"}],
        "events": {"publishes": ["a.b"]},
        "database": {"tablePrefix": "p_"},
    }
    parent: Any = data
    for step in where[:-1]:
        parent = parent[step]
    parent[where[-1]] = value
    return data


@pytest.mark.parametrize(("where", "path"), GIANT_FIELDS, ids=[path for _, path in GIANT_FIELDS])
def test_a_giant_string_is_refused_by_its_length_and_never_echoed(
    compiled: dict[str, int], where: list[str | int], path: str
) -> None:
    giant = "G" * (100 * 1024 * 1024)  # 100 MiB: refused by its length, never encoded
    err = _refused(_with(where, giant))
    del giant
    problem = _problem(err)
    assert (problem["path"], problem["type"]) == (path, "string_too_long")
    assert "GGGGGGGG" not in err.message + json.dumps(err.to_wire())
    assert compiled == {"fs": 0, "fetch": 0, "topics": 0}


def test_a_string_just_within_the_bound_reaches_its_own_field_check() -> None:
    # The overall string bound never hides a field's own, smaller one (fs: 4,096 bytes).
    err = _refused({"name": "p", "permissions": {"fs": ["./" + "a" * 5000]}})
    assert _problem(err)["type"] == "value_error"
    assert limit("string") >= 4096 + len("rw:")
    assert load_manifest({"name": "p", "description": "d" * limit("string")}).description


@pytest.mark.parametrize(
    "key",
    ["k" * 100_000, "k" * 65, "\u00e9" * 33],
    ids=["100k", "65-ascii", "66-bytes"],
)
def test_a_long_key_is_refused_without_being_named(key: str) -> None:
    assert len(key.encode()) > limit("key")
    err = _refused({"name": "p", "permissions": {key: []}})
    problem = _problem(err)
    assert (problem["path"], problem["type"]) == ("permissions", "string_too_long")
    assert "kkkkkkkk" not in json.dumps(err.to_wire())


def test_a_mapping_with_more_keys_than_the_schema_could_use_is_one_problem() -> None:
    # Before, each unknown key was its own pydantic error: ten thousand problems, each
    # naming the key, in the error's details.
    data: dict[str, object] = {"name": "p"}
    data.update({f"unknown{i}": i for i in range(10_000)})
    err = _refused(data)
    assert (_problem(err)["path"], _problem(err)["type"]) == ("", "too_long")
    assert len(cast(list[object], err.details["errors"])) == 1
    assert limit("keys") >= len(Manifest.model_fields)


def _nested(depth: int) -> list[object]:
    inner: list[object] = []
    for _ in range(depth - 1):
        inner = [inner]
    return inner


@pytest.mark.parametrize("depth", [50, 100_000])
def test_nesting_deeper_than_any_manifest_needs_is_refused_without_recursion(depth: int) -> None:
    err = _refused({"name": "p", "version": _nested(depth)})
    assert _problem(err)["type"] == "manifest_too_deep"
    assert _problem(err)["path"].startswith("version[0]")


def test_a_dict_that_contains_itself_is_refused_not_walked_for_ever() -> None:
    loop: dict[str, object] = {"name": "p"}
    loop["permissions"] = loop
    assert _problem(_refused(loop))["type"] == "manifest_too_deep"
    cycle: list[object] = []
    cycle.append(cycle)
    assert _problem(_refused({"name": "p", "permissions": {"fs": cycle}}))["type"] == (
        "manifest_too_deep"
    )


def test_the_deepest_real_manifest_is_well_within_the_depth_bound() -> None:
    deep = {"name": "p", "permissions": {"budgets": {"cpuPercent": 5}}, "secrets": [{"name": "A"}]}
    assert load_manifest(deep).permissions.budgets.cpu_percent == 5
    assert limit("depth") >= 3 + 2


def test_a_json_file_within_the_file_bound_meets_the_same_bounds(
    tmp_path: Path, compiled: dict[str, int]
) -> None:
    many = tmp_path / "many.json"
    many.write_text(json.dumps({"name": "p", **_rules("fs", limit("rules") + 1)}))
    assert many.stat().st_size <= limit("bytes")
    assert _problem(_refused(many))["type"] == "too_long"
    deep = tmp_path / "deep.json"
    deep.write_text('{"name": "p", "version": ' + "[" * 500 + "]" * 500 + "}")
    assert _problem(_refused(deep))["type"] == "manifest_too_deep"
    assert compiled["fs"] == 0


def test_every_route_into_a_manifest_is_bounded(compiled: dict[str, int]) -> None:
    data = {"name": "p", **_rules("fs", limit("rules") + 1)}
    with pytest.raises(SuaveplanError) as info:
        PermissionPolicy.from_manifest(data, root="/r")
    assert info.value.code == "SAND_MANIFEST_INVALID"
    # Straight through pydantic, too (the bound is the model's own first step).
    with pytest.raises(ValueError, match="at most"):
        Manifest.model_validate(data)
    # A Manifest made without validation is validated again, bounds first.
    made = Manifest.model_construct(name="p", permissions={"fs": ["./a/*"] * 20_000})
    assert _problem(_refused(made))["type"] == "too_long"
    assert compiled["fs"] == 0


def test_a_problem_list_is_capped_in_the_error() -> None:
    bad = [{"name": f"bad name {i}"} for i in range(1000)]
    err = _refused({"name": "p", "secrets": bad})
    errors = cast(list[object], err.details["errors"])
    assert len(errors) == limit("problems")
    assert err.details["errors_omitted"] == 1000 - limit("problems")


# --- data that is not plain: read through the built-in storage, or refused ---------------


class HostileDict(dict[str, object]):
    """Each overridden method records its call and lies about the contents."""

    calls: ClassVar[list[str]] = []

    def __iter__(self) -> Iterator[str]:
        self.calls.append("__iter__")
        return iter(["name", "permissions"])

    def __getitem__(self, key: str) -> object:
        self.calls.append("__getitem__")
        return {"fs": ["rw:./*"]} if key == "permissions" else "p"

    def __len__(self) -> int:
        self.calls.append("__len__")
        return 0

    def keys(self) -> Any:
        self.calls.append("keys")
        return ["name", "permissions"]

    def items(self) -> Any:
        self.calls.append("items")
        return [("name", "p"), ("permissions", {"fs": ["rw:./*"]})]

    def values(self) -> Any:
        self.calls.append("values")
        return []

    def get(self, key: str, default: object = None) -> object:
        self.calls.append("get")
        return default

    def __contains__(self, key: object) -> bool:
        self.calls.append("__contains__")
        return True


class HostileList(list[str]):
    calls: ClassVar[list[str]] = []

    def __iter__(self) -> Iterator[str]:
        self.calls.append("__iter__")
        return iter(["rw:./*"])

    def __len__(self) -> int:
        self.calls.append("__len__")
        return 1

    def __getitem__(self, index: Any) -> Any:
        self.calls.append("__getitem__")
        return "rw:./*"


@pytest.fixture(autouse=True)
def _fresh_calls() -> None:
    HostileDict.calls = []
    HostileList.calls = []


def test_a_dict_subclass_is_read_as_the_dict_it_stores_without_calling_its_methods() -> None:
    data = HostileDict({"name": "p", "permissions": {"fs": ["./a/*"]}})
    manifest = load_manifest(data)
    assert manifest.permissions.fs == ("./a/*",)  # what it stores, not what `items()` says
    assert HostileDict.calls == []


def test_a_nested_dict_and_list_subclass_are_read_the_same_way() -> None:
    permissions = HostileDict({"fs": HostileList(["./a/*"])})
    manifest = load_manifest({"name": "p", "permissions": permissions})
    assert manifest.permissions.fs == ("./a/*",)
    assert HostileDict.calls == [] and HostileList.calls == []


def test_a_dict_subclass_cannot_hide_its_size_from_the_bound() -> None:
    data = HostileDict({"name": "p", "permissions": {"fs": HostileList(["./a/*"] * 20_000)}})
    assert _problem(_refused(data))["type"] == "too_long"
    assert HostileDict.calls == [] and HostileList.calls == []


class CountingMapping(Mapping[str, object]):
    """A Mapping that is not a dict: refused without a method of it being called."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getitem__(self, key: str) -> object:
        self.calls.append("__getitem__")
        return "p"

    def __iter__(self) -> Iterator[str]:
        self.calls.append("__iter__")
        return iter(["name"])

    def __len__(self) -> int:
        self.calls.append("__len__")
        return 1


def test_a_mapping_that_is_not_a_dict_is_refused_without_being_read() -> None:
    mapping = CountingMapping()
    problem = _problem(_refused(mapping))
    assert (problem["path"], problem["type"]) == ("", "not_plain_data")
    assert mapping.calls == []
    nested = CountingMapping()
    problem = _problem(_refused({"name": "p", "permissions": nested}))
    assert (problem["path"], problem["type"]) == ("permissions", "not_plain_data")
    assert nested.calls == []
    proxy = types.MappingProxyType({"name": "p"})
    assert _problem(_refused(proxy))["type"] == "not_plain_data"


class LoudStr(str):
    calls: ClassVar[list[str]] = []

    def __eq__(self, other: object) -> bool:
        LoudStr.calls.append("__eq__")
        return True

    def __hash__(self) -> int:
        LoudStr.calls.append("__hash__")
        return 0

    def __str__(self) -> str:
        LoudStr.calls.append("__str__")
        return "rw:./*"


def test_a_str_subclass_value_or_key_is_refused_without_calling_it() -> None:
    as_value = {"name": "p", "permissions": {"fs": [LoudStr("./a/*")]}}
    as_key = {"name": "p", LoudStr("permissions"): {}}  # hashed here, by the test
    LoudStr.calls = []
    problem = _problem(_refused(as_value))
    assert (problem["path"], problem["type"]) == ("permissions.fs[0]", "not_plain_data")
    problem = _problem(_refused(as_key))
    assert (problem["path"], problem["type"]) == ("", "not_plain_data")
    assert LoudStr.calls == []


def test_rules_from_a_generator_or_a_set_are_refused_without_being_pulled() -> None:
    pulled = [0]

    def rules() -> Iterator[str]:
        for i in range(20_000):
            pulled[0] += 1
            yield f"./g{i}/*"

    problem = _problem(_refused({"name": "p", "permissions": {"fs": rules()}}))
    assert (problem["path"], problem["type"]) == ("permissions.fs", "not_plain_data")
    assert pulled[0] == 0
    problem = _problem(_refused({"name": "p", "permissions": {"fetch": {"a.example"}}}))
    assert (problem["path"], problem["type"]) == ("permissions.fetch", "not_plain_data")


def test_plain_data_of_every_kind_a_manifest_holds_still_loads(tmp_path: Path) -> None:
    data = {
        "name": "p",
        "version": "1.0",
        "kind": "python",
        "permissions": {
            "fs": ("./a/*",),  # a tuple, as `Manifest.model_dump` gives
            "fetch": ["a.example"],
            "budgets": {"cpuPercent": 12.5, "memoryMb": 64, "wallClockMs": 1000},
        },
        "database": {"tablePrefix": "p_", "migrations": None},
        "secrets": [{"name": "TOKEN"}],
        "events": {"publishes": ["a.b"], "subscribes": []},
    }
    manifest = load_manifest(data)
    assert load_manifest(manifest.to_dict()) == manifest
    toml = tmp_path / "m.toml"
    toml.write_text('name = "p"\nversion = 1979-05-27\n')  # a TOML date: a field error
    assert _problem(_refused(toml))["path"] == "version"


class _LoudMeta(type):
    """A metaclass whose hash and equality are host code: a type lookup must not run them."""

    def __hash__(cls) -> int:
        raise AssertionError("the walk hashed a value's type")

    def __eq__(cls, other: object) -> bool:
        raise AssertionError("the walk compared a value's type")


class _Opaque(metaclass=_LoudMeta):
    pass


def test_a_value_of_a_foreign_type_is_refused_without_its_type_being_hashed() -> None:
    problem = _problem(_refused({"name": "p", "version": _Opaque()}))
    assert (problem["path"], problem["type"]) == ("version", "not_plain_data")
