"""Event topic rules: exact names, `*` spanning any characters."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from suaveplan_sandbox.permissions._topic_rules import (
    MAX_TOPIC_LENGTH,
    TopicRuleSet,
    topic_matches,
)


def test_exact_topics_match_only_themselves() -> None:
    rules = TopicRuleSet(["invoice.created"])
    assert rules.match("invoice.created") == "invoice.created"
    assert rules.match("invoice.created.x") is None
    assert rules.match("invoice.create") is None


def test_star_spans_dots() -> None:
    rules = TopicRuleSet(["payment.*"])
    assert rules.match("payment.settled") == "payment.*"
    assert rules.match("payment.card.refunded") == "payment.*"
    assert rules.match("payments.settled") is None


def test_a_subscribe_pattern_must_equal_a_rule_to_be_granted() -> None:
    rules = TopicRuleSet(["payment.*"])
    assert rules.match("payment.*") == "payment.*"
    assert rules.match("*") is None
    assert rules.match("pay*") is None


def test_non_strings_empty_and_overlong_topics_never_match() -> None:
    rules = TopicRuleSet(["*"])
    assert rules.match(None) is None
    assert rules.match("") is None
    assert rules.match("a" * 300) is None


@given(st.text(alphabet="ab.*", max_size=8), st.text(alphabet="ab.", max_size=8))
def test_matching_agrees_with_fnmatch_star_semantics(pattern: str, topic: str) -> None:
    import fnmatch
    import re

    reference = re.fullmatch(fnmatch.translate(pattern), topic)
    assert topic_matches(pattern, topic) == (reference is not None)


@pytest.mark.timeout(60)  # a hang detector: a backtracking regex takes hours on these
@pytest.mark.parametrize(
    "rule", ["*a" * 100 + "*b*", "*" * 200 + "x", "a*" * 100 + "c", "*a" * 120 + "*c"]
)
def test_star_heavy_topic_rules_decide_long_topics_without_backtracking(rule: str) -> None:
    assert len(rule) <= MAX_TOPIC_LENGTH
    topic = "a" * 255 + "."  # at the length limit; ends in none of the rules' tails
    assert TopicRuleSet([rule]).match(topic) is None
    assert topic_matches(rule, topic) is False
    assert topic_matches(rule, rule.replace("*", "")) is True  # every literal, nothing else
