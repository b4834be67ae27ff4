"""Building a policy grows close to linearly with the number of rules.

Every build uses fresh rule text so neither our rule cache nor `re`'s pattern cache can hide
the cost of compiling. Each side is the fastest of several builds (the 100-rule build takes
well under a millisecond, so one scheduler hiccup would swing a median-of-few ratio by half);
taking more samples of the small side than of the large one only makes the ratio stricter.
"""

from __future__ import annotations

import itertools
import time

from benchmarks._harness import BenchRow, ratio_row
from suaveplan_sandbox.permissions import PermissionPolicy

_fresh = itertools.count()


def _manifest(n: int) -> dict[str, object]:
    tag = next(_fresh)
    half = n // 2
    return {
        "name": "bench",
        "permissions": {
            "fs": [f"./d{tag}x{i}/*" for i in range(half)],
            "fetch": [
                f"*.h{tag}x{i}.example.com" if i % 2 else f"a{tag}x{i}.example.com"
                for i in range(n - half)
            ],
        },
    }


def _build_time(n: int, repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        manifest = _manifest(n)
        start = time.perf_counter()
        PermissionPolicy.from_manifest(manifest, root="/r")
        samples.append(time.perf_counter() - start)
    return min(samples)


def run() -> list[BenchRow]:
    t_small = _build_time(100, 101)
    t_large = _build_time(10_000, 5)
    return [
        ratio_row(
            "build policy, 10,000 rules",
            t_large,
            "build policy, 100 rules",
            t_small,
            at_most=150,
        )
    ]
