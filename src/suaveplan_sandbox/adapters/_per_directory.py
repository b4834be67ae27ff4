"""`PerDirectory`: one shared object per directory (by device and inode), while anyone uses it.

The fs adapter keeps state that must be shared by every adapter open on the same directory
in this process, whichever path or fd reached it: the rename lock of a directory, the byte
count of a quota root. Keyed by `(st_dev, st_ino)` of an open fd, held weakly so the entry
goes when its last user drops it.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar, final

T = TypeVar("T")


@final
class PerDirectory(Generic[T]):
    __slots__ = ("_entries", "_factory", "_guard")

    def __init__(self, factory: Callable[[], T]) -> None:
        self._factory = factory
        self._entries: weakref.WeakValueDictionary[tuple[int, int], T] = (
            weakref.WeakValueDictionary()
        )
        self._guard = threading.Lock()

    def get(self, dir_fd: int) -> T:
        """The object of the directory `dir_fd`; the caller keeps it while it uses it."""
        st = os.fstat(dir_fd)
        key = (st.st_dev, st.st_ino)
        with self._guard:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = self._factory()
            return entry
