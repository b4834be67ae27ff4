"""fs and fetch rule matching: rule-count independence and cost against bare baselines."""

from __future__ import annotations

import fnmatch
import itertools
import posixpath
from collections.abc import Callable

import ada_url

from benchmarks._harness import BenchRow, measure, paired, ratio_row
from suaveplan_sandbox.permissions import PermissionChecker, PermissionPolicy, _accel

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


def _checker(fs: list[str], fetch: list[str]) -> PermissionChecker:
    manifest = {"name": "bench", "version": "1.0.0", "permissions": {"fs": fs, "fetch": fetch}}
    return PermissionChecker(PermissionPolicy.from_manifest(manifest, root="/srv/plugin"))


def _pure(fs: list[str], fetch: list[str]) -> PermissionChecker:
    """The same checker on the pure-Python reference matchers (no C accelerator)."""
    with _accel.pure_python():
        return _checker(fs, fetch)


def run() -> list[BenchRow]:
    """The checks run on the C accelerator when it is built (`speedups_status()`), and the
    two "pure-Python reference" rows compare it with the Python twin it must agree with.
    Cold rows cycle through 10,000 distinct inputs (more than the decision memo holds, so
    every call is a miss); hot rows repeat one input (memo hits). Baselines see the same inputs.
    Cold-against-baseline rows are paired (`_harness.paired`: interleaved batches on thread CPU
    time), since the overheads are smaller than this machine's noise."""
    rows: list[BenchRow] = []
    paths = [f"./uploads/2024/{i:05d}/photo.png" for i in range(10_000)]
    urls = [f"https://eu{i}.api.stripe.com/v1/charges" for i in range(10_000)]

    one = _checker(_fs_rules(1), [])
    many_rules = _fs_rules(10_000)
    many = _checker(many_rules, [])
    assert one.check_fs(_PATH).allowed and many.check_fs(_PATH).allowed
    nxt = _cycle(paths)
    fs_many = measure(lambda: many.check_fs(nxt()))
    patterns = [r.removeprefix("rw:").removeprefix("./") for r in many_rules]
    target = posixpath.normpath(_PATH)

    def naive() -> bool:
        return any(fnmatch.fnmatchcase(target, p) for p in reversed(patterns))

    naive_s = measure(naive, repeat=3)
    rows.append(
        _paired_row(
            "check_fs cold, 10,000 rules",
            lambda: many.check_fs(nxt()),
            "check_fs cold, 1 rule",
            lambda: one.check_fs(nxt()),
            1.5,
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
            measure(lambda: many.check_fs(_PATH)),
            "fnmatchcase loop, 10,000 rules",
            naive_s,
            at_least_faster=1000,
        )
    )
    rows.append(
        _paired_row(
            "check_fs cold, 1 rule",
            lambda: one.check_fs(nxt()),
            "posixpath.normpath",
            lambda: posixpath.normpath(nxt()),
            4,
        )
    )
    pure_one = _pure(_fs_rules(1), [])
    rows.append(
        _paired_row(
            "check_fs cold, 1 rule",
            lambda: one.check_fs(nxt()),
            "the same, pure-Python reference",
            lambda: pure_one.check_fs(nxt()),
            1.0,
        )
    )
    rows.append(
        _paired_row(
            "check_fs hot, 1 rule",
            lambda: one.check_fs(_PATH),
            "posixpath.normpath",
            lambda: posixpath.normpath(_PATH),
            4,
        )
    )

    nxt_url = _cycle(urls)
    parse_cold = lambda: ada_url.URL(nxt_url())  # noqa: E731
    for count in (1, 100, 10_000):
        checker = _checker([], _fetch_rules(count))
        assert checker.check_fetch(_URL).allowed
        rows.append(
            _paired_row(
                f"check_fetch cold, {count:,} rules",
                lambda c=checker: c.check_fetch(nxt_url()),  # type: ignore[misc]
                "ada_url.URL(url)",
                parse_cold,
                1.5,
            )
        )
        rows.append(
            _paired_row(
                f"check_fetch hot, {count:,} rules",
                lambda c=checker: c.check_fetch(_URL),  # type: ignore[misc]
                "ada_url.URL(url)",
                lambda: ada_url.URL(_URL),
                1.5,
            )
        )
    checker, pure = _checker([], _fetch_rules(100)), _pure([], _fetch_rules(100))
    rows.append(
        _paired_row(
            "check_fetch cold, 100 rules",
            lambda: checker.check_fetch(nxt_url()),
            "the same, pure-Python reference",
            lambda: pure.check_fetch(nxt_url()),
            1.0,
        )
    )
    return rows


def _paired_row(
    name: str,
    value: Callable[[], object],
    baseline_name: str,
    baseline: Callable[[], object],
    at_most: float,
) -> BenchRow:
    ratio, base_s = paired(value, baseline)
    return ratio_row(name, ratio * base_s, baseline_name, base_s, at_most=at_most)
