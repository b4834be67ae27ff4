"""Text someone else wrote, made safe to show on one line of a log or a terminal.

A plugin's log lines and a manifest's keys reach the host's logs and the CLI's output.
Printed raw, a newline in them forges another log line, and an escape sequence can retitle a
terminal window, move its cursor, hide earlier lines or answer a terminal's queries as if
typed. `printable` shows every character `str.isprintable` rejects (C0 and C1 controls, DEL,
line and paragraph separators, bidirectional and other format characters) as its Python
escape: `\\n`, `\\x1b`, `\\u202e`.
"""

from __future__ import annotations


def printable(text: str, *, keep_newlines: bool = False) -> str:
    """`text` with its non-printable characters escaped; with `keep_newlines`, `\\n` stays
    (a multi-line traceback the caller means to print as lines)."""
    if text.isprintable():
        return text
    if keep_newlines:
        return "\n".join(printable(part) for part in text.split("\n"))
    return "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text
    )
