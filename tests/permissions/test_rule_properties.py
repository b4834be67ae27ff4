"""Properties of path normalisation and rule matching, against `fuzz._reference` models."""

from __future__ import annotations

import posixpath

from hypothesis import given, settings
from hypothesis import strategies as st

from fuzz._reference import reference_allows, reference_normalise
from suaveplan_sandbox.permissions._decision import Allow, DenyReason
from suaveplan_sandbox.permissions._fetch_rules import FetchRuleSet, canonical_host
from suaveplan_sandbox.permissions._fs_rules import FsRuleSet, normalize_request_path

# No `?` or `[`: the reference uses fnmatch, which gives those meaning; our rules do not.
_PATH_SEGMENTS = st.sampled_from(["a", "b", "ab", "a.b", ".", "..", "", "x y", "%2e%2e", "\\"])
_RULE_SEGMENTS = st.sampled_from(["a", "b", "ab", "a*", "*", "*b", "a.b", ".", ""])

paths = st.builds(
    lambda lead, segs, trail: lead + "/".join(segs) + trail,
    st.sampled_from(["", "/", "./", "//"]),
    st.lists(_PATH_SEGMENTS, min_size=1, max_size=6),
    st.sampled_from(["", "/"]),
).filter(bool)

fs_rules = st.builds(
    lambda rw, lead, segs: rw + lead + "/".join(segs),
    st.sampled_from(["", "rw:"]),
    st.sampled_from(["", "./"]),
    st.lists(_RULE_SEGMENTS, min_size=1, max_size=4),
).filter(
    lambda rule: (
        rule.removeprefix("rw:") not in ("", "/") and rule[rule.startswith("rw:") * 3] != "/"
    )
)


@given(paths)
def test_normalisation_is_idempotent(path: str) -> None:
    once = normalize_request_path(path)
    if not isinstance(once, DenyReason):
        assert normalize_request_path(once) == once


@given(paths)
def test_normalisation_agrees_with_a_segment_stack(path: str) -> None:
    expected = reference_normalise(path)
    got = normalize_request_path(path)
    if expected is None:
        assert got == DenyReason.PATH_NOT_IN_ALLOWLIST
    else:
        assert got == expected


@given(st.lists(fs_rules, min_size=1, max_size=4), paths)
def test_an_allowed_path_never_lies_outside_the_root(rules: list[str], path: str) -> None:
    decision = FsRuleSet(rules).check(path)
    if isinstance(decision, Allow):
        assert decision.target is not None
        resolved = posixpath.normpath(posixpath.join("/root", decision.target))
        assert resolved == "/root" or resolved.startswith("/root/")
        assert not decision.target.startswith(("/", "../")) and decision.target != ".."


@settings(max_examples=300)
@given(
    st.lists(fs_rules, min_size=1, max_size=5),
    paths,
    st.sampled_from(["read", "write"]),
)
def test_fs_rule_set_agrees_with_an_fnmatch_reference_model(
    rules: list[str], path: str, mode: str
) -> None:
    target = reference_normalise(path)
    matching = [] if target is None else [r for r in rules if reference_allows(r, target)]
    if mode == "write":
        writable = [r for r in matching if r.startswith("rw:")]
    decision = FsRuleSet(rules).check(path, mode)
    if not matching:
        assert not decision.allowed
        assert getattr(decision, "reason", None) == DenyReason.PATH_NOT_IN_ALLOWLIST
    elif mode == "write" and not writable:
        assert getattr(decision, "reason", None) == DenyReason.MODE_NOT_PERMITTED
    else:
        chosen = writable if mode == "write" else matching
        assert decision == Allow(rule=chosen[0], target=target)


# Labels start with a letter so no last label reads as a WHATWG IPv4 number (e.g. `0x`).
_LABELS = st.text(alphabet="abcxyz019-", min_size=1, max_size=6).filter(
    lambda s: s[0].isalpha() and not s.endswith("-")
)
_DOMAINS = st.lists(_LABELS, min_size=1, max_size=3).map(".".join)


@given(_DOMAINS, _LABELS, st.lists(_LABELS, min_size=0, max_size=2))
def test_star_suffix_never_matches_apex_or_a_non_boundary_suffix(
    suffix: str, glued: str, deeper: list[str]
) -> None:
    rules = FetchRuleSet(["*." + suffix])
    assert not rules.check(f"https://{suffix}/").allowed
    assert not rules.check(f"https://{suffix}./").allowed
    assert not rules.check(f"https://{glued}{suffix}/").allowed
    sub = ".".join([*deeper, glued])
    assert rules.check(f"https://{sub}.{suffix}/").allowed


@given(st.lists(_DOMAINS, min_size=1, max_size=5), _DOMAINS)
def test_exact_and_suffix_hosts_agree_with_an_endswith_model(
    rule_hosts: list[str], host: str
) -> None:
    rules = [("*." + h) if i % 2 else h for i, h in enumerate(rule_hosts)]
    expected = any((host.endswith("." + r[2:]) if r.startswith("*.") else host == r) for r in rules)
    assert FetchRuleSet(rules).check(f"https://{host}/").allowed == expected


@given(_DOMAINS)
def test_canonical_host_is_idempotent(host: str) -> None:
    once = canonical_host(host.upper() + ".")
    assert once is not None
    assert canonical_host(once) == once


_ENTRY_NAMES = st.sampled_from(
    ["a", "b", "ab", "a.b", ".a", "*", "a*", ".", "..", "", "a/b", "a\0", "\udcff", "x" * 256]
)
_LISTED_DIRECTORIES = st.sampled_from([".", "a", "b", "ab", "a/b", "a/a", "a.b", "ab/a*"])


@settings(max_examples=300)
@given(
    st.lists(fs_rules, min_size=1, max_size=4),
    _LISTED_DIRECTORIES,
    st.lists(_ENTRY_NAMES, max_size=8),
)
def test_a_listing_names_exactly_the_entries_a_read_would_be_allowed(
    rules: list[str], directory: str, names: list[str]
) -> None:
    # Whatever shortcut `readable_entries` takes, it shows a name exactly when reading that
    # entry would be allowed, and a name that is not one plain entry never.
    rule_set = FsRuleSet(rules)
    prefix = "" if directory == "." else directory + "/"
    expected = sorted(
        name
        for name in names
        if name not in ("", ".", "..")
        and "/" not in name
        and isinstance(rule_set.check(prefix + name), Allow)
    )
    assert rule_set.readable_entries(directory, names) == expected
