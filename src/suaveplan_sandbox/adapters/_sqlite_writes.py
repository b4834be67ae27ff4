"""`StatementWrites`: the bytes a running SQLite statement has written, to bound its spills.

SQLite spills a sort, a DISTINCT or UNION table, a recursive CTE's queue or a materialised
subquery that outgrows its page cache to temporary files that are unlinked as soon as they
are opened (so no directory listing, no temp-directory quota by name and no
`max_page_count` sees them), and nothing in SQLite bounds their size: `max_page_count`
covers the database file only, and `PRAGMA temp_store = MEMORY` moves the same bytes into the
host's memory (an `ORDER BY` of 400 MB grew the process to 411 MB here). What does see them is
the thread that writes them. `SqliteDb` runs every statement on its one worker thread with
SQLite's helper threads off (`SQLITE_LIMIT_WORKER_THREADS = 0`), so the bytes that thread
has passed to `write` since the statement began (`wchar` in Linux's `/proc/thread-self/io`)
bound what the statement spilled; they also count the journal and database pages written
before its commit, which makes the bound conservative, never loose.

The counter is read from the progress handler, at most every `_EVERY_TICKS` calls of it and
at least every `_INTERVAL` seconds of the adapter's clock: reading it costs ~3 us, a large
part of the ~18 us between two calls in a statement that only computes, while one that
writes 1 MiB values may spill tens of megabytes between two calls.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Final, final

_IO_FILE: Final = "/proc/thread-self/io"
_FIELD: Final = b"wchar: "
_EVERY_TICKS: Final = 16
_INTERVAL: Final = 0.005


def _wchar(fd: int) -> int:
    """The `wchar` field of an open `/proc/<tid>/io`."""
    text = os.pread(fd, 4096, 0)
    start = text.index(_FIELD) + len(_FIELD)
    return int(text[start : text.index(b"\n", start)])


def writes_are_countable() -> bool:
    """Whether this system reports a thread's written bytes (Linux with I/O accounting)."""
    try:
        fd = os.open(_IO_FILE, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        _wchar(fd)
    except (OSError, ValueError):
        return False
    finally:
        os.close(fd)
    return True


@final
class StatementWrites:
    """Bytes written by the worker thread since `begin()`, compared with `limit`.

    `begin()` and `exceeded()` run on the thread whose writes are counted (the adapter's
    worker); the counter's file is opened by that thread, since `/proc/thread-self` names
    the thread that opens it.
    """

    __slots__ = ("_base", "_checked", "_fd", "_owner", "_ticks", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._fd = -1
        self._owner: int | None = None
        self._base = 0
        self._ticks = 0
        self._checked = 0.0

    def _counter(self) -> int:
        thread = threading.get_ident()
        if self._owner != thread:  # the first call, or (never expected) another thread
            self.close()
            self._fd = os.open(_IO_FILE, os.O_RDONLY | os.O_CLOEXEC)
            self._owner = thread
        return self._fd

    def begin(self, now: float) -> None:
        """A statement starts on this thread: count from here."""
        self._ticks = 0
        self._checked = now
        try:
            self._base = _wchar(self._counter())
        except (OSError, ValueError):
            # Fail closed: a statement whose writes cannot be counted stops at its first look.
            self._base = -1

    def exceeded(self, now: float) -> bool:
        """From the progress handler: whether the statement has written more than `limit`
        (looked at only every few calls or milliseconds; see the module docstring), or its
        writes could not be counted."""
        self._ticks += 1
        if self._ticks < _EVERY_TICKS and now - self._checked < _INTERVAL:
            return False
        self._ticks = 0
        self._checked = now
        if self._base < 0:
            return True
        try:
            return _wchar(self._fd) - self._base > self.limit
        except (OSError, ValueError):
            return True

    def close(self) -> None:
        fd, self._fd, self._owner = self._fd, -1, None
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)
