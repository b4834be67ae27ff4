"""Secret values out of diagnostic text: error messages and details, log lines, audit
resources and tracebacks.

A `SecretRedactor` holds the secret values one sandbox was handed (the gateway adds each
value its secrets adapter returns) and replaces every occurrence with `[REDACTED]`, also in
the forms the value takes once it has passed through the places that make diagnostics: a
URL's percent-encoding (the checker's normalised URL encodes `=` in a password, a space or
a quote in a query), `repr`/JSON escapes (`\\'`, `\\"`, `\\\\`, `\\xNN`, `\\uNNNN`, control
characters, and the UTF-8 bytes of a `bytes` repr), `+` for a space and SQL's doubled
quote (`''`). Matching is per character, so a value partly encoded (only the characters a
URL component must encode) is found as well.

It guards against accidental disclosure, not against a plugin that wants to disclose a
value: one that reverses, splits or base64-encodes it first is not recognised, and what it
returns as a result or sends over a granted channel is its data, not a diagnostic.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Final, final
from urllib.parse import quote, quote_plus

import re2  # type: ignore[import-untyped]

from suaveplan_sandbox.errors._error import SuaveplanError, WireValue

REDACTED: Final = "[REDACTED]"
# A value longer than this (a JWT, a PEM key of up to 64 KiB) is matched in its whole-string
# forms only (literal, percent-encoded, JSON and repr escaped): a pattern of per-character
# alternatives costs milliseconds per hundred characters to compile.
_PER_CHARACTER_UP_TO: Final = 256
_MAX_DEPTH: Final = 32
# What `repr` and JSON write for these control characters (a backslash and a letter).
_CONTROL_ESCAPES: Final = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}
_REDACTED_BYTES: Final = REDACTED.encode()
# Patterns over the text's UTF-8 bytes, each byte one character: RE2 matches in time linear
# in the text, where Python's backtracking `re` took time exponential in a run of quotes or
# backslashes in the value (`''` and `'` are both forms of a quote: 30 quotes against 40
# in a text took 15 s), and the text is the plugin's (its errors and log lines).
_LATIN1: Final = re2.Options()
_LATIN1.encoding = re2.Options.Encoding.LATIN1


def _hex(value: int, digits: int) -> str:
    """`value` as `digits` hex digits, either case: `[Aa]3` for 0xa3."""
    return "".join(f"[{c.upper()}{c}]" if c.isalpha() else c for c in format(value, f"0{digits}x"))


def _lit(text: str) -> str:
    """A pattern for exactly `text`'s UTF-8 bytes (lone surrogates too), for RE2's Latin-1
    mode: ASCII letters and digits as themselves, every other byte as `\\xNN`."""
    return "".join(
        chr(b) if b < 0x80 and chr(b).isalnum() else f"\\x{b:02x}"
        for b in text.encode("utf-8", "surrogatepass")
    )


def _char_pattern(ch: str) -> str:
    code = ord(ch)
    utf8 = ch.encode("utf-8", "surrogatepass")
    forms = {_lit(ch)}
    forms.add("".join(_lit("%") + _hex(b, 2) for b in utf8))
    if code < 0x100:
        forms.add(_lit("\\x") + _hex(code, 2))
    if code >= 0x80:  # a `bytes` repr of the UTF-8 text
        forms.add("".join(_lit("\\x") + _hex(b, 2) for b in utf8))
    if code < 0x10000:
        forms.add(_lit("\\u") + _hex(code, 4))
    else:
        forms.add(_lit("\\U") + _hex(code, 8))
        high, low = divmod(code - 0x10000, 0x400)
        forms.add(_lit("\\u") + _hex(0xD800 + high, 4) + _lit("\\u") + _hex(0xDC00 + low, 4))
    if ch in "\\'\"/":
        forms.add(_lit("\\" + ch))
    if ch in "'\"":  # an SQL literal's or identifier's doubled quote
        forms.add(_lit(ch * 2))
    if ch in _CONTROL_ESCAPES:
        forms.add(_lit(_CONTROL_ESCAPES[ch]))
    if ch == " ":
        forms.add(_lit("+"))
    if len(forms) == 1:
        return forms.pop()
    return "(?:" + "|".join(sorted(forms, key=len, reverse=True)) + ")"


def _scrubber(value: str) -> Callable[[str], str]:
    """A function replacing `value`'s occurrences in a text."""
    if len(value) <= _PER_CHARACTER_UP_TO:
        pattern = re2.compile("".join(_char_pattern(ch) for ch in value).encode(), _LATIN1)

        def substitute(text: str) -> str:
            raw = text.encode("utf-8", "surrogatepass")
            done = pattern.sub(_REDACTED_BYTES, raw)
            # A match covers whole characters (its first byte is an ASCII one or a lead
            # byte), so the result decodes as the text did.
            return text if done == raw else done.decode("utf-8", "surrogatepass")

        return substitute
    forms = {
        value,
        quote(value, safe=""),
        quote(value, safe="/"),
        quote_plus(value, safe=""),
        json.dumps(value)[1:-1],
        json.dumps(value, ensure_ascii=False)[1:-1],
        repr(value)[1:-1],
        ascii(value)[1:-1],
    }
    ordered = sorted(forms, key=len, reverse=True)

    def replace(text: str) -> str:
        for form in ordered:
            if form in text:
                text = text.replace(form, REDACTED)
        return text

    return replace


