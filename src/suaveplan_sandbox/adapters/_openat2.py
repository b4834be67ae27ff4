"""The Linux system calls `BeneathRootFs` and `_beneath` make through ctypes: `openat2` (not in
the `os` module) and `fstatfs` (`os.statvfs` has no filesystem type).

`openat2` takes a `struct open_how`; every call names the root's fd, a relative path and
`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`, plus `RESOLVE_CACHED` for
the inline path. The argument objects that never change are built once: a ctypes object can
be passed to any number of calls, which saves ~1 us of conversions per call.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

SYS_OPENAT2: Final = 437
RESOLVE_NO_XDEV: Final = 0x01
RESOLVE_NO_MAGICLINKS: Final = 0x02
RESOLVE_NO_SYMLINKS: Final = 0x04
RESOLVE_BENEATH: Final = 0x08
RESOLVE_CACHED: Final = 0x20
RESOLVE: Final = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS


class OpenHow(ctypes.Structure):
    _fields_ = (
        ("flags", ctypes.c_uint64),
        ("mode", ctypes.c_uint64),
        ("resolve", ctypes.c_uint64),
    )


# Arguments of every `openat2` call, built once (ctypes objects are reusable arguments).
NR_OPENAT2: Final = ctypes.c_long(SYS_OPENAT2)
HOW_SIZE: Final = ctypes.c_size_t(ctypes.sizeof(OpenHow))
# The inline path's opens: from the caches alone, and never across a mount point (EXDEV), so
# the file is on the root's filesystem, whose type was checked. A read opens only what an
# `O_PATH` look (HOW_PATH) found to be a regular file; should a rename put a special file
# there in between, O_NONBLOCK keeps a FIFO from hanging the loop and O_NOCTTY keeps a
# terminal from becoming the host's controlling terminal.
CACHED_RESOLVE: Final = RESOLVE | RESOLVE_CACHED | RESOLVE_NO_XDEV
READ_FLAGS: Final = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
PATH_FLAGS: Final = os.O_PATH | os.O_CLOEXEC
HOW_READ: Final = ctypes.pointer(OpenHow(READ_FLAGS, 0, CACHED_RESOLVE))
HOW_PATH: Final = ctypes.pointer(OpenHow(PATH_FLAGS, 0, CACHED_RESOLVE))


# `statfs.f_type` of filesystems whose files the kernel makes up about the host, not data kept
# beneath the root, by the type name /proc/self/mountinfo gives them. Mounted (or bind-mounted)
# beneath a root, `proc/<pid>/environ` would hand a guest the host's environment; nothing on
# them is opened or listed, and no WASI preopen is on or holds one (`wasm/_mounts.py`).
KERNEL_FILESYSTEM_TYPES: Final[Mapping[str, int]] = MappingProxyType(
    {
        "proc": 0x9FA0,
        "sysfs": 0x62656572,
        "debugfs": 0x64626720,
        "tracefs": 0x74726163,
        "securityfs": 0x73636673,
        "cgroup": 0x27E0EB,
        "cgroup2": 0x63677270,
        "bpf": 0xCAFE4A11,
        "configfs": 0x62656570,
        "efivarfs": 0xDE5E81E4,
        "pstore": 0x6165676C,
        "devpts": 0x1CD1,
        "nsfs": 0x6E736673,
        "fusectl": 0x65735543,
        "binfmt_misc": 0x42494E4D,
        "selinuxfs": 0xF97CFF8C,
        "smackfs": 0x43415D53,
        "mqueue": 0x19800202,
    }
)
KERNEL_FILESYSTEMS: Final = frozenset(KERNEL_FILESYSTEM_TYPES.values())


def _load_libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        libc.fstatfs.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc


LIBC = _load_libc()
SYSCALL = LIBC.syscall if LIBC is not None else None


def filesystem_type(fd: int) -> int | None:
    """`statfs.f_type` of the filesystem holding `fd` (its first field, a C long on Linux), or
    None where it cannot be read."""
    if LIBC is None:
        return None
    buf = ctypes.create_string_buffer(256)  # > sizeof(struct statfs) on every Linux ABI
    if LIBC.fstatfs(ctypes.c_int(fd), buf) != 0:
        return None
    return ctypes.c_ulong.from_buffer(buf).value & 0xFFFFFFFF
