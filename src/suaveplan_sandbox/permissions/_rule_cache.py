"""Compile each distinct rule list once: manifest validation and the policy share the result.

Rule sets are immutable, so sharing is safe. The cache is small and keyed by the verbatim rule
tuple and by whether the C accelerator is in use (`_accel.pure_python()` builds rule sets
without it, and must not be handed one with it); a failed compile raises and is not cached.
"""

from __future__ import annotations

from functools import lru_cache

from suaveplan_sandbox.permissions import _accel
from suaveplan_sandbox.permissions._fetch_rules import FetchRuleSet
from suaveplan_sandbox.permissions._fs_rules import FsRuleSet


def compiled_fs_rules(rules: tuple[str, ...]) -> FsRuleSet:
    return _fs(rules, _accel.fs_matcher() is not None)


def compiled_fetch_rules(rules: tuple[str, ...]) -> FetchRuleSet:
    return _fetch(rules, _accel.fetch_matcher() is not None)


@lru_cache(maxsize=64)
def _fs(rules: tuple[str, ...], accelerated: bool) -> FsRuleSet:
    return FsRuleSet(rules)


@lru_cache(maxsize=64)
def _fetch(rules: tuple[str, ...], accelerated: bool) -> FetchRuleSet:
    return FetchRuleSet(rules)
