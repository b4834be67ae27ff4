"""Linear-time `replace`, `instr` and two-argument `trim`, `ltrim`, `rtrim` for `SqliteDb`.

SQLite's own versions compare each position of one argument with the whole of the other, so
their time grows with the product of the two lengths, inside one engine step that neither
`Connection.interrupt()` nor a progress handler can stop: `trim` of two 200,000-character
texts runs for minutes, of two 1 MiB texts for about an hour, on a host thread no deadline
reaches. These overrides give SQLite's results with Python's linear searches. The fast path
covers text and integers (as SQLite reads them: their decimal text) and BLOBs that are UTF-8,
which is what plugins pass; anything else (a REAL, whose text SQLite spells its own way, or a
BLOB that is not UTF-8) goes to SQLite's own function on a private in-memory connection, but
only when the product of the lengths is small enough to be quick. Otherwise the call is
refused, and `refusal` says why, for the adapter's coded error.

`printf` and `format` are SQLite's own (on the private connection), except that a `%c` whose
precision repeats it past `max_value_bytes` is refused before it runs: SQLite 3.40 writes it
one character at a time even after the result outgrew the length limit, in one step.

The differences from the built-ins: a TEXT argument that is not valid UTF-8 fails the call
(Python cannot read it; `SqliteDb` could not return such a value either), and a result longer
than `max_value_bytes` characters fails before it is built.
"""

from __future__ import annotations

import math
import re
import sqlite3
from collections.abc import Callable
from typing import Final, final

# The largest product of two argument lengths handed to SQLite's own (quadratic) function:
# about a tenth of a second for its slowest, `trim`, at a few nanoseconds a pair.
PAIR_BUDGET: Final = 20_000_000
# A SQLite value is one of these; `None` is NULL.
SqliteValue = None | int | float | str | bytes
# With fewer distinct characters than this `str.strip` (a bloom filter, then a scan of the
# set) is fastest; with more, a `set` lookup per character keeps the time linear.
_STRIP_SET: Final = 32


class FunctionRefused(Exception):
    """Internal: an override refused its call; SQLite reports a failed user function."""


def _text(value: SqliteValue) -> str | None:
    """`value` as SQLite reads it as text, if Python reads it the same way; else None."""
    kind = type(value)
    if kind is str:
        return value  # type: ignore[return-value]
    if kind is int:
        return str(value)  # SQLite renders an INTEGER as its decimal digits too
    if kind is bytes:
        try:
            return value.decode("utf-8")  # type: ignore[union-attr]
        except UnicodeDecodeError:
            return None
    return None  # a REAL: SQLite's own spelling decides


def _length(value: SqliteValue) -> int:
    return len(value) if isinstance(value, str | bytes) else 32


