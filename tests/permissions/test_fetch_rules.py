"""FetchRuleSet: the URL vectors, rule compilation errors, raw host checks and parsing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from suaveplan_sandbox.permissions._decision import Allow, Deny, DenyReason
from suaveplan_sandbox.permissions._fetch_rules import (
    FetchRuleError,
    FetchRuleSet,
    ParsedUrl,
    canonical_host,
    parse_url,
)

_VECTORS = json.loads(
    (Path(__file__).parent.parent / "vectors" / "urls.json").read_text(encoding="utf-8")
)
_CASES: list[dict[str, Any]] = _VECTORS["cases"]


def test_url_vectors_carry_provenance_and_enough_cases() -> None:
    assert _VECTORS["provenance"]
    assert len(_CASES) >= 80
    assert all(case["note"] for case in _CASES)


@pytest.mark.parametrize("case", _CASES, ids=[case["note"] for case in _CASES])
def test_url_vector(case: dict[str, Any]) -> None:
    rules = FetchRuleSet(case["rules"])
    decision = rules.check(case["input"])
    if case["expect"] == "allow":
        assert isinstance(decision, Allow)
        assert decision.rule == case["rule"]
    else:
        assert decision == Deny(capability="fetch", reason=DenyReason(case["expect"]))


def test_allow_carries_the_whatwg_serialised_href() -> None:
    decision = FetchRuleSet(["api.stripe.com"]).check("HTTPS://API.stripe.com:443\\v1\\charges")
    assert decision == Allow(rule="api.stripe.com", target="https://api.stripe.com/v1/charges")


def test_rules_are_kept_verbatim() -> None:
    text = ["API.Stripe.com.", "*.example.com", "http:localhost:8080"]
    assert FetchRuleSet(text).rules == tuple(text)


@pytest.mark.parametrize(
    "rule",
    [
        "",
        "http:",
        "https://api.stripe.com",
        "ftp:api.stripe.com",
        "api.stripe.com/v1",
        "api..stripe.com",
        ".stripe.com",
        "*",
        "*.",
        "**.stripe.com",
        "api.*.com",
        "*stripe.com",
        "a*.stripe.com",
        "api.stripe.com:0",
        "api.stripe.com:65536",
        "api.stripe.com:",
        "api.stripe.com:http",
        "api.stripe.com:+1",
        "[::1",
        "[::1]x",
        "::1",
        "user@api.stripe.com",
        "api stripe.com",
        "api.stripe.com?x",
        "api.stripe.com#x",
        "*.1.2.3",
        "*.[::1]",
        "999.0.0.1",
    ],
)
def test_malformed_rules_are_rejected_at_construction(rule: str) -> None:
    with pytest.raises(FetchRuleError) as info:
        FetchRuleSet(["ok.example", rule])
    assert info.value.index == 1
    assert info.value.message
    assert isinstance(info.value, ValueError)


def test_non_string_rule_is_rejected() -> None:
    with pytest.raises(FetchRuleError):
        FetchRuleSet([None])  # type: ignore[list-item]


def test_check_host_normalises_like_a_rule_host() -> None:
    rules = FetchRuleSet(["api.stripe.com", "*.example.com:5432", "[::1]:8080", "10.0.0.1"])
    assert rules.check_host("API.Stripe.com.", 443) == Allow(
        rule="api.stripe.com", target="api.stripe.com:443"
    )
    assert rules.check_host("db.example.com", 5432) == Allow(
        rule="*.example.com:5432", target="db.example.com:5432"
    )
    assert rules.check_host("::1", 8080) == Allow(rule="[::1]:8080", target="[::1]:8080")
    assert rules.check_host("[::1]", 8080).allowed
    assert rules.check_host("0x0a.1", 22) == Allow(rule="10.0.0.1", target="10.0.0.1:22")


def test_check_host_ignores_the_http_prefix() -> None:
    assert FetchRuleSet(["http:legacy.example"]).check_host("legacy.example", 80).allowed


@pytest.mark.parametrize(
    ("host", "port", "reason"),
    [
        ("example.com", 5432, DenyReason.HOST_NOT_IN_ALLOWLIST),
        ("db.example.com", 5433, DenyReason.HOST_NOT_IN_ALLOWLIST),
        ("api.stripe.com", 0, DenyReason.INVALID_URL),
        ("api.stripe.com", 65536, DenyReason.INVALID_URL),
        ("api.stripe.com", True, DenyReason.INVALID_URL),
        ("api.stripe.com", "443", DenyReason.INVALID_URL),
        ("api.stripe.com", 443.0, DenyReason.INVALID_URL),
        (b"api.stripe.com", 443, DenyReason.INVALID_URL),
        ("", 443, DenyReason.INVALID_URL),
        ("api.stripe.com/x", 443, DenyReason.INVALID_URL),
        ("evil.com@api.stripe.com", 443, DenyReason.INVALID_URL),
        ("api.stripe.com:443", 443, DenyReason.INVALID_URL),
        ("api.stri\npe.com", 443, DenyReason.INVALID_URL),
        ("::ffff:10.0.0.1", 22, DenyReason.HOST_NOT_IN_ALLOWLIST),
    ],
)
def test_check_host_denies(host: object, port: object, reason: DenyReason) -> None:
    rules = FetchRuleSet(["api.stripe.com", "*.example.com:5432", "10.0.0.1"])
    assert rules.check_host(host, port) == Deny(capability="fetch", reason=reason)


def test_parse_url_reports_the_effective_port() -> None:
    assert parse_url("https://User@Example.COM./a") == ParsedUrl(
        href="https://User@example.com./a",
        scheme="https",
        host="example.com",
        port=443,
        is_ip=False,
    )
    parsed = parse_url("http://[::1]:8080")
    assert parsed is not None
    assert (parsed.scheme, parsed.host, parsed.port, parsed.is_ip) == ("http", "[::1]", 8080, True)
    ipv4 = parse_url("https://2130706433")
    assert ipv4 is not None
    assert (ipv4.host, ipv4.is_ip) == ("127.0.0.1", True)


@pytest.mark.parametrize("url", ["", "nope", "https://", None, 3, b"https://a.com"])
def test_parse_url_returns_none_for_what_does_not_parse(url: object) -> None:
    assert parse_url(url) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Example.COM.", "example.com"),
        ("b\u00fccher.de", "xn--bcher-kva.de"),
        ("0177.1", "127.0.0.1"),
        ("[0::1]", "[::1]"),
        ("[::FFFF:1.2.3.4]", "[::ffff:102:304]"),
        ("a/b", None),
        ("a@b", None),
        ("", None),
        (".", None),
        ("a b", None),
    ],
)
def test_canonical_host_matches_url_host_normalisation(text: str, expected: str | None) -> None:
    assert canonical_host(text) == expected


def test_wildcard_finds_the_right_rule_among_many() -> None:
    rules = FetchRuleSet(
        [f"host{i}.example" for i in range(1000)] + [f"*.zone{i}.example" for i in range(1000)]
    )
    assert rules.check("https://a.b.zone999.example/") == Allow(
        rule="*.zone999.example", target="https://a.b.zone999.example/"
    )
    assert not rules.check("https://zone999.example/").allowed
    assert not rules.check("https://a.xzone999.example/").allowed
    assert rules.check("https://host0.example/").allowed


def _wrapper_view(url: str) -> ParsedUrl | None:
    """The same parse through ada's Python wrapper: the reference for our C-API slicing."""
    import ada_url

    try:
        parsed = ada_url.URL(url)
    except ValueError:
        return None
    scheme = parsed.protocol[:-1]
    host = parsed.hostname.removesuffix(".")
    port = int(parsed.port) if parsed.port else {"https": 443, "http": 80}.get(scheme, 0)
    is_ip = parsed.host_type in (ada_url.HostType.IPV4, ada_url.HostType.IPV6)
    return ParsedUrl(href=parsed.href, scheme=scheme, host=host, port=port, is_ip=is_ip)


