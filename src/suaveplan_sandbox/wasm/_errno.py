"""The WASI preview 1 errno values the `suaveplan` host imports (and the host's own WASI
functions, `_wasi_guard`) return."""

from __future__ import annotations

import enum


class Errno(enum.IntEnum):
    """Numbering is WASI preview 1's `errno` enum (wasi-libc `__WASI_ERRNO_*`)."""

    SUCCESS = 0
    ACCES = 2
    BADF = 8
    CANCELED = 11
    CONNREFUSED = 14
    FAULT = 21
    INVAL = 28
    IO = 29
    MFILE = 33
    NOBUFS = 42
    NOMEM = 48
    NOSYS = 52
    ROFS = 69
    NOTCAPABLE = 76
