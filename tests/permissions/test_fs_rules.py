"""FsRuleSet: the path vectors, rule compilation errors and preopens."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from suaveplan_sandbox.permissions._decision import Allow, Deny, DenyReason
from suaveplan_sandbox.permissions._fs_rules import (
    FsRuleError,
    FsRuleSet,
    Preopen,
    _glob_or_directory,
    normalize_request_path,
)
from suaveplan_sandbox.permissions._glob import compile_glob

_VECTORS = json.loads(
    (Path(__file__).parent.parent / "vectors" / "paths.json").read_text(encoding="utf-8")
)
_CASES: list[dict[str, Any]] = _VECTORS["cases"]


def test_path_vectors_carry_provenance_and_enough_cases() -> None:
    assert _VECTORS["provenance"]
    assert len(_CASES) >= 80
    assert all(case["note"] for case in _CASES)


@pytest.mark.parametrize("case", _CASES, ids=[case["note"] for case in _CASES])
def test_path_vector(case: dict[str, Any]) -> None:
    rules = FsRuleSet(case["rules"])
    decision = rules.check(case["input"], case.get("mode", "read"))
    if case["expect"] == "allow":
        assert isinstance(decision, Allow)
        assert decision.rule == case["rule"]
    else:
        assert decision == Deny(capability="fs", reason=DenyReason(case["expect"]))


def test_allow_names_the_root_relative_target() -> None:
    rules = FsRuleSet(["./uploads/*", "./"])
    assert rules.check("/uploads/./a//b.png") == Allow(rule="./uploads/*", target="uploads/a/b.png")
    assert rules.check("/") == Allow(rule="./", target=".")


def test_rules_are_kept_verbatim() -> None:
    text = ["uploads//*", "rw:./data/*", "./config.json"]
    assert FsRuleSet(text).rules == tuple(text)


@pytest.mark.parametrize(
    ("rule", "index"),
    [
        ("/etc/*", 0),
        ("rw:/etc/*", 0),
        ("./../etc/*", 0),
        ("./uploads/../../x", 0),
        ("..", 0),
        ("", 0),
        ("rw:", 0),
        ("./a\0b", 0),
        ("./" + "a" * 256, 0),
        ("./" + "a/" * 2100, 0),
    ],
    ids=[
        "absolute",
        "absolute-rw",
        "leading-dotdot",
        "inner-dotdot",
        "bare-dotdot",
        "empty",
        "empty-after-rw",
        "nul",
        "long-segment",
        "long-rule",
    ],
)
def test_malformed_rules_are_rejected_at_construction(rule: str, index: int) -> None:
    with pytest.raises(FsRuleError) as info:
        FsRuleSet([rule])
    assert info.value.index == index
    assert info.value.message


def test_rule_error_names_the_index_of_the_bad_rule() -> None:
    with pytest.raises(FsRuleError) as info:
        FsRuleSet(["./ok/*", "./fine", "/bad"])
    assert info.value.index == 2
    assert isinstance(info.value, ValueError)


def test_non_string_rule_is_rejected() -> None:
    with pytest.raises(FsRuleError):
        FsRuleSet([42])  # type: ignore[list-item]


def test_dotdot_inside_a_name_is_not_traversal() -> None:
    rules = FsRuleSet(["./a..b/*"])
    assert rules.check("a..b/c").allowed


def test_preopens_only_express_whole_directories() -> None:
    rules = FsRuleSet(
        ["./uploads/*", "rw:./data/*", "./data/*.json", "./up*", "./config.json", "./cache/", "./*"]
    )
    assert rules.preopens() == (
        Preopen(rule="./uploads/*", index=0, directory="uploads", writable=False),
        Preopen(rule="rw:./data/*", index=1, directory="data", writable=True),
        Preopen(rule="./data/*.json", index=2, directory=None, writable=False),
        Preopen(rule="./up*", index=3, directory=None, writable=False),
        Preopen(rule="./config.json", index=4, directory=None, writable=False),
        Preopen(rule="./cache/", index=5, directory=None, writable=False),
        Preopen(rule="./*", index=6, directory=".", writable=False),
    )


def test_a_star_in_the_directory_part_is_not_a_preopen() -> None:
    (preopen,) = FsRuleSet(["./a*/b/*"]).preopens()
    assert preopen.directory is None


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("/", "."),
        (".", "."),
        ("./a/", "a"),
        ("//a//b/", "a/b"),
        ("a/./b/../c", "a/c"),
        ("../a", DenyReason.PATH_NOT_IN_ALLOWLIST),
        ("a/../..", DenyReason.PATH_NOT_IN_ALLOWLIST),
        ("", DenyReason.INVALID_PATH),
        (b"a", DenyReason.INVALID_PATH),
        ("a\0", DenyReason.INVALID_PATH),
    ],
)
def test_normalize_request_path_is_lexical(raw: object, expected: str | DenyReason) -> None:
    assert normalize_request_path(raw) == expected


def test_star_spans_slashes() -> None:
    assert FsRuleSet(["./a/*"]).check("a/b/c/d/e").allowed


def test_write_needs_an_rw_rule_even_when_a_read_rule_matches() -> None:
    rules = FsRuleSet(["./data/*"])
    assert rules.check("data/x", "write") == Deny(
        capability="fs", reason=DenyReason.MODE_NOT_PERMITTED
    )


def test_many_rules_do_not_change_decisions() -> None:
    rules = FsRuleSet([f"./dir{i}/*" for i in range(2000)] + ["./x/*.json", "./exact"])
    assert rules.check("dir1999/a").allowed
    assert rules.check("dir1999x/a") == Deny(
        capability="fs", reason=DenyReason.PATH_NOT_IN_ALLOWLIST
    )
    assert rules.check("x/y/z.json").allowed
    assert rules.check("exact").allowed
    assert not rules.check("exact/a").allowed


# -- glob matching without backtracking ------------------------------------------------------


def _regex_model(pattern: str) -> re.Pattern[str]:
    """The regex translation the rules used before `_glob` (correct, but it backtracks)."""
    parts = [re.escape(p) for p in pattern.split("*")]
    if pattern == "*":
        return re.compile(r"(?:\.|.*)", re.DOTALL)
    if pattern.endswith("/*"):
        return re.compile(".*".join(parts[:-1])[: -len(re.escape("/"))] + r"(?:/.*)?", re.DOTALL)
    return re.compile(".*".join(parts), re.DOTALL)


# The shapes that reach a glob test: a `*` somewhere, and `dir/*` only with another `*`.
_GLOB_TEXT = st.text(alphabet="ab/.*", min_size=1, max_size=10).filter(
    lambda p: "*" in p and not (p.endswith("/*") and "*" not in p[:-2])
)


@settings(max_examples=500, deadline=None)
@given(_GLOB_TEXT, st.lists(st.text(alphabet="ab/.", max_size=12), max_size=8))
def test_glob_matcher_agrees_with_the_regex_translation(pattern: str, targets: list[str]) -> None:
    matcher = _glob_or_directory(pattern) if pattern.endswith("/*") else compile_glob(pattern)
    for target in [*targets, ".", pattern.replace("*", ""), pattern.replace("*", "ab")]:
        want = _regex_model(pattern).fullmatch(target) is not None
        assert (matcher(target) is not None) == want, (pattern, target)


@pytest.mark.timeout(60)  # a hang detector: with backtracking this takes hours
@pytest.mark.parametrize(
    "rule",
    [
        "./" + "*" * 200 + "x/*",
        "./" + "/".join(["*a" * 100] * 4) + "*/z",  # 400 stars over four segments
        "rw:./" + "a*" * 120 + "b",
    ],
)
def test_star_heavy_rules_decide_long_paths_without_backtracking(rule: str) -> None:
    from suaveplan_sandbox.permissions import _accel

    target = "a/" * 1900 + "c"  # about 3.8 KB, just inside the path limit
    with _accel.pure_python():
        slow = FsRuleSet([rule])
    fast = FsRuleSet([rule])
    for rules in (slow.check, fast.fast_check):
        for mode in ("read", "write"):
            assert rules(target, mode) == Deny(
                capability="fs", reason=DenyReason.PATH_NOT_IN_ALLOWLIST
            )
