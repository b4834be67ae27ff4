"""Reading a plugin's migration files on the host.

The `*.sql` files come with the plugin, so they are the author's: like the VM loader reading
sources, the host reads only regular files that are not links (a link would have the host
run, and quote in errors, a file of its own), never blocks on a FIFO or device, and stops
past a size bound. Every failure is `SAND_DB_MIGRATION_FAILED` naming the file and a reason,
never its content.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Final

from suaveplan_sandbox.errors import SuaveplanError

MAX_MIGRATION_BYTES: Final = 4 * 1024 * 1024


def read_migration(file: Path) -> str:
    """The text of one migration file, or `SAND_DB_MIGRATION_FAILED` with `details.reason`
    `symlink`, `not-a-regular-file`, `too-large`, `not-utf8` or `unreadable`."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(file, flags)
    except OSError as exc:
        raise _unreadable(file, "symlink" if exc.errno == errno.ELOOP else "unreadable") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _unreadable(file, "not-a-regular-file")
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_MIGRATION_BYTES and (
            chunk := os.read(fd, MAX_MIGRATION_BYTES + 1 - size)
        ):
            chunks.append(chunk)
            size += len(chunk)
    except OSError:
        raise _unreadable(file, "unreadable") from None
    finally:
        os.close(fd)
    if size > MAX_MIGRATION_BYTES:
        raise _unreadable(file, "too-large")
    try:
        return b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError:
        raise _unreadable(file, "not-utf8") from None


def _unreadable(file: Path, reason: str) -> SuaveplanError:
    return SuaveplanError(
        "SAND_DB_MIGRATION_FAILED",
        "a migration file cannot be read",
        {"migration": os.fsencode(file.name).decode("utf-8", "replace"), "reason": reason},
    )