_PARSE_INPUTS = sorted(
    {case["input"] for case in _CASES if isinstance(case["input"], str)}
    | {
        "https://u:p@h.example:8080/x",
        "https://u@h.example/",
        "https://@h.example/",
        "https://:@h.example/",
        "http://[::1]:80/",
        "https://h.example./",
        "https://H.EXAMPLE:443/a?b#c",
        "http://0x7f.1/",
        "https://xn--bcher-kva.example/",
        "https://bücher.example/",
        "https://a%40b@h.example/",
        "https://user:p%3Ass@[2001:db8::1]:8443/",
        "ftp://files.example/x",
        "file:///etc/passwd",
        "data:text/plain,hi",
        "HTTPS://example.com",
    }
)


@pytest.mark.parametrize("url", _PARSE_INPUTS)
def test_parse_url_slices_agree_with_the_ada_wrapper(url: str) -> None:
    assert parse_url(url) == _wrapper_view(url)


_URL_PIECES = st.builds(
    "{}://{}{}{}{}".format,
    st.sampled_from(["https", "http", "HTTP", "ftp", "ws"]),
    st.sampled_from(["", "u@", "u:p@", "@", ":@", "a%40b:c@", "x@y@"]),
    st.sampled_from(["h.example", "H.Example.", "1.2.3.4", "0x7f.1", "[::1]", "bücher.de", "a..b"]),
    st.sampled_from(["", ":443", ":80", ":8080", ":0", ":65536", ":"]),
    st.sampled_from(["", "/", "/p?q#f", "\\x", "?@evil.example"]),
)


