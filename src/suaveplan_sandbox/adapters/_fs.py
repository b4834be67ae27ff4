"""`BeneathRootFs`: files beneath a root directory, never through a symbolic link.

Theory of operation: the root is opened once as a directory fd. Every request walks from that
fd, one component at a time, with `O_NOFOLLOW` (or a single `openat2` with
`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS` where the kernel has it;
both in `_beneath`, which the WASM host's preopens share).
*Every* symbolic link is refused (`SAND_FS_LINK_REFUSED`), including links that would stay
inside the root: following none is the only rule that a rename race cannot turn into an
escape, because the kernel re-checks each component at the moment it is opened.

Only a regular file is ever opened for reading. The leaf is looked at first without opening
it (`fstatat` with `AT_SYMLINK_NOFOLLOW` on the thread, an `O_PATH` open inline): opening a
FIFO, a socket, a device or a terminal planted in the tree runs its driver, which may block,
have side effects (a writer waiting on a FIFO is released; a terminal opened without
`O_NOCTTY` by a session leader becomes the host's controlling terminal, and whoever holds
its other end can then send the host SIGINT and SIGHUP). Should a rename put such a file in
place between the look and the open, the open is still non-blocking and `O_NOCTTY`, and the
`fstat` after it refuses anything but a regular file. Nothing on a kernel filesystem
(`KERNEL_FILESYSTEMS`: procfs, sysfs and the like, mounted or bind-mounted beneath the root)
is opened or listed: its files describe the host (`proc/<pid>/environ`), not the root.

Writes are atomic: a temp file in the same directory (through the directory fd), `fsync`,
`rename` over the target, then `fsync` of the directory. A writer killed at any point leaves
either the old file or the new one, never a mix. Renaming over a symlink replaces the link
itself; its target is never written; renaming over a hard link replaces this name only, so
the file's other names keep the old contents.

A listing stops at `max_list_entries` names (`SAND_FS_TOO_LARGE`): a directory of millions
of entries would otherwise be held in host memory whole before any limit could apply.

A write is at most `max_write_bytes`; with `max_root_bytes`, the files beneath the root are
also held to a quota, checked before the temp file is written and again just before the
rename, so a refused write leaves the old file as it was; what a shrinking write frees is
credited only after its rename (`_fs_quota`).

Reads and existence checks that need no I/O are answered on the calling thread; everything
else runs on a worker thread (`asyncio.to_thread`), because a filesystem call can wait on a
disk or a network for as long as it likes, and the caller is an event loop. Handing even a
1 KiB read to a thread costs two thread wake-ups and GIL hand-offs, several times the rest
of a proxied read (~0.3-0.5 ms here, against ~10 us of system calls). So where the kernel can
promise not to wait, it is asked to: `openat2` with `RESOLVE_CACHED` (Linux 5.12) resolves the
path only from the kernel's lookup caches and fails with `EAGAIN` rather than read a
directory or revalidate an entry, and `preadv` with `RWF_NOWAIT` returns only data already
in the page cache. A read is served inline only when the file is a regular one of at most
`INLINE_READ_MAX_BYTES` (copying more would hold the loop), every byte came back, and the
root is on a local filesystem (`LOCAL_FILESYSTEMS`): on NFS, FUSE and the like an `open`
itself asks a server or a daemon, which no flag prevents. The inline open also refuses to
cross a mount point (`RESOLVE_NO_XDEV`), so an NFS share mounted below the root is never
reached from the loop. A root in memory (tmpfs, ramfs: `MEMORY_FILESYSTEMS`) is read without
`RWF_NOWAIT`, which tmpfs refuses and which it does not need; a filesystem that refuses it
anyway stops being read inline at the first refusal. Anything else — a miss, an error, a
short read, a file that grew — goes to the thread, which decides the answer as before, so
the inline path changes latency, never results. `inline_io=False` turns it off.

A write whose awaiting task is cancelled (the gateway cancels in-flight calls when a sandbox
crashes or is disposed) cannot stop its thread, so the thread asks its `_WriteTicket` before
the rename: once cancelled, the rename never happens. Without this a killed guest's write
could land after a later, acknowledged write to the same file and silently replace it. A
cancellation never waits for the thread (the loop would hang as long as a rename on a hung
filesystem): a write that had already decided to rename when it was cancelled still does.
Every rename into a directory is decided and made under that directory's lock, one per
directory in the process whichever adapter writes (a restarted sandbox may well get a new
adapter on the same root), so a write decided later (the next sandbox's) lands after it,
never under it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import os
import secrets
import stat
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, Final, NoReturn, final

from suaveplan_sandbox.adapters._beneath import open_directory, open_leaf, openat2_works
from suaveplan_sandbox.adapters._fs_quota import RootUsage, charge, usage_for
from suaveplan_sandbox.adapters._openat2 import (
    CACHED_RESOLVE,
    HOW_PATH,
    HOW_READ,
    HOW_SIZE,
    KERNEL_FILESYSTEMS,
    NR_OPENAT2,
    PATH_FLAGS,
    READ_FLAGS,
    SYSCALL,
    OpenHow,
    filesystem_type,
)
from suaveplan_sandbox.adapters._per_directory import PerDirectory
from suaveplan_sandbox.adapters._ready import Ready
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions._accel import fs_read_cached

# Largest file a read may copy on the calling thread (a memcpy of a few microseconds).
INLINE_READ_MAX_BYTES: Final = 64 * 1024
# `statfs.f_type` of filesystems in memory: their data is never read from a device (tmpfs
# may swap, as the host's own memory may), so a plain read cannot wait on I/O; tmpfs refuses
# RWF_NOWAIT (EOPNOTSUPP). tmpfs, ramfs.
MEMORY_FILESYSTEMS: Final = frozenset({0x01021994, 0x858458F6})
# `statfs.f_type` of filesystems whose open and stat never wait on a server or a daemon, and
# whose cached reads RWF_NOWAIT can tell apart: ext2/3/4, xfs, btrfs, overlayfs, f2fs, zfs,
# bcachefs; and the memory ones.
LOCAL_FILESYSTEMS: Final = MEMORY_FILESYSTEMS | frozenset(
    {0xEF53, 0x58465342, 0x9123683E, 0x794C7630, 0xF2F52010, 0x2FC12FC1, 0xCA451A4E}
)
DEFAULT_MAX_READ_BYTES: Final = 16 * 1024 * 1024
DEFAULT_MAX_WRITE_BYTES: Final = 16 * 1024 * 1024
DEFAULT_MAX_LIST_ENTRIES: Final = 100_000
# Bytes of the target's name kept in its temp file's name: with the rest (33 bytes) it stays
# under NAME_MAX (255) whatever the name, which may itself be 255 bytes.
_TMP_NAME_BYTES: Final = 100


def _raise(code: str, message: str, exc: BaseException | None = None) -> NoReturn:
    raise SuaveplanError(code, message, cause=exc)


def _translate(exc: OSError) -> NoReturn:
    # Messages never name the path: an adapter error may travel back to the guest.
    if exc.errno == errno.ENOENT:
        _raise("SAND_FS_NOT_FOUND", "no such file or directory", exc)
    if exc.errno in (errno.ELOOP, errno.EXDEV, errno.EMLINK):
        _raise("SAND_FS_LINK_REFUSED", "the path crosses a symbolic link", exc)
    if exc.errno in (errno.ENOTDIR, errno.EISDIR):
        _raise("SAND_FS_NOT_A_FILE", "a directory where a file was expected, or the reverse", exc)
    _raise("SAND_FS_IO_ERROR", f"the operating system refused the operation ({exc.strerror})", exc)


@final
class _WriteTicket:
    """Cancellation for one write's thread: deciding to rename and cancelling exclude each
    other. The lock is only ever held to read and set the flags, never across I/O, so
    `cancel()` (called on the event loop) does not wait for a rename in progress."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.cancelled = False

    def cancel(self) -> None:
        with self.lock:
            self.cancelled = True

    def commit(self) -> bool:
        """True, and the write may rename; False once cancelled, and it never will."""
        with self.lock:
            return not self.cancelled


