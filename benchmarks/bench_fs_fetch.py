"""fs and fetch rule matching: rule-count independence and cost against bare baselines."""

from __future__ import annotations

import fnmatch
import itertools
import posixpath
from collections.abc import Callable

import ada_url

from benchmarks._harness import BenchRow, measure, ratio_row
from suaveplan_sandbox.permissions._fetch_rules import FetchRuleSet
from suaveplan_sandbox.permissions._fs_rules import FsRuleSet

_PATH = "./uploads/2024/03/photo.png"
_URL = "https://eu.api.stripe.com/v1/charges"


def _fs_rules(count: int) -> list[str]:
    rules = ["./uploads/*"]
    for i in range(count - 1):
        kind = i % 4
        if kind == 0:
            rules.append(f"./dir{i}/*")
        elif kind == 1:
            rules.append(f"rw:./data{i}/*.json")
        elif kind == 2:
            rules.append(f"./files/f{i}.txt")
        else:
            rules.append(f"./uploads{i}/*")  # shares the literal prefix "uploads"
    return rules


def _fetch_rules(count: int) -> list[str]:
    rules = ["*.stripe.com"]
    for i in range(count - 1):
        rules.append(f"*.zone{i}.example" if i % 2 else f"api{i}.example.com")
    return rules


def _cycle(items: list[str]) -> Callable[[], str]:
    return itertools.cycle(items).__next__


def run() -> list[BenchRow]:
    """Cold rows cycle through 10,000 distinct inputs (more than the decision memo holds, so
    every call is a miss); hot rows repeat one input (memo hits). Baselines see the same inputs."""
    rows: list[BenchRow] = []
    paths = [f"./uploads/2024/{i:05d}/photo.png" for i in range(10_000)]
    urls = [f"https://eu{i}.api.stripe.com/v1/charges" for i in range(10_000)]

    one = FsRuleSet(_fs_rules(1))
    many_rules = _fs_rules(10_000)
    many = FsRuleSet(many_rules)
    assert one.check(_PATH).allowed and many.check(_PATH).allowed
    nxt = _cycle(paths)
    fs_one = measure(lambda: one.check(nxt()))
    fs_many = measure(lambda: many.check(nxt()))
    normpath_cold = measure(lambda: posixpath.normpath(nxt()))
    fs_hot = measure(lambda: one.check(_PATH))
    normpath_hot = measure(lambda: posixpath.normpath(_PATH))
    patterns = [r.removeprefix("rw:").removeprefix("./") for r in many_rules]
    target = posixpath.normpath(_PATH)

    def naive() -> bool:
        return any(fnmatch.fnmatchcase(target, p) for p in reversed(patterns))

    naive_s = measure(naive, repeat=3)
    rows.append(
        ratio_row(
            "check_fs cold, 10,000 rules", fs_many, "check_fs cold, 1 rule", fs_one, at_most=1.5
        )
    )
    rows.append(
        ratio_row(
            "check_fs cold, 10,000 rules",
            fs_many,
            "fnmatchcase loop, 10,000 rules",
            naive_s,
            at_least_faster=1000,
        )
    )
    rows.append(
        ratio_row(
            "check_fs hot, 10,000 rules",
            measure(lambda: many.check(_PATH)),
            "fnmatchcase loop, 10,000 rules",
            naive_s,
            at_least_faster=1000,
        )
    )
    rows.append(
        ratio_row("check_fs cold, 1 rule", fs_one, "posixpath.normpath", normpath_cold, at_most=4)
    )
    rows.append(
        ratio_row("check_fs hot, 1 rule", fs_hot, "posixpath.normpath", normpath_hot, at_most=4)
    )

    nxt_url = _cycle(urls)
    parse_cold = measure(lambda: ada_url.URL(nxt_url()))
    parse_hot = measure(lambda: ada_url.URL(_URL))
    for count in (1, 100, 10_000):
        rules = FetchRuleSet(_fetch_rules(count))
        assert rules.check(_URL).allowed
        cold = measure(lambda rules=rules: rules.check(nxt_url()))  # type: ignore[misc]
        hot = measure(lambda rules=rules: rules.check(_URL))  # type: ignore[misc]
        rows.append(
            ratio_row(
                f"check_fetch cold, {count:,} rules",
                cold,
                "ada_url.URL(url)",
                parse_cold,
                at_most=1.5,
            )
        )
        rows.append(
            ratio_row(
                f"check_fetch hot, {count:,} rules",
                hot,
                "ada_url.URL(url)",
                parse_hot,
                at_most=1.5,
            )
        )
    return rows
