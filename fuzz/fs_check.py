"""Fuzz target: the C fs matcher (`_speedups.FsMatcher`) against the Python reference check.

Input layout: byte 0 picks how many of the following newline-separated lines are fs rules
(0-3) and, in bit 2, the mode (read or write); the remainder, newlines and all, is the path.
Properties checked for every input:

* compiling the rules raises only `FsRuleError` (a `SAND_MANIFEST_INVALID` upstream);
* the C check and the pure-Python `FsRuleSet.check` of separately built rule sets (neither
  sees the other's memo) return equal decisions, twice (the second is a memo hit), or raise
  the same exception type;
* an allowed target never climbs out of the root.

libFuzzer's coverage comes from the instrumented Python reference; the C side is compared on
every input, and `make asan` runs its tests under AddressSanitizer.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import atheris

with atheris.instrument_imports(include=["suaveplan_sandbox"]):
    from suaveplan_sandbox.permissions import Allow, _accel
    from suaveplan_sandbox.permissions._fs_rules import FsRuleError, FsRuleSet

from fuzz._target import Finding, run_target, vector_cases


def _split(data: bytes) -> tuple[list[str], str, str]:
    head = data[0] if data else 0
    count, mode = head % 4, ("write" if head & 4 else "read")
    text = data[1:].decode("utf-8", "surrogateescape")
    parts = text.split("\n", count)
    if len(parts) <= count:
        return parts, "", mode
    return parts[:count], parts[count], mode


def _outcome(check: object, path: str, mode: str) -> object:
    try:
        return check(path, mode)  # type: ignore[operator]
    except Exception as exc:  # the checker turns any exception into a denial
        return type(exc)


def test_one_input(data: bytes) -> None:
    rules, path, mode = _split(data)
    try:
        with _accel.accelerated():
            fast = FsRuleSet(rules)
        with _accel.pure_python():
            slow = FsRuleSet(rules)
    except FsRuleError:
        return
    for _ in range(2):
        got, want = _outcome(fast.fast_check, path, mode), _outcome(slow.check, path, mode)
        if got != want or type(got) is not type(want):
            raise Finding(f"{rules!r} {path!r} {mode}: C {got!r}, Python {want!r}")
    if isinstance(got, Allow):
        target = got.target or ""
        if target == ".." or target.startswith(("../", "/")):
            raise Finding(f"{rules!r} {path!r}: allowed target {target!r} leaves the root")


def seeds() -> Iterator[bytes]:
    for case in vector_cases("paths"):
        rules: list[str] = case["rules"]
        path = case["input"]
        if type(path) is str and len(rules) <= 3 and all("\n" not in r for r in rules):
            head = len(rules) | (4 if case.get("mode") == "write" else 0)
            text = "\n".join([*rules, path])
            yield bytes([head]) + text.encode("utf-8", "surrogateescape")


if __name__ == "__main__":
    run_target(test_one_input, seeds)
    sys.exit(0)
