"""Reading a small file whose name and kind someone else chose (a plugin's sources, its
migrations): only a regular file, never a symbolic link unless the caller allows it (a link
would have the host read, and quote in errors, a file of its own), never blocking on a FIFO
or device, and never more than one byte past a bound, so an endless file ends the read.

Failures raise `UnreadableFile` with a reason for the caller's coded error: `symlink`,
`not-a-regular-file` or `unreadable`. The caller judges the size (the data has at most
`limit + 1` bytes) and decodes.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import final


@final
class UnreadableFile(Exception):
    """The file cannot be used; `reason` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def read_regular_file(
    path: Path | str, limit: int, *, follow: bool = False, dir_fd: int | None = None
) -> bytes:
    """At most `limit + 1` bytes of the regular file `path` (relative to `dir_fd` if given).
    `follow=False`: the file itself must not be a link (O_NOFOLLOW, so a link swapped in
    after a caller's own check is refused too)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except OSError as exc:
        linked = exc.errno == errno.ELOOP and not follow
        raise UnreadableFile("symlink" if linked else "unreadable") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnreadableFile("not-a-regular-file")
        chunks: list[bytes] = []
        size = 0
        while size <= limit and (chunk := os.read(fd, limit + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
    except OSError:
        raise UnreadableFile("unreadable") from None
    finally:
        os.close(fd)
    return b"".join(chunks)
