"""The gate's engine-lexer scanner (`_engine_lexemes`) reads text a plugin writes: its cost
must stay linear in that text, up to the longest statement the gate parses.

A string continuation pattern with a nested quantifier backtracked exponentially over a run
of whitespace after a literal with no quote to continue it (0.8 s at 24 spaces, and doubling
with each one more), and a nested comment's close pattern rescanned a run of stars from each
of its positions. Every shape below, at the statement-length limit, is decided in a child
process given a generous deadline: `re` holds the GIL while it backtracks, so no thread of
this process could even notice a hang. A fast machine never passes by luck: the exponential
case would outlast the universe."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from suaveplan_sandbox.permissions._sql_gate import _block_comment_end

_LIMIT = 16 * 1024
_GENEROUS_S = 60.0


def _pad(head: str, filler: str, tail: str = "") -> str:
    return head + filler * ((_LIMIT - len(head) - len(tail)) // len(filler)) + tail


_SHAPES = {
    "spaces-after-a-literal": _pad("SELECT 'a'\n", " ", "x FROM app_t"),
    "newlines-after-a-literal": _pad("SELECT E'a'\n", "\n", "x FROM app_t"),
    "comment-lines-after": _pad("SELECT 'a'\n", "--\n", "x FROM app_t"),
    "dashes-after-a-literal": _pad("SELECT 'a' ", "-"),
    "stars-in-a-comment": _pad("SELECT 1 /*", "*", "*/ FROM app_t"),
    "nested-openers": _pad("SELECT 1 /*", "/*"),
    "close-open-runs": _pad("SELECT 1 /*", "*/*"),
    "doubled-quotes": _pad("SELECT '", "''", "' FROM app_t"),
    "escaped-quotes": _pad("SELECT E'", "\\'", "' FROM app_t"),
    "dollar-runs": _pad("SELECT $a$", "$", "$a$ FROM app_t"),
}

# Decides every shape in both dialects, naming each before it starts.
_DECIDE_ALL = """
import json, sys
from suaveplan_sandbox.permissions._sql_gate import SqlGate
shapes = json.load(sys.stdin)
for dialect in ("postgres", "sqlite"):
    gate = SqlGate("app_", dialect=dialect, cache_size=0)
    for name, sql in shapes.items():
        print(dialect, name, flush=True)
        gate.check_query(sql)
"""


def test_a_statement_at_the_length_limit_is_decided_whatever_its_shape() -> None:
    try:
        done = subprocess.run(
            [sys.executable, "-c", _DECIDE_ALL],
            input=json.dumps(_SHAPES),
            capture_output=True,
            text=True,
            timeout=_GENEROUS_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        last = out.strip().splitlines()[-1:] or ["(none)"]
        pytest.fail(f"the gate did not decide: {last[0]}")
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 2 * len(_SHAPES)


def _scan_l_comment_end(sql: str, pos: int) -> int:
    """PostgreSQL's `xc` state, rule by rule, longest match first: `/*` (`xcstart`, put back
    past the two characters) opens, `\\*+\\/` (`xcstop`) closes, `\\*+` and any other
    character are comment text. -1 if the text ends inside the comment."""
    depth, i, size = 1, pos, len(sql)
    while i < size:
        if sql.startswith("/*", i):
            depth, i = depth + 1, i + 2
        elif sql[i] == "*":
            j = i
            while j < size and sql[j] == "*":
                j += 1
            if j < size and sql[j] == "/":
                depth, i = depth - 1, j + 1
                if depth == 0:
                    return i
            else:
                i = j
        else:
            i += 1
    return -1


@given(st.text(alphabet="/*x\n-'", max_size=60))
def test_the_nested_comment_scan_reads_as_postgres_does(body: str) -> None:
    sql = "/*" + body
    assert _block_comment_end(sql, 2, True) == _scan_l_comment_end(sql, 2)