@final
class SecretRedactor:
    """The secret values to keep out of diagnostics, and the scrubbing of text and data.

    Empty until the first value is added (`active` False, the redactor falsy); every method
    is then a no-op, so callers on hot paths test `redactor.active` (an attribute read)
    first. Not for data channels: a plugin's results, event payloads and requests are its
    own data and are never rewritten.
    """

    __slots__ = ("_patterns", "_values", "active")

    def __init__(self) -> None:
        self._values: dict[str, Callable[[str], str]] = {}
        # Longest value first: a value containing another is replaced whole.
        self._patterns: tuple[Callable[[str], str], ...] = ()
        self.active = False

    def __bool__(self) -> bool:
        return self.active

    def __repr__(self) -> str:
        return f"SecretRedactor(values={len(self._values)})"

    def add(self, value: object) -> None:
        """Remember `value` (a non-empty str; anything else is ignored). Each value is
        compiled once, when it is first added."""
        if type(value) is not str or not value or value in self._values:
            return
        self._values[value] = _scrubber(value)
        ordered = sorted(self._values, key=len, reverse=True)
        self._patterns = tuple(self._values[v] for v in ordered)
        self.active = True

    def scrub(self, text: str) -> str:
        """`text` with every known value, in any of the recognised forms, replaced."""
        for scrub in self._patterns:
            text = scrub(text)
        return text

    def scrub_data(self, value: WireValue, _depth: int = 0) -> WireValue:
        """Plain data with every string (map keys too) scrubbed; deeper than 32 levels the
        rest is dropped (`None`), as a diagnostic does not need it."""
        if not self._patterns:
            return value
        if type(value) is str:
            return self.scrub(value)
        if _depth >= _MAX_DEPTH:
            return None
        if type(value) is list:
            return [self.scrub_data(v, _depth + 1) for v in value]
        if type(value) is dict:
            return {self.scrub(str(k)): self.scrub_data(v, _depth + 1) for k, v in value.items()}
        return value

    def scrub_error(self, err: SuaveplanError) -> SuaveplanError:
        """`err` with its message, details and cause chain scrubbed (a new error when any
        text changed; `err` itself otherwise)."""
        if not self._patterns:
            return err
        wire = err.to_wire()
        clean = self.scrub_data(wire)
        if clean == wire:
            return err
        return SuaveplanError.from_wire(clean)
