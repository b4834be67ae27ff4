"""fs and fetch rule matching: rule-count independence and cost against bare baselines."""

from __future__ import annotations

import fnmatch
import importlib
import itertools
import posixpath
from collections.abc import Callable
from typing import Any

import ada_url

from benchmarks._harness import BenchRow, measure, paired, ratio_row
from suaveplan_sandbox.permissions import PermissionChecker, PermissionPolicy
from suaveplan_sandbox.permissions._decision import new_allow

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


# Floors: the least any complete checker written in Python must do per uncached check, on the
# benchmark's inputs only (no validation, no mode, no rule index, no ancestor walk). CPython
# 3.11+ implements `posixpath.normpath` in C (~0.2-0.4 µs here, not the ~1 µs the targets
# assumed), and a Python-level dict lookup, a result object and a memo insert cost as much
# again, so these floors sit near the normpath target themselves; the rows below show both.
def _fs_floor(nxt: Callable[[], str]) -> Callable[[], object]:
    buckets = {"uploads": "./uploads/*"}
    memo: dict[str, object] = {}
    normpath = posixpath.normpath

    def floor() -> object:
        path = nxt()
        hit = memo.get(path)
        if hit is not None:
            return hit
        target = normpath(path.lstrip("/"))
        rule = buckets.get(target[: target.find("/")])
        decision = new_allow(rule, target) if rule is not None else None
        if len(memo) >= 4096:
            memo.clear()
        memo[path] = decision
        return decision

    return floor


def _fetch_floor(nxt: Callable[[], str]) -> Callable[[], object]:
    adapter: Any = importlib.import_module("ada_url.ada_adapter")
    lib, unpack = adapter.lib, adapter.ffi.unpack
    parse, href_of, parts_of, free = (
        lib.ada_parse,
        lib.ada_get_href,
        lib.ada_get_components,
        lib.ada_free,
    )
    suffixes = {"stripe.com": "*.stripe.com"}

    def floor() -> object:
        raw = nxt().encode()
        handle = parse(raw, len(raw))
        value = href_of(handle)
        href = unpack(value.data, value.length).decode()
        parts = parts_of(handle)
        host = href[parts.host_start : parts.host_end]
        free(handle)
        rule = suffixes.get(host.partition(".")[2])
        return new_allow(rule, href) if rule is not None else None

    return floor


def run() -> list[BenchRow]:
    """Cold rows cycle through 10,000 distinct inputs (more than the decision memo holds, so
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
    fs_one = measure(lambda: one.check_fs(nxt()))
    fs_many = measure(lambda: many.check_fs(nxt()))
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
    rows.append(
        _paired_row(
            "check_fs cold floor (normpath+lookup+Allow+memo)",
            _fs_floor(nxt),
            "posixpath.normpath",
            lambda: posixpath.normpath(nxt()),
            4,
        )
    )
    rows.append(
        _paired_row(
            "check_fs cold, 1 rule",
            lambda: one.check_fs(nxt()),
            "check_fs cold floor",
            _fs_floor(nxt),
            1.5,
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
    rows.append(
        _paired_row(
            "check_fetch cold floor (parse+href+host+lookup+Allow)",
            _fetch_floor(nxt_url),
            "ada_url.URL(url)",
            parse_cold,
            1.5,
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
