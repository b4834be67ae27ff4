"""Port 0 in a fetch URL is `invalid-url`, in the Python reference and the C matcher alike.

WHATWG parses `https://host:0/` (and `:00`, `:0000`) as port 0; it names no destination, so
the checker refuses it with the parse, before the scheme and the host are looked at, as
`check_host` refuses a raw connect to port 0. The neighbours keep their meaning: 1 and 65535
are ports like any other, 65536 does not parse (WHATWG), and leading zeros are only
spelling (`:0080` is port 80). Each case runs on both implementations and through a
`PermissionChecker`, which counts the denial like any other.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

import pytest

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.metrics import PERMISSION_DENIED, InMemoryMetrics
from suaveplan_sandbox.permissions import (
    PermissionChecker,
    PermissionPolicy,
    _accel,
    load_manifest,
)
from suaveplan_sandbox.permissions._decision import Allow, Deny, DenyReason
from suaveplan_sandbox.permissions._fetch_rules import FetchRuleSet

_RULES = ["*.example.com", "http:plain.example.org", "[::1]", "1.2.3.4", "p.example.net:80"]
_INVALID = Deny(capability="fetch", reason=DenyReason.INVALID_URL)
_Impl = Literal["python", "c"]


@pytest.fixture(params=["python", "c"])
def impl(request: pytest.FixtureRequest) -> Iterator[_Impl]:
    yield request.param


def _rules(impl: _Impl, rules: list[str] = _RULES) -> FetchRuleSet:
    if impl == "c":
        with _accel.accelerated():
            built = FetchRuleSet(rules)
        assert built._matcher is not None
        return built
    with _accel.pure_python():
        built = FetchRuleSet(rules)
    assert built._matcher is None
    return built


def _policy(impl: _Impl, rules: list[str] = _RULES) -> PermissionPolicy:
    manifest = {"name": "ports", "permissions": {"fetch": rules}}
    # The compiled-rule cache is keyed by the implementation too (`_rule_cache`).
    with _accel.accelerated() if impl == "c" else _accel.pure_python():
        policy = PermissionPolicy.from_manifest(manifest, root="/srv")
    assert (policy.fetch._matcher is not None) == (impl == "c")
    return policy


_PORT_ZERO = [
    "https://a.example.com:0/",
    "https://a.example.com:00/",
    "https://a.example.com:0000/",
    "https://a.example.com:0",
    "https://a.example.com:0?q#f",
    "https://A.Example.COM.:0/x",
    "https://user:pw@a.example.com:0/",
    "http://plain.example.org:0/",
    "https://[::1]:0/",
    "https://1.2.3.4:0/",
    "https://0x01.2.3.4:0/",
    "https://a.example.com:\t0/",  # WHATWG strips tabs and newlines anywhere
    "https://a.example.com:0\n/",
    "https://nothing-matches.test:0/",  # invalid before the host is looked at
    "http://a.example.com:0/",  # ...and before the scheme's rule is
    "ftp://a.example.com:0/",  # ...and before the scheme itself
    "ws://a.example.com:0/",
]


@pytest.mark.parametrize("url", _PORT_ZERO)
def test_an_explicit_port_zero_is_an_invalid_url(impl: _Impl, url: str) -> None:
    rules = _rules(impl)
    assert rules.fast_check(url) == _INVALID
    assert rules.fast_check(url) == _INVALID  # the memoised answer is the same


@pytest.mark.parametrize(
    ("url", "rule", "target"),
    [
        ("https://a.example.com:1/", "*.example.com", "https://a.example.com:1/"),
        ("https://a.example.com:65535/", "*.example.com", "https://a.example.com:65535/"),
        ("https://a.example.com:0080/", "*.example.com", "https://a.example.com:80/"),
        ("https://a.example.com:00443/", "*.example.com", "https://a.example.com/"),
        ("https://a.example.com:/", "*.example.com", "https://a.example.com/"),
        ("https://a.example.com:10/", "*.example.com", "https://a.example.com:10/"),
        ("http://plain.example.org:0080/", "http:plain.example.org", "http://plain.example.org/"),
        ("https://[::1]:65535/", "[::1]", "https://[::1]:65535/"),
        ("https://p.example.net:080/", "p.example.net:80", "https://p.example.net:80/"),
    ],
)
def test_the_ports_next_to_zero_keep_their_meaning(
    impl: _Impl, url: str, rule: str, target: str
) -> None:
    assert _rules(impl).fast_check(url) == Allow(rule=rule, target=target)


@pytest.mark.parametrize(
    "url",
    ["https://a.example.com:65536/", "https://a.example.com:99999/", "https://a.example.com:-1/"],
)
def test_a_port_past_65535_does_not_parse(impl: _Impl, url: str) -> None:
    assert _rules(impl).fast_check(url) == _INVALID


def test_port_zero_is_not_a_rule_port_either(impl: _Impl) -> None:
    # `p.example.net:80` matches only port 80; port 0 is refused before any rule is read.
    rules = _rules(impl)
    assert rules.fast_check("https://p.example.net:0/") == _INVALID
    assert rules.fast_check("https://p.example.net:8080/") == Deny(
        capability="fetch", reason=DenyReason.HOST_NOT_IN_ALLOWLIST
    )


@pytest.mark.parametrize("url", ["https://a.example.com:0/", "https://a.example.com:0000/"])
def test_the_checker_counts_a_port_zero_denial_like_any_other(impl: _Impl, url: str) -> None:
    metrics = InMemoryMetrics()
    checker = PermissionChecker(_policy(impl), metrics=metrics)
    assert checker.check_fetch(url) == _INVALID
    assert checker.check_capability("fetch", {"url": url}) == _INVALID
    labels = {"plugin": "ports", "capability": "fetch", "reason": "invalid-url"}
    assert metrics.value(PERMISSION_DENIED.name, **labels) == 2
    assert metrics.value(PERMISSION_DENIED.name) == 2


def test_a_raw_connect_to_port_zero_is_refused_alike(impl: _Impl) -> None:
    metrics = InMemoryMetrics()
    checker = PermissionChecker(_policy(impl), metrics=metrics)
    for port in (0, -1, 65536):
        assert checker.check_connect("a.example.com", port) == _INVALID
    assert isinstance(checker.check_connect("a.example.com", 65535), Allow)
    assert isinstance(checker.check_connect("a.example.com", 1), Allow)
    labels = {"plugin": "ports", "capability": "fetch", "reason": "invalid-url"}
    assert metrics.value(PERMISSION_DENIED.name, **labels) == 3


@pytest.mark.parametrize(
    "rule",
    [
        "api.example.com:0",
        "api.example.com:00",
        "api.example.com:0000",
        "*.example.com:0",
        "http:api.example.com:0",
        "[::1]:0",
        "1.2.3.4:0",
        "api.example.com:65536",
        "api.example.com:000080",  # six digits: not a port, whatever its value
    ],
)
def test_a_manifest_fetch_rule_naming_port_zero_is_a_manifest_error(rule: str) -> None:
    with pytest.raises(SuaveplanError) as info:
        load_manifest({"name": "ports", "permissions": {"fetch": ["ok.example.com", rule]}})
    assert info.value.code == "SAND_MANIFEST_INVALID"
    assert info.value.details["path"] == "permissions.fetch[1]"
    assert info.value.details["index"] == 1


@pytest.mark.parametrize(
    ("rule", "url"),
    [
        ("api.example.com:65535", "https://api.example.com:65535/"),
        ("api.example.com:1", "https://api.example.com:1/"),
        ("api.example.com:0080", "https://api.example.com:80/"),  # leading zeros: port 80
        ("api.example.com:00443", "https://api.example.com/"),
    ],
)
def test_a_manifest_rule_port_next_to_zero_is_accepted_and_matches(
    impl: _Impl, rule: str, url: str
) -> None:
    checker = PermissionChecker(_policy(impl, [rule]))
    assert checker.check_fetch(url) == Allow(rule=rule, target=url)
    assert checker.check_fetch("https://api.example.com:0/") == _INVALID
