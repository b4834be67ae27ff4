"""Kernel filesystems mounted at or beneath a WASI preopen's host directory.

wasmtime (cap-std) resolves a guest's paths beneath the preopen descriptor it is handed and
crosses mount points on the way, so the fs adapter's per-request refusal of kernel
filesystems (`adapters._openat2.KERNEL_FILESYSTEMS`) cannot apply to a guest: a procfs mounted
beneath a preopen (a container rootfs as the root, or a root of "/") would hand it
`proc/<pid>/environ`, the host's environment. The host reads its mount table,
`/proc/self/mountinfo`, once per create and refuses a preopen holding such a mount.

A mountinfo line is `id parent major:minor root mount-point options [optional...] - type
source super-options`; the kernel writes a space, tab, newline or backslash in a path as an
octal escape (`\\040`, `\\011`, `\\012`, `\\134`). A line not of that shape is `ValueError`:
the caller fails closed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Final

from suaveplan_sandbox.adapters._openat2 import KERNEL_FILESYSTEM_TYPES

MOUNTINFO: Path = Path("/proc/self/mountinfo")
_OCTAL: Final = re.compile(rb"\\([0-7]{3})")
_KERNEL_TYPES: Final = frozenset(name.encode() for name in KERNEL_FILESYSTEM_TYPES)


def read_mountinfo() -> bytes | None:
    """This process's mount table (`MOUNTINFO`), or None where it cannot be read."""
    try:
        return MOUNTINFO.read_bytes()
    except OSError:
        return None


def _unescape(field: bytes) -> str:
    return os.fsdecode(_OCTAL.sub(lambda m: bytes((int(m.group(1), 8) & 0xFF,)), field))


def kernel_mounts(data: bytes) -> list[tuple[str, str]]:
    """(mount point, type name) of each kernel-filesystem mount in mountinfo `data`, in order.

    Only the type of a line is looked at before it is kept, so a large table costs one split
    per line. `ValueError` for a line not of mountinfo's shape."""
    out: list[tuple[str, str]] = []
    for line in data.splitlines():
        fields = line.split(b" ")
        # Six fixed fields, optional ones, "-", then the type (and source, super-options).
        try:
            sep = fields.index(b"-", 6)
        except ValueError:
            raise ValueError("a mountinfo line without its separator") from None
        if sep + 1 >= len(fields) or not fields[4].startswith(b"/"):
            raise ValueError("a mountinfo line of the wrong shape")
        fstype = fields[sep + 1]
        if fstype in _KERNEL_TYPES:
            out.append((_unescape(fields[4]), fstype.decode()))
    return out


def kernel_mount_beneath(
    host: PurePosixPath, mounts: Sequence[tuple[str, str]]
) -> tuple[str, str] | None:
    """The first of `mounts` whose mount point is `host` or beneath it, component by component
    (`/database` is not beneath `/data`); `host` is the preopen's resolved real path."""
    parts = host.parts
    n = len(parts)
    for point, fstype in mounts:
        if PurePosixPath(point).parts[:n] == parts:
            return point, fstype
    return None
