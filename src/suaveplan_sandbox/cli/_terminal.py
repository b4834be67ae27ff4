"""Text for a terminal.

Much of what the CLI prints is chosen by whoever wrote the plugin or its manifest: a
manifest's unknown keys come back in field paths, a plugin's messages and output in error
lines. Printed raw, an escape sequence in them can retitle the window, move the cursor, hide
earlier lines or, on some terminals, answer queries as if typed. `printable` shows every
control character (C0, DEL, C1) and every bidirectional override as an escape instead.
"""

from __future__ import annotations

from typing import Final

_BIDI: Final = (*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F, 0x061C)
_ESCAPES: Final = {
    c: (f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}")
    for c in (*range(0x20), *range(0x7F, 0xA0), *_BIDI)
}
_KEEP_NEWLINES: Final = {c: e for c, e in _ESCAPES.items() if c != 0x0A}


def printable(text: str, *, keep_newlines: bool = False) -> str:
    """`text` with its control and bidi characters shown as `\\xNN` / `\\uNNNN`."""
    return text.translate(_KEEP_NEWLINES if keep_newlines else _ESCAPES)
