"""`RootUsage`: what the files beneath a `BeneathRootFs` root take, for its `max_root_bytes`.

Theory of operation. Every regular file is charged its size rounded up to whole 4 KiB blocks,
and at least one block: a filesystem spends a block and an inode on a file however small, so
charging empty files nothing would let a plugin exhaust the inodes within any quota. The
total is measured once, by the first write that needs it: a walk from the root fd that opens
directories with `O_NOFOLLOW` (a link is never followed; it and any other non-regular entry
are charged nothing; a proc, sysfs or other kernel filesystem mounted below the root is
skipped, as the adapter never reads it), on the write's worker thread. The walk is bounded
like a listing: a directory of more than `max_list_entries` entries, or more than
`MAX_SCAN_ENTRIES` entries in all, leaves the total unknown, and every write that needs the
quota is then refused
(fail closed; the refusal is remembered, so a huge tree is not walked again on each write).

From then on the total moves by the writes made through any adapter of this process on the
same root directory (`st_dev`, `st_ino`: one `RootUsage` for all of them, as one rename lock
per directory, so a restarted sandbox's new adapter and the old one's last writes share a
total). A write reserves its growth (new charge minus the charge of the file it replaces,
if more than nothing) before it writes anything, and settles under the directory's rename
lock, where it looks at the file it is about to replace once more; it is refused, and its
temp file removed, if either would take the total past the quota. A write that shrinks the
total is never refused, and what it frees is credited only after its rename: a write that
is cancelled or fails never lends room to the writes racing it.

It is an estimate, and documented as one: files written, grown or removed by anyone else
(the host, a WASI guest's `rw:` preopen, another process) after the walk are not seen until a
new walk (a `RootUsage` is dropped with the last adapter on its root); a file with several
names is charged once per name; and a write's temp file briefly takes space beside the file
it replaces.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from typing import Final, final

from suaveplan_sandbox.adapters._openat2 import KERNEL_FILESYSTEMS, filesystem_type
from suaveplan_sandbox.adapters._per_directory import PerDirectory
from suaveplan_sandbox.errors import SuaveplanError

BLOCK: Final = 4096
# Entries a measuring walk visits at most (about a second of `fstatat`s on a local disk).
MAX_SCAN_ENTRIES: Final = 1_000_000
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_RACED: Final = frozenset({errno.ENOENT, errno.ENOTDIR, errno.ELOOP})


def charge(size: int) -> int:
    """What a regular file of `size` bytes counts against the quota."""
    return max(1, -(-size // BLOCK)) * BLOCK


def _over_quota(limit: int) -> SuaveplanError:
    return SuaveplanError(
        "SAND_FS_TOO_LARGE",
        "the write would take the files under the root past their quota",
        {"reason": "quota-exceeded", "max_root_bytes": limit},
    )


def _unmeasured() -> SuaveplanError:
    return SuaveplanError(
        "SAND_FS_TOO_LARGE",
        "the files under the root are too many to measure against the quota",
        {"reason": "quota-unmeasurable"},
    )


class _TooMany(Exception):
    pass


@final
class _Walk:
    """One measuring walk's running totals."""

    __slots__ = ("max_dir_entries", "seen", "total")

    def __init__(self, max_dir_entries: int) -> None:
        self.max_dir_entries = max_dir_entries
        self.seen = 0
        self.total = 0

    def directory(self, fd: int) -> list[str]:
        """Charge the regular files of the directory `fd`; the names of its directories."""
        subdirs: list[str] = []
        in_dir = 0
        with os.scandir(fd) as entries:
            for entry in entries:
                self.seen += 1
                in_dir += 1
                if self.seen > MAX_SCAN_ENTRIES or in_dir > self.max_dir_entries:
                    raise _TooMany
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError as exc:
                    if exc.errno not in _RACED:
                        raise
                    continue  # removed while we walked
                if stat.S_ISREG(st.st_mode):
                    self.total += charge(st.st_size)
                elif stat.S_ISDIR(st.st_mode):
                    subdirs.append(entry.name)
        return subdirs


def _measure(root_fd: int, max_dir_entries: int) -> int:
    """The charge of every regular file beneath `root_fd` (see the module docstring).

    Depth first, holding one fd per level being walked (not one per directory found,
    which a directory of many directories would turn into thousands)."""
    walk = _Walk(max_dir_entries)
    stack: list[tuple[int, list[str]]] = []
    try:
        fd = os.dup(root_fd)
        stack.append((fd, []))  # on the stack before it is read: an error still closes it
        stack[-1] = (fd, walk.directory(fd))
        while stack:
            fd, subdirs = stack[-1]
            if not subdirs:
                stack.pop()
                os.close(fd)
                continue
            try:
                child = os.open(subdirs.pop(), _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno not in _RACED:
                    raise
                continue  # removed, or swapped for a file or a link, while we walked
            if filesystem_type(child) in KERNEL_FILESYSTEMS:
                os.close(child)  # a proc or sysfs mount: nothing the adapter reads or writes
                continue
            stack.append((child, []))
            stack[-1] = (child, walk.directory(child))
    finally:
        for fd, _ in stack:
            os.close(fd)
    return walk.total


@final
class RootUsage:
    """The charged bytes beneath one root directory (see the module docstring)."""

    __slots__ = ("__weakref__", "_lock", "_unmeasurable", "used")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.used: int | None = None  # None until measured
        self._unmeasurable = False

    def reserve(self, change: int, limit: int, root_fd: int, max_dir_entries: int) -> None:
        """Add `change` to the total, or refuse (`SAND_FS_TOO_LARGE`) if it is growth that
        would take the total past `limit`; measures the tree first if it is not known."""
        with self._lock:
            if self.used is None:
                if self._unmeasurable:
                    raise _unmeasured()
                try:
                    self.used = _measure(root_fd, max_dir_entries)
                except _TooMany:
                    self._unmeasurable = True
                    raise _unmeasured() from None
            if change > 0 and self.used + change > limit:
                raise _over_quota(limit)
            self.used += change

    def note(self, change: int) -> None:
        """Add `change` to the total if it is known (a write of an adapter without a quota;
        measuring is left to the first that has one)."""
        with self._lock:
            if self.used is not None:
                self.used += change

    def release(self, change: int) -> None:
        """Take back a reservation (or a note) whose write did not happen."""
        self.note(-change)


_USAGE: Final[PerDirectory[RootUsage]] = PerDirectory(RootUsage)


def usage_for(root_fd: int) -> RootUsage:
    """The `RootUsage` of the directory `root_fd`; the caller keeps it while it uses it."""
    return _USAGE.get(root_fd)