@final
class LinearTextFunctions:
    """The overrides for one connection; `install(conn)` registers them."""

    __slots__ = ("_fallback", "_max_chars", "refusal")

    def __init__(self, *, max_value_bytes: int) -> None:
        self._max_chars = max_value_bytes
        self._fallback: sqlite3.Connection | None = None
        self.refusal: str | None = None  # why the last refused call was refused

    def install(self, conn: sqlite3.Connection) -> None:
        conn.create_function("printf", -1, self._formatter("printf"), deterministic=True)
        conn.create_function("format", -1, self._formatter("format"), deterministic=True)
        conn.create_function("replace", 3, self.replace, deterministic=True)
        conn.create_function("instr", 2, self.instr, deterministic=True)
        conn.create_function("trim", 2, self._trimmer("trim", True, True), deterministic=True)
        conn.create_function("ltrim", 2, self._trimmer("ltrim", True, False), deterministic=True)
        conn.create_function("rtrim", 2, self._trimmer("rtrim", False, True), deterministic=True)

    def close(self) -> None:
        if self._fallback is not None:
            self._fallback.close()
            self._fallback = None

    def _refuse(self, reason: str) -> FunctionRefused:
        self.refusal = reason
        return FunctionRefused(reason)

    def _sqlite(self, name: str, *args: SqliteValue) -> SqliteValue:
        """SQLite's own `name(*args)`, when the two longest arguments are short enough."""
        first, second = sorted((_length(a) for a in args), reverse=True)[:2]
        if first * second > PAIR_BUDGET:
            raise self._refuse("function-too-costly")
        return self._builtin(name, args)

    def _builtin(self, name: str, args: tuple[SqliteValue, ...]) -> SqliteValue:
        """SQLite's own `name(*args)` on the private connection (same length limit)."""
        conn = self._fallback
        if conn is None:
            conn = sqlite3.connect(":memory:", check_same_thread=False)
            conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, self._max_chars)
            self._fallback = conn
        placeholders = ", ".join("?" * len(args))
        row = conn.execute(f"SELECT {name}({placeholders})", args).fetchone()
        value: SqliteValue = row[0]
        return value

    def _formatter(self, name: str) -> Callable[..., SqliteValue]:
        """`printf`/`format`: SQLite's own, unless a `%c` repeats past `max_value_bytes`.

        SQLite (3.40) writes `%.Nc` one character at a time, N times, and goes on after the
        result has outgrown the length limit: `%.2000000000c` is about eight seconds in one
        engine step, and a statement may hold hundreds of them. Such a result could never be
        returned anyway, so it is refused up front (`_repeats` over-estimates, never under)."""

        def formatter(*args: SqliteValue) -> SqliteValue:
            if args and _repeats(args[0], args[1:]) > self._max_chars:
                raise self._refuse("value-too-large")
            return self._builtin(name, args)

        return formatter

    def replace(self, x: SqliteValue, y: SqliteValue, z: SqliteValue) -> SqliteValue:
        if type(x) is str and type(y) is str and type(z) is str and y and y[0] != "\x00":
            # The common case, first: the rest of this function gives the same answer.
            if len(z) > len(y) and len(x) + x.count(y) * (len(z) - len(y)) > self._max_chars:
                raise self._refuse("value-too-large")
            return x.replace(y, z)
        if x is None or y is None:
            return None
        text, pattern = _text(x), _text(y)
        # SQLite tests the pattern's first byte: empty, or a C string cut short by a NUL,
        # leaves X as it is (even when Z is NULL): a number keeps its type, but a BLOB has
        # been read as text by then and comes back as TEXT.
        if isinstance(y, str | bytes) and (not y or y[:1] in ("\x00", b"\x00")):
            if type(x) is not bytes:
                return x
            return text if text is not None else self._sqlite("replace", x, y, z)
        if z is None:
            return None
        replacement = _text(z)
        if text is None or pattern is None or replacement is None:
            return self._sqlite("replace", x, y, z)
        size = len(text) + text.count(pattern) * (len(replacement) - len(pattern))
        if size > self._max_chars:
            raise self._refuse("value-too-large")
        return text.replace(pattern, replacement)

    def instr(self, x: SqliteValue, y: SqliteValue) -> SqliteValue:
        if type(x) is str and type(y) is str:
            return x.find(y) + 1
        if x is None or y is None:
            return None
        if type(x) is bytes and type(y) is bytes:
            return x.find(y) + 1  # two BLOBs: a byte offset
        text, needle = _text(x), _text(y)
        if text is None or needle is None:
            return self._sqlite("instr", x, y)
        return text.find(needle) + 1  # otherwise a character offset; "" is found at 1

    def _trimmer(
        self, name: str, left: bool, right: bool
    ) -> Callable[[SqliteValue, SqliteValue], SqliteValue]:
        def trim(x: SqliteValue, y: SqliteValue) -> SqliteValue:
            if x is None or y is None:
                return None
            text, chars = _text(x), _text(y)
            if text is None or chars is None:
                return self._sqlite(name, x, y)
            # SQLite reads the set as a C string: it ends at the first NUL.
            charset = set(chars.partition("\x00")[0])
            if not charset:
                return text
            if len(charset) < _STRIP_SET:
                joined = "".join(charset)
                if left:
                    text = text.lstrip(joined)
                return text.rstrip(joined) if right else text
            start, end = 0, len(text)
            if left:
                while start < end and text[start] in charset:
                    start += 1
            if right:
                while end > start and text[end - 1] in charset:
                    end -= 1
            return text[start:end]

        return trim


# What SQLite's printf reads between `%` and the conversion letter (flags, width, precision and
# length modifiers, which it takes in any order); `*` takes a width or precision argument.
_SPEC_CHARS: Final = frozenset("-+ #!,l*0123456789")
_LEADING_NUMBER: Final = re.compile(
    r"\s*[+-]?(?:0[xX][0-9a-fA-F]+|[0-9]*\.?[0-9]*(?:[eE][+-]?[0-9]+)?)"
)
_HUGE: Final = 1 << 63


def _magnitude(value: SqliteValue) -> int:
    """At least the absolute value SQLite could read from `value` as a `*` argument."""
    if value is None:
        return 0
    if isinstance(value, int):
        return abs(value)
    if isinstance(value, float):
        return abs(int(value)) if math.isfinite(value) else _HUGE
    text = value if isinstance(value, str) else value.decode("latin-1")
    match = _LEADING_NUMBER.match(text)
    number = match.group().strip() if match else ""
    if not number.strip("+-."):
        return 0
    try:
        return abs(int(number, 16) if number.lower().startswith("0x") else int(float(number)))
    except (ValueError, OverflowError):
        return _HUGE  # a reading we cannot make: assume the worst


def _repeats(fmt: SqliteValue, args: tuple[SqliteValue, ...]) -> int:
    """An upper bound on the characters `%c` conversions with a precision make SQLite write.

    Over-estimates on purpose: every precision of a `%c` spec counts (SQLite keeps the last),
    and a `*` precision counts as the largest argument of the call, whichever it is."""
    if not isinstance(fmt, str | bytes):
        return 0
    text = fmt if isinstance(fmt, str) else fmt.decode("latin-1")
    if "c" not in text:
        return 0
    largest = max((_magnitude(a) for a in args), default=0)
    total = 0
    pos = text.find("%")
    end = len(text)
    while 0 <= pos < end:
        i = pos + 1
        precision = 0
        while i < end:
            ch = text[i]
            if ch == ".":
                i += 1
                if i < end and text[i] == "*":
                    precision += largest
                    i += 1
                    continue
                start = i
                while i < end and text[i].isascii() and text[i].isdigit():
                    i += 1
                digits = text[start:i]  # SQLite keeps 31 bits of it; a long run is "huge"
                precision += int(digits or 0) if len(digits) <= 19 else _HUGE
            elif ch in _SPEC_CHARS:
                i += 1
            else:
                break
        if i < end and text[i] == "c":
            total += precision
        pos = text.find("%", i + 1)
    return total