@settings(max_examples=300, deadline=None)
@given(_URL_PIECES)
def test_generated_urls_parse_like_the_ada_wrapper(url: str) -> None:
    assert parse_url(url) == _wrapper_view(url)


# Rules spread over exact hosts, `*.suffix` of several label counts, ports and `http:`, so the
# inlined decision path meets every branch (scheme, port, IP, suffix walk, lowest index).
_MODEL_RULES = [
    "h.example:8080",
    "*.example",
    "http:1.2.3.4",
    "*.b.h.example",
    "http:*.h.example:80",
    "[::1]",
    "xn--bcher-kva.de",
]


def _explicit_port(url: str) -> str:
    """The port the URL spells out, as the ada wrapper serialises it ("" when none is)."""
    import ada_url

    return str(ada_url.URL(url).port)


def _model_decision(url: str) -> Allow | Deny:
    """The decision rebuilt from the wrapper's parse and the rules' documented meaning."""
    parsed = _wrapper_view(url)
    if parsed is None:
        return Deny(capability="fetch", reason=DenyReason.INVALID_URL)
    if _explicit_port(url) == "0":  # port 0 names no destination: refused with the parse
        return Deny(capability="fetch", reason=DenyReason.INVALID_URL)
    if parsed.scheme not in ("https", "http"):
        return Deny(capability="fetch", reason=DenyReason.SCHEME_NOT_PERMITTED)
    matched = False
    for text in _MODEL_RULES:
        http = text.startswith("http:")
        body = text.removeprefix("http:")
        host, port = body, None
        if body.rpartition(":")[2].isdigit() and not body.endswith("]"):
            host, _, port_text = body.rpartition(":")
            port = int(port_text)
        if port is not None and port != parsed.port:
            continue
        if host.startswith("*."):
            hit = not parsed.is_ip and parsed.host.endswith(host[1:])
        else:
            hit = parsed.host == host
        if hit:
            matched = True
            if parsed.scheme == "https" or http:
                return Allow(rule=text, target=parsed.href)
    reason = DenyReason.SCHEME_NOT_PERMITTED if matched else DenyReason.HOST_NOT_IN_ALLOWLIST
    return Deny(capability="fetch", reason=reason)


_MODEL_URLS = st.builds(
    "{}://{}{}{}{}".format,
    st.sampled_from(["https", "http", "HTTP", "ftp", "ws", "file"]),
    st.sampled_from(["", "u@", "u:p@", "@", "a%40b:c@"]),
    st.sampled_from(
        [
            "h.example",
            "H.Example.",
            "a.h.example",
            "x.b.h.example",
            "b.h.example",
            "example",
            "1.2.3.4",
            "0x1.2.3.4",
            "[::1]",
            "[0:0::1]",
            "bücher.de",
            "a1",
            "a.example1",
        ]
    ),
    st.sampled_from(["", ":443", ":80", ":8080", ":0", ":65536"]),
    st.sampled_from(["", "/", "/p?q#f"]),
)


@settings(max_examples=400, deadline=None)
@given(_MODEL_URLS)
def test_inlined_decision_agrees_with_a_wrapper_based_model(url: str) -> None:
    assert FetchRuleSet(_MODEL_RULES).check(url) == _model_decision(url)


@pytest.mark.parametrize(
    "url", ["http://1.2.3.4/", "http://0x1.2.3.4/", "http://[::ffff:1.2.3.4]/", "http://[::1]/"]
)
def test_an_ip_host_never_reaches_a_suffix_bucket(url: str) -> None:
    # Rule validation already refuses `*.3.4`; the decision path must not depend on that
    # alone. A suffix bucket planted behind the validator's back still never matches an IP.
    rules = FetchRuleSet(["*.h.example"])
    planted = rules._suffix["h.example"]
    rules._suffix = {"3.4": planted, "4": planted, "2.3.4": planted, "1": planted}
    rules._suffix_labels = frozenset({1, 2, 3})
    rules._suffix_most = 3
    assert rules.check(url) == Deny(capability="fetch", reason=DenyReason.HOST_NOT_IN_ALLOWLIST)
    assert rules.check("https://a.3.4.example/") == Deny(
        capability="fetch", reason=DenyReason.HOST_NOT_IN_ALLOWLIST
    )
