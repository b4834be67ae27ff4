"""Red-team differentials: what the checker approves is what the adapter must act on."""

from __future__ import annotations

import pytest

from suaveplan_sandbox.permissions._decision import Allow
from suaveplan_sandbox.permissions._fetch_rules import FetchRuleSet, canonical_connect_host


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("straße.de", "xn--strae-oqa.de"),  # UTS #46 keeps ß; IDNA 2003 would map it to ss
        ("faς.gr", "xn--fa-tbc.gr"),  # the same for final sigma (IDNA 2003: xn--fa-wbc.gr)
        ("STRASSE.de.", "strasse.de"),
        ("example\u3002com", "example.com"),  # ideographic full stop is a dot
        ("127.1", "127.0.0.1"),
        ("0x7f.0.0.1", "127.0.0.1"),
        ("2130706433", "127.0.0.1"),
        ("::1", "[::1]"),
        ("[::ffff:127.0.0.1]", "[::ffff:7f00:1]"),
        ("a b.test", None),
        ("user@a.test", None),
        ("a.test/x", None),
        ("", None),
    ],
)
def test_the_connect_host_an_adapter_dials_is_the_one_check_host_judged(
    host: str, expected: str | None
) -> None:
    assert canonical_connect_host(host) == expected
    decision = FetchRuleSet([expected or "a.test"]).check_host(host, 443)
    if expected is None:
        assert not decision.allowed
    else:
        assert isinstance(decision, Allow)
        assert decision.target == f"{expected}:443"


def test_a_non_string_connect_host_has_no_canonical_form() -> None:
    assert canonical_connect_host(None) is None
    assert canonical_connect_host(b"a.test") is None
