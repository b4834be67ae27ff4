"""`SecretRedactor`: a secret value, in the forms diagnostics give it, never survives a scrub."""

from __future__ import annotations

import json
import re
import string
import threading
from collections.abc import Callable
from urllib.parse import quote, quote_plus

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from suaveplan_sandbox.errors import SuaveplanError, _redact
from suaveplan_sandbox.errors._redact import REDACTED, SecretRedactor

SECRET = "s3cr3t=Zq'9 x/\"é\U0001f511\n"

ENCODINGS: dict[str, Callable[[str], str]] = {
    "literal": lambda s: s,
    "percent": lambda s: quote(s, safe=""),
    "percent-lower": lambda s: re.sub("%[0-9A-F]{2}", lambda m: m[0].lower(), quote(s, safe="")),
    "percent-path": lambda s: quote(s, safe="/'=\"é\U0001f511"),  # only some characters
    "form": lambda s: quote_plus(s, safe=""),
    "repr": lambda s: repr(s)[1:-1],
    "ascii": lambda s: ascii(s)[1:-1],
    "json": lambda s: json.dumps(s)[1:-1],
    "json-utf8": lambda s: json.dumps(s, ensure_ascii=False)[1:-1],
    "sql-literal": lambda s: s.replace("'", "''"),
    "bytes-repr": lambda s: repr(s.encode("utf-8"))[2:-1],
}


def _redactor(*values: object) -> SecretRedactor:
    redactor = SecretRedactor()
    for value in values:
        redactor.add(value)
    return redactor


@pytest.mark.parametrize("encoding", sorted(ENCODINGS))
def test_every_form_of_the_value_is_replaced(encoding: str) -> None:
    form = ENCODINGS[encoding](SECRET)
    out = _redactor(SECRET).scrub(f"GET https://h/?token={form}&x=1 failed")
    assert out == f"GET https://h/?token={REDACTED}&x=1 failed"


def test_percent_lower_case_is_a_real_variant() -> None:
    # The lower-case encoding above must differ from the upper-case one for the case to count.
    assert ENCODINGS["percent-lower"](SECRET) != ENCODINGS["percent"](SECRET)


@pytest.mark.parametrize("encoding", ["literal", "percent", "form", "repr", "json"])
def test_long_values_are_matched_in_their_whole_string_forms(encoding: str) -> None:
    value = ("tok en/" * 100)[:700]
    form = ENCODINGS[encoding](value)
    assert _redactor(value).scrub(f"<{form}>") == f"<{REDACTED}>"


def test_the_longest_value_wins_and_others_are_still_found() -> None:
    redactor = _redactor("abc", "abcdef")
    assert redactor.scrub("abcdef abc") == f"{REDACTED} {REDACTED}"


def test_empty_and_non_string_values_are_ignored_and_an_empty_redactor_is_falsy() -> None:
    redactor = _redactor("", None, 7, b"bytes")
    assert not redactor
    assert redactor.scrub("bytes 7") == "bytes 7"
    redactor.add("x1")
    assert redactor
    assert "values=1" in repr(redactor)
    assert "x1" not in repr(redactor)


def test_data_is_scrubbed_in_keys_values_and_depth() -> None:
    redactor = _redactor(SECRET)
    data = {SECRET: [SECRET, 1, None, {"k": json.dumps(SECRET)}], "n": 2.5}
    out = redactor.scrub_data(data)  # type: ignore[arg-type]
    assert SECRET not in repr(out)
    assert out == {REDACTED: [REDACTED, 1, None, {"k": f'"{REDACTED}"'}], "n": 2.5}
    deep: object = SECRET
    for _ in range(100):
        deep = [deep]
    assert SECRET not in repr(redactor.scrub_data(deep))  # type: ignore[arg-type]