@final
class _RenameLock:
    """Held from a write's decision to rename until its rename returns; one per directory
    (`st_dev`, `st_ino`) written into, alive while some write into it holds it."""

    __slots__ = ("__weakref__", "lock")

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def __enter__(self) -> None:
        self.lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


_RENAME_LOCKS: Final[PerDirectory[_RenameLock]] = PerDirectory(_RenameLock)


def _normalised(parts: list[str]) -> bool:
    """No empty, `.` or `..` component and no NUL: the only paths a request may name."""
    return "" not in parts and "." not in parts and ".." not in parts and "\0" not in "".join(parts)


def _temp_name(name: str) -> str:
    # Cut in bytes (a 255-byte name of multi-byte characters must still fit), at a character
    # boundary: a temp file's name shows in listings, which must stay valid UTF-8.
    head = os.fsencode(name)[:_TMP_NAME_BYTES].decode("utf-8", "ignore")
    return f".{head}.{secrets.token_hex(8)}.suaveplan-tmp"


def _refuse_kernel_filesystem(fd: int) -> None:
    """Refuse (closing `fd`) a descriptor on one of the `KERNEL_FILESYSTEMS`."""
    if filesystem_type(fd) in KERNEL_FILESYSTEMS:
        os.close(fd)
        raise SuaveplanError(
            "SAND_FS_NOT_A_FILE",
            "not a regular file or directory of the root",
            {"reason": "kernel-filesystem"},
        )


