"""Event topic rules: exact names, with `*` matching any run of characters."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Final, final

from suaveplan_sandbox.permissions._glob import compile_glob

MAX_TOPIC_LENGTH: Final = 256
_TOPIC_CHARS: Final = re.compile(r"[A-Za-z0-9_.:/*\-]+")


def validate_topic_rule(rule: object) -> str | None:
    """None if `rule` is a well-formed topic rule, else a message saying why not."""
    if not isinstance(rule, str) or not rule:
        return "topic rules are non-empty strings"
    if len(rule) > MAX_TOPIC_LENGTH:
        return f"topic rules are at most {MAX_TOPIC_LENGTH} characters"
    if not _TOPIC_CHARS.fullmatch(rule):
        return "topic rules use letters, digits and _ . : / - * only"
    return None


def topic_matches(pattern: str, topic: str) -> bool:
    """Whether `topic` matches the rule `pattern` (`*` spans any characters, including `.`)."""
    if "*" not in pattern:
        return pattern == topic
    return compile_glob(pattern)(topic) is not None


@final
class TopicRuleSet:
    """A compiled list of topic rules; `match(topic)` returns the first rule that grants it."""

    __slots__ = ("_exact", "_patterns", "rules")

    def __init__(self, rules: Sequence[str]) -> None:
        self.rules: tuple[str, ...] = tuple(rules)
        self._exact: dict[str, str] = {}
        self._patterns: list[tuple[str, Callable[[str], object]]] = []
        for rule in self.rules:
            if "*" in rule:
                self._patterns.append((rule, compile_glob(rule)))
            else:
                self._exact.setdefault(rule, rule)

    def match(self, topic: object) -> str | None:
        if not isinstance(topic, str) or not topic or len(topic) > MAX_TOPIC_LENGTH:
            return None
        if "*" in topic:
            # A concrete topic never contains `*`; a subscribe pattern must equal a rule.
            return self._exact.get(topic) or next(
                (rule for rule, _ in self._patterns if rule == topic), None
            )
        hit = self._exact.get(topic)
        if hit is not None:
            return hit
        for rule, fullmatch in self._patterns:
            if fullmatch(topic) is not None:
                return rule
        return None