def test_an_error_is_scrubbed_through_its_cause_chain_and_keeps_its_code() -> None:
    redactor = _redactor(SECRET)
    inner = SuaveplanError("SAND_FS_NOT_FOUND", f"no {SECRET}", {"path": SECRET})
    outer = SuaveplanError("SAND_VM_PLUGIN_ERROR", "plugin", {"message": repr(SECRET)}, inner)
    clean = redactor.scrub_error(outer)
    assert clean.code == "SAND_VM_PLUGIN_ERROR"
    assert clean.details == {"message": f"'{REDACTED}'"}
    assert isinstance(clean.cause, SuaveplanError)
    assert clean.cause.code == "SAND_FS_NOT_FOUND"
    assert clean.cause.message == f"no {REDACTED}"
    assert SECRET not in repr(clean.to_wire())
    untouched = SuaveplanError("SAND_FS_NOT_FOUND", "nothing secret")
    assert redactor.scrub_error(untouched) is untouched
    assert SecretRedactor().scrub_error(outer) is outer


_FILLER = string.digits + " "


@given(
    st.text(min_size=3, max_size=40).filter(lambda s: s.strip() == s),
    st.sampled_from(sorted(ENCODINGS)),
    st.text(alphabet=_FILLER, max_size=20),
    st.text(alphabet=_FILLER, max_size=20),
)
def test_no_encoded_value_survives_a_scrub(
    value: str, encoding: str, before: str, after: str
) -> None:
    try:
        form = ENCODINGS[encoding](value)
    except UnicodeEncodeError:  # a lone surrogate has no UTF-8 form to leak
        return
    # The check is meaningful only where the form cannot be rebuilt from what is left.
    assume(not set(form) <= set(_FILLER + REDACTED))
    assert form not in _redactor(value).scrub(before + form + after)


# -- matching time and the matcher ---------------------------------------------------------


def _scrubs_within(redactor: SecretRedactor, text: str, seconds: float) -> str | None:
    """The scrubbed text, or None if scrubbing had not finished after `seconds` (a matcher
    that backtracks exponentially would run for hours; the thread is a daemon)."""
    out: list[str] = []
    worker = threading.Thread(target=lambda: out.append(redactor.scrub(text)), daemon=True)
    worker.start()
    worker.join(seconds)
    return out[0] if out else None


@pytest.mark.parametrize("run", ["'", '"', "\\", "'\\"])
def test_a_value_with_a_long_run_of_quotes_or_backslashes_is_matched_in_linear_time(
    run: str,
) -> None:
    # `''` and `'` are both forms of a quote (and `\\`, `\` of a backslash): a backtracking
    # matcher tried every way to split a run of them, 15 s for 30 against 40 in a text.
    value = run * (60 // len(run)) + "k"
    redactor = _redactor(value)
    text = run * (80 // len(run)) + "x"
    assert _scrubs_within(redactor, text, 10.0) == text  # no match, and no hang
    assert _scrubs_within(redactor, f"a {value} b", 10.0) == f"a {REDACTED} b"


def test_values_and_texts_with_lone_surrogates_are_scrubbed() -> None:
    value = "pw\udc80\udcff!"
    redactor = _redactor(value)
    assert redactor.scrub(f"x{value}y\udc81") == f"x{REDACTED}y\udc81"
    assert redactor.scrub("no secret \udc80 here") == "no secret \udc80 here"


@given(
    st.text(alphabet="ab'\"\\%é😀 \n", min_size=1, max_size=8),
    st.lists(st.sampled_from(sorted(ENCODINGS)), max_size=3),
    st.text(alphabet="ab'\"\\%xé ", max_size=12),
)
def test_the_linear_matcher_replaces_what_a_backtracking_one_would(
    value: str, encodings: list[str], filler: str
) -> None:
    # The same pattern under Python's backtracking `re` (bytes mode reads the same syntax):
    # RE2 keeps its leftmost-first choices, so both replace exactly the same spans.
    pattern = re.compile("".join(_redact._char_pattern(ch) for ch in value).encode(), re.DOTALL)
    parts = [filler]
    for name in encodings:
        try:
            parts += [ENCODINGS[name](value), filler]
        except UnicodeEncodeError:
            continue
    text = "".join(parts)
    raw = text.encode("utf-8", "surrogatepass")
    expected = pattern.sub(REDACTED.encode(), raw).decode("utf-8", "surrogatepass")
    assert _redactor(value).scrub(text) == expected