def _components(path: str) -> list[str]:
    if path in (".", ""):
        return []
    parts = path.split("/")
    if not _normalised(parts):
        # The gateway hands us normalised paths; anything else is a host bug, refused anyway.
        _raise("SAND_FS_IO_ERROR", "the path is not normalised")
    return parts


@final
class BeneathRootFs:
    """The default `FsAdapter`: reads, atomic writes and listings beneath `root`.

    `max_root_bytes` (None: no quota) caps what the regular files beneath the root take,
    each charged in whole 4 KiB blocks; a write past it is refused with `SAND_FS_TOO_LARGE`
    (`details.reason` `quota-exceeded`) and leaves the old file in place. See `_fs_quota`
    for how the total is known and where it is an estimate.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        max_read_bytes: int = DEFAULT_MAX_READ_BYTES,
        max_write_bytes: int = DEFAULT_MAX_WRITE_BYTES,
        max_list_entries: int = DEFAULT_MAX_LIST_ENTRIES,
        max_root_bytes: int | None = None,
        use_openat2: bool | None = None,
        inline_io: bool = True,
    ) -> None:
        self._root = Path(root)
        # The root fd is closed only when no operation is resolving a path against it (see
        # `_hold_root`): once closed, its number is free for the next `open` in the process,
        # which may well be another plugin's root.
        self._fd_lock = threading.Lock()
        self._fd_users = 0
        self._closing = False
        self._root_fd = -1
        if max_root_bytes is not None and (type(max_root_bytes) is not int or max_root_bytes <= 0):
            _raise("SAND_INVALID_ARGUMENT", "max_root_bytes is a positive int, or None")
        self._root_fd = os.open(self._root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._root_fd_c = ctypes.c_int(self._root_fd)
        self.max_read_bytes = max_read_bytes
        self.max_write_bytes = max_write_bytes
        self.max_list_entries = max_list_entries
        self.max_root_bytes = max_root_bytes
        # Kept by every adapter on the root, quota or not, so that one with a quota also
        # sees the writes of one without.
        self._usage: RootUsage = usage_for(self._root_fd)
        self._openat2 = SYSCALL is not None and use_openat2 is not False
        if self._openat2 and not self._probe_openat2():
            if use_openat2:
                _raise("SAND_FS_IO_ERROR", "openat2 is not available on this kernel")
            self._openat2 = False
        fs_type = filesystem_type(self._root_fd)
        self._inline = (
            inline_io
            and self._openat2
            and hasattr(os, "RWF_NOWAIT")
            and fs_type in LOCAL_FILESYSTEMS
            and self._probe_cached()
        )
        # Flags of the inline read: none in memory; elsewhere only what is cached. Reads stop
        # being tried inline (0 here -> -1) if the filesystem refuses RWF_NOWAIT after all.
        self._read_flags = 0 if fs_type in MEMORY_FILESYSTEMS else getattr(os, "RWF_NOWAIT", -1)
        # The same inline read in C when the accelerator is built: its seven system calls
        # without the interpreter between them (`_speedups.c`, `read_cached`).
        self._read_cached_c = fs_read_cached()

    def __repr__(self) -> str:
        return (
            f"BeneathRootFs(root={str(self._root)!r}, openat2={self._openat2},"
            f" inline_io={self._inline})"
        )

    @property
    def uses_openat2(self) -> bool:
        return self._openat2

    @property
    def inline_io(self) -> bool:
        """Whether reads and existence checks that need no I/O are answered without a thread."""
        return self._inline

    def close(self) -> None:
        """Refuse new operations; the root fd closes when the last one using it is done."""
        with self._fd_lock:
            if self._closing:
                return
            self._closing = True
            if self._fd_users == 0:
                self._close_root()

    def _close_root(self) -> None:  # under `_fd_lock`
        fd, self._root_fd = self._root_fd, -1
        if fd >= 0:
            os.close(fd)

    def _hold_root(self) -> int:
        """The root fd, kept open until the matching `_release_root`; -1 once closed.

        A path is resolved against the root fd on a worker thread or on the loop, while
        `close()` may run anywhere. Closing the fd between an operation's read of its number
        and its system call would let that call resolve beneath whatever directory took the
        number next (another sandbox's root), so `close()` leaves it to the last holder.
        """
        with self._fd_lock:
            if self._closing:
                return -1
            self._fd_users += 1
            return self._root_fd

    def _release_root(self) -> None:
        with self._fd_lock:
            self._fd_users -= 1
            if self._closing and self._fd_users == 0:
                self._close_root()

    def __del__(self) -> None:
        with contextlib.suppress(OSError):
            self.close()

    # -- resolution -------------------------------------------------------------------------

    def _probe_openat2(self) -> bool:
        return openat2_works(self._root_fd)

    def _probe_cached(self) -> bool:
        """Whether this kernel has `RESOLVE_CACHED` (older ones refuse the flag: EINVAL)."""
        assert SYSCALL is not None
        for _ in range(3):  # "." is cached once looked up; EAGAIN only on a first look
            fd = int(SYSCALL(NR_OPENAT2, self._root_fd_c, b".", HOW_PATH, HOW_SIZE))
            if fd >= 0:
                os.close(fd)
                return True
            if ctypes.get_errno() != errno.EAGAIN:
                return False
        return False

    def _open_dir(self, parts: list[str]) -> int:
        """A new fd for the directory `parts` beneath the root, crossing no link."""
        root = self._hold_root()
        if root < 0:
            _raise("SAND_FS_IO_ERROR", "the adapter is closed")
        try:
            fd = self._open_dir_from(root, parts)
        finally:
            self._release_root()
        _refuse_kernel_filesystem(fd)
        return fd

    def _open_dir_from(self, root: int, parts: list[str]) -> int:
        # The walk (or the one openat2) is `_beneath`'s, shared with the WASM preopens.
        return open_directory(root, parts, use_openat2=self._openat2)

    def _open_leaf(self, dir_fd: int, name: str, flags: int, mode: int = 0o644) -> int:
        return open_leaf(dir_fd, name, flags, mode, use_openat2=self._openat2)

    # -- blocking operations ----------------------------------------------------------------

    def _read_sync(self, path: str, max_bytes: int) -> bytes:
        limit = min(max_bytes, self.max_read_bytes)
        parts = _components(path)
        try:
            if not parts:
                _raise("SAND_FS_NOT_A_FILE", "a directory where a file was expected")
            dfd = self._open_dir(parts[:-1])
            try:
                # Looked at before it is opened: only a regular file is opened (see the
                # module docstring). One component from `dfd`, not followed if a link.
                st = os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
                if stat.S_ISLNK(st.st_mode):
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP))
                if not stat.S_ISREG(st.st_mode):
                    _raise("SAND_FS_NOT_A_FILE", "not a regular file")
                if st.st_size > limit:
                    _raise("SAND_FS_TOO_LARGE", f"the file exceeds the read limit ({limit} bytes)")
                fd = self._open_leaf(dfd, parts[-1], os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
            finally:
                os.close(dfd)
            # A file bind-mounted from procfs or sysfs is a regular file of any size.
            _refuse_kernel_filesystem(fd)
            try:
                st = os.fstat(fd)  # what was opened: a rename may have swapped the entry
                if not stat.S_ISREG(st.st_mode):
                    _raise("SAND_FS_NOT_A_FILE", "not a regular file")
                if st.st_size > limit:
                    _raise("SAND_FS_TOO_LARGE", f"the file exceeds the read limit ({limit} bytes)")
                chunks: list[bytes] = []
                total = 0
                while True:
                    chunk = os.read(fd, min(1 << 20, limit + 1 - total))
                    if not chunk:
                        break
                    chunks.append(chunk)
                    total += len(chunk)
                    if total > limit:  # grew after fstat
                        _raise(
                            "SAND_FS_TOO_LARGE", f"the file exceeds the read limit ({limit} bytes)"
                        )
                return b"".join(chunks)
            finally:
                os.close(fd)
        except OSError as exc:
            _translate(exc)

    def _write_sync(self, path: str, data: bytes, ticket: _WriteTicket | None = None) -> None:
        if len(data) > self.max_write_bytes:
            _raise(
                "SAND_FS_TOO_LARGE",
                f"the data exceeds the write limit ({self.max_write_bytes} bytes)",
            )
        parts = _components(path)
        try:
            if not parts:
                _raise("SAND_FS_NOT_A_FILE", "a directory where a file was expected")
            name = parts[-1]
            dfd = self._open_dir(parts[:-1])
            try:
                # Only growth is reserved before the rename: room a shrinking write will free
                # is not free until it has, and a write that fails (cancelled, refused) frees
                # none. Crediting it up front let a concurrent write spend it, and the failed
                # write's release then took the total past the quota.
                grown = max(0, charge(len(data)) - self._charge_of(dfd, name))
                self._reserve(grown)
                try:
                    self._replace(dfd, name, data, grown, ticket)
                except BaseException:
                    self._usage.release(grown)
                    raise
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError as exc:
            _translate(exc)

    def _charge_of(self, dfd: int, name: str) -> int:
        """What the entry `name` now counts against the quota (a regular file's blocks; 0
        for anything else or nothing); refuses a directory, which no write may replace."""
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            return 0
        if stat.S_ISDIR(st.st_mode):
            _raise("SAND_FS_NOT_A_FILE", "a directory where a file was expected")
        return charge(st.st_size) if stat.S_ISREG(st.st_mode) else 0

    def _reserve(self, change: int) -> None:
        """Count a write's change in the root's usage: against the quota if there is one
        (measuring the tree the first time), else only once the usage is known."""
        if self.max_root_bytes is None:
            self._usage.note(change)
            return
        root = self._hold_root()
        if root < 0:
            _raise("SAND_FS_IO_ERROR", "the adapter is closed")
        try:
            self._usage.reserve(change, self.max_root_bytes, root, self.max_list_entries)
        finally:
            self._release_root()

    def _replace(
        self, dfd: int, name: str, data: bytes, reserved: int, ticket: _WriteTicket | None
    ) -> None:
        """Write `data` to a temp file beside `name` and rename it over `name`; `reserved` is
        the growth the write has already reserved."""
        tmp = _temp_name(name)
        rename_lock = _RENAME_LOCKS.get(dfd)
        fd = self._open_leaf(dfd, tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            with rename_lock:
                if ticket is not None and not ticket.commit():
                    _raise("SAND_CANCELLED", "the write was cancelled")
                # Under the directory's rename lock no write of this process can change the
                # entry: what it counts now is what the rename replaces. More growth than
                # reserved is reserved now (and may be refused); less is credited only once
                # the rename has happened.
                settled = charge(len(data)) - self._charge_of(dfd, name) - reserved
                more = max(0, settled)
                self._reserve(more)
                try:
                    os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
                except BaseException:
                    self._usage.release(more)
                    raise
                if settled < 0:
                    self._usage.note(settled)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise

    def _list_sync(self, path: str) -> list[str]:
        limit = self.max_list_entries
        names: list[str] = []
        try:
            dfd = self._open_dir(_components(path))
            try:
                # Entry by entry, so that a huge directory is refused having held no more
                # than `limit` names (`os.listdir` would build the whole list first).
                with os.scandir(dfd) as entries:
                    for entry in entries:
                        if len(names) >= limit:
                            _raise(
                                "SAND_FS_TOO_LARGE",
                                f"the directory has more than {limit} entries",
                            )
                        names.append(entry.name)
            finally:
                os.close(dfd)
        except OSError as exc:
            _translate(exc)
        names.sort()
        return names

    def _exists_sync(self, path: str) -> bool:
        """True for a file or directory reachable without crossing a link; links are False."""
        parts = _components(path)
        if not parts:
            return True
        try:
            dfd = self._open_dir(parts[:-1])
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                return False
            _translate(exc)
        try:
            st = os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        except OSError as exc:
            _translate(exc)
        finally:
            os.close(dfd)
        return stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)

    # -- answered without I/O, or not at all ------------------------------------------------

    def _open_cached(self, path: str, how: ctypes._Pointer[OpenHow]) -> int:
        """An fd for `path` (opened as `how` says) resolved from the kernel's caches alone, or
        minus the error: `-EAGAIN` where that needs I/O, `-EINVAL` for a path no request may
        name (the thread's walk refuses those with their own error) or a closed adapter."""
        if not _normalised(path.split("/")) or self._hold_root() < 0:
            return -errno.EINVAL
        try:
            return self._openat2_cached(os.fsencode(path), how)
        finally:
            self._release_root()

    def _openat2_cached(self, raw: bytes, how: ctypes._Pointer[OpenHow]) -> int:
        # The caller holds the root (`_hold_root`).
        assert SYSCALL is not None
        fd = int(SYSCALL(NR_OPENAT2, self._root_fd_c, raw, how, HOW_SIZE))
        return fd if fd >= 0 else -ctypes.get_errno()

    def _read_cached(self, path: str, limit: int) -> bytes | None:
        """The whole of a small regular file, when nothing has to wait on I/O; else None."""
        read_c = self._read_cached_c
        if read_c is None:
            return self._read_cached_python(path, limit)
        root = self._hold_root()  # the path is checked in C, as `_normalised` checks it
        if root < 0:
            return None
        try:
            return read_c(
                root,
                os.fsencode(path),
                min(limit, INLINE_READ_MAX_BYTES),
                self._read_flags,
                PATH_FLAGS,
                READ_FLAGS,
                CACHED_RESOLVE,
            )
        except OSError as exc:
            if exc.errno == errno.EOPNOTSUPP:  # no RWF_NOWAIT here: stop trying
                self._read_flags = -1
            return None
        finally:
            self._release_root()

    def _read_cached_python(self, path: str, limit: int) -> bytes | None:
        """`_read_cached` without the accelerator: the reference its C twin is tested on."""
        if not _normalised(path.split("/")) or self._hold_root() < 0:
            return None
        try:
            raw = os.fsencode(path)
            # Looked at (O_PATH) before it is opened: only a regular file is ever opened,
            # above all here on the loop, where a driver's open would hold every sandbox.
            fd = self._openat2_cached(raw, HOW_PATH)
            if fd < 0:
                return None
            try:
                st = os.fstat(fd)
            finally:
                os.close(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > min(limit, INLINE_READ_MAX_BYTES):
                return None
            fd = self._openat2_cached(raw, HOW_READ)
        except OSError:
            return None
        finally:
            self._release_root()
        if fd < 0:
            return None
        try:
            st = os.fstat(fd)
            size = st.st_size
            if not stat.S_ISREG(st.st_mode) or size > min(limit, INLINE_READ_MAX_BYTES):
                return None
            buf = bytearray(size + 1)  # one byte more: a file that grew is left to the thread
            if os.preadv(fd, [buf], 0, self._read_flags) != size:
                return None  # not all cached, or the file changed since the fstat
            del buf[size:]
            return bytes(buf)
        except OSError as exc:
            if exc.errno == errno.EOPNOTSUPP:  # no RWF_NOWAIT here: stop trying
                self._read_flags = -1
            return None
        finally:
            os.close(fd)

    def _exists_cached(self, path: str) -> bool | None:
        """`_exists_sync`'s answer when the caches alone give it (a file, a directory or a
        missing entry); None otherwise (a link, an error, a cache miss)."""
        fd = self._open_cached(path, HOW_PATH)
        if fd < 0:
            # A missing entry the caches know is missing is False, as on the thread; wherever
            # along the path it is missing (`_exists_sync` says False for both).
            return False if fd == -errno.ENOENT else None
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            return None
        finally:
            os.close(fd)
        return stat.S_ISREG(mode) or stat.S_ISDIR(mode)

    # -- FsAdapter --------------------------------------------------------------------------

    # `read_bytes` and `exists` answer at once when the caches can: `Ready` then, a coroutine
    # for the thread otherwise. Both are awaited alike; the gateway takes a `Ready`'s value
    # without the task a coroutine adapter runs in (see `_ready`).

    def read_bytes(self, path: str, *, max_bytes: int) -> Coroutine[Any, Any, bytes]:
        if self._inline and self._read_flags >= 0:
            data = self._read_cached(path, min(max_bytes, self.max_read_bytes))
            if data is not None:
                return Ready(data)
        return asyncio.to_thread(self._read_sync, path, max_bytes)

    async def write_bytes(self, path: str, data: bytes) -> None:
        ticket = _WriteTicket()
        try:
            await asyncio.to_thread(self._write_sync, path, bytes(data), ticket)
        except asyncio.CancelledError:
            ticket.cancel()
            raise

    async def list_dir(self, path: str) -> list[str]:
        return await asyncio.to_thread(self._list_sync, path)

    def exists(self, path: str) -> Coroutine[Any, Any, bool]:
        if self._inline:
            found = self._exists_cached(path)
            if found is not None:
                return Ready(found)
        return asyncio.to_thread(self._exists_sync, path)
