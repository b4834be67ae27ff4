"""Opening a directory beneath a directory descriptor without following any symbolic link.

Shared by `BeneathRootFs` (every request beneath the policy root), the WASM host's preopens
(each vetted directory, from `/`) and the migrations reader (the plugin's folder itself).

Theory of operation: where the kernel has it, one `openat2` with `RESOLVE_BENEATH |
RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS` resolves the whole path, refusing a link at any
component at the moment the kernel walks it. Elsewhere, one `openat(O_NOFOLLOW |
O_DIRECTORY)` per component, each relative to the descriptor of the one before: a component
swapped for a link between two steps is refused by the step that reaches it, because each
step is itself one no-follow open. Either way *every* link is refused (`OSError(ELOOP)`),
including one that would stay beneath the start; a component that is not a directory (a
file, a FIFO, a device: never opened as one, so no driver runs) is `ENOTDIR`; a missing one
`ENOENT`. Components are plain names: empty, `.`, `..` or a name holding `/` or NUL is
`EINVAL`, refused before any system call, in both modes alike.

The leaf of a file request is opened by the caller, from the directory this returns, with
its own checks (see `BeneathRootFs._read_sync`).
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from collections.abc import Sequence
from functools import cache
from typing import Final

from suaveplan_sandbox.adapters._openat2 import HOW_SIZE, NR_OPENAT2, RESOLVE, SYSCALL, OpenHow

DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _refuse(code: int) -> OSError:
    return OSError(code, os.strerror(code))


def plain_components(parts: Sequence[str]) -> bool:
    """No empty, `.` or `..` component, none holding `/` or NUL: names, not a path. (A `..`
    would climb out of a walk, which follows it like any directory; a `/` would have the
    kernel resolve several components in one open, following links in all but the last.)"""
    joined = "".join(parts)
    return (
        "" not in parts
        and "." not in parts
        and ".." not in parts
        and "/" not in joined
        and "\0" not in joined
    )


def openat2(dir_fd: int, rel: str, flags: int, mode: int = 0) -> int:
    """`openat2(dir_fd, rel)` resolved beneath `dir_fd` crossing no link (OSError otherwise).

    `EAGAIN` (the kernel saw a concurrent rename it could not rule out) is reported as
    `ELOOP`: refused, never retried into a path that may now lead elsewhere."""
    # openat2 rejects a mode without O_CREAT (EINVAL).
    how = OpenHow(flags, mode if flags & os.O_CREAT else 0, RESOLVE)
    assert SYSCALL is not None
    fd = int(
        SYSCALL(NR_OPENAT2, ctypes.c_int(dir_fd), os.fsencode(rel), ctypes.byref(how), HOW_SIZE)
    )
    if fd < 0:
        err = ctypes.get_errno()
        if err == errno.EAGAIN:
            err = errno.ELOOP
        raise _refuse(err)
    return fd


def openat2_works(dir_fd: int) -> bool:
    """Whether `openat2` can be called here (a kernel before 5.6, or a seccomp filter, says
    ENOSYS or EPERM): probed by opening `dir_fd` itself."""
    if SYSCALL is None:
        return False
    try:
        fd = openat2(dir_fd, ".", DIR_FLAGS & ~os.O_NOFOLLOW)
    except OSError:
        return False
    os.close(fd)
    return True


@cache
def openat2_available() -> bool:
    """`openat2_works`, once per process, against `/`."""
    root = os.open("/", DIR_FLAGS & ~os.O_NOFOLLOW)
    try:
        return openat2_works(root)
    finally:
        os.close(root)


def open_component(dir_fd: int | None, name: str | os.PathLike[str], flags: int = DIR_FLAGS) -> int:
    """The directory `name` (relative to `dir_fd`, or a path whose *last* component is the
    one checked), never through a link: `ELOOP` if it is one, as `openat2` says it.

    `O_NOFOLLOW | O_DIRECTORY` on a link fails with `ENOTDIR`, as on a file: only then is
    the entry looked at (not followed), to say which it was."""
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except NotADirectoryError:
        if stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
            raise _refuse(errno.ELOOP) from None
        raise


def open_directory(dir_fd: int, parts: Sequence[str], *, use_openat2: bool) -> int:
    """A new descriptor for the directory `parts` beneath `dir_fd` (`dir_fd` itself, dup'ed,
    for no parts), crossing no link; `use_openat2` only where `openat2_works`.

    `dir_fd` stays open and the caller's: a walk closes only the descriptors it opened."""
    if not parts:
        return os.dup(dir_fd)
    if use_openat2:
        rel = "/".join(parts)
        # `plain_components` on the joined text, in a few C-level scans (this is every fs
        # request's path): one more `/` than the joins is a part holding one.
        wrapped = f"/{rel}/"
        if (
            "//" in wrapped
            or "/./" in wrapped
            or "/../" in wrapped
            or "\0" in rel
            or rel.count("/") != len(parts) - 1
        ):
            raise _refuse(errno.EINVAL)
        return openat2(dir_fd, rel, DIR_FLAGS & ~os.O_NOFOLLOW)
    if not plain_components(parts):
        raise _refuse(errno.EINVAL)
    fd = dir_fd
    try:
        for part in parts:
            nxt = open_component(fd, part)
            if fd != dir_fd:
                os.close(fd)
            fd = nxt
    except BaseException:
        if fd != dir_fd:
            os.close(fd)
        raise
    return fd


def open_leaf(dir_fd: int, name: str, flags: int, mode: int = 0o644, *, use_openat2: bool) -> int:
    """`name` in the directory `dir_fd` opened with `flags`, never through a link (`ELOOP`;
    a plain `O_NOFOLLOW` open where `openat2` is not used); `name` is one plain name."""
    if not name or name in {".", ".."} or "/" in name or "\0" in name:
        raise _refuse(errno.EINVAL)
    if use_openat2:
        return openat2(dir_fd, name, flags | os.O_CLOEXEC, mode)
    return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
