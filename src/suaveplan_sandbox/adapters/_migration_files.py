"""Reading a plugin's migration files on the host.

The `*.sql` files come with the plugin, so they are the author's: like the VM loader reading
sources, the host reads only regular files that are not links (a link would have the host
run, and quote in errors, a file of its own), never blocks on a FIFO or device, and stops
past a size bound. Every failure is `SAND_DB_MIGRATION_FAILED` naming the file and a reason,
never its content.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

from suaveplan_sandbox._untrusted_files import UnreadableFile, read_regular_file
from suaveplan_sandbox.errors import SuaveplanError

MAX_MIGRATION_BYTES: Final = 4 * 1024 * 1024


def read_migration(file: Path) -> str:
    """The text of one migration file, or `SAND_DB_MIGRATION_FAILED` with `details.reason`
    `symlink`, `not-a-regular-file`, `too-large`, `not-utf8` or `unreadable`."""
    try:
        data = read_regular_file(file, MAX_MIGRATION_BYTES)
    except UnreadableFile as exc:
        raise _unreadable(file, exc.reason) from None
    if len(data) > MAX_MIGRATION_BYTES:
        raise _unreadable(file, "too-large")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise _unreadable(file, "not-utf8") from None


def _unreadable(file: Path, reason: str) -> SuaveplanError:
    return SuaveplanError(
        "SAND_DB_MIGRATION_FAILED",
        "a migration file cannot be read",
        {"migration": os.fsencode(file.name).decode("utf-8", "replace"), "reason": reason},
    )
