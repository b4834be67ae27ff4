"""Compile each distinct rule list once: manifest validation and the policy share the result.

Rule sets are immutable, so sharing is safe. The cache is small and keyed by the verbatim rule
tuple; a failed compile raises and is not cached.
"""

from __future__ import annotations

from functools import lru_cache

from suaveplan_sandbox.permissions._fetch_rules import FetchRuleSet
from suaveplan_sandbox.permissions._fs_rules import FsRuleSet


@lru_cache(maxsize=64)
def compiled_fs_rules(rules: tuple[str, ...]) -> FsRuleSet:
    return FsRuleSet(rules)


@lru_cache(maxsize=64)
def compiled_fetch_rules(rules: tuple[str, ...]) -> FetchRuleSet:
    return FetchRuleSet(rules)
