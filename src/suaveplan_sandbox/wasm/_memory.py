"""Bounds-checked access to a guest's linear memory. Out of range is `None`/`False`, never raised.

A host import takes one `GuestMemory` snapshot per call: the guest cannot run (so cannot grow
or move its memory) while the host function runs, so the size and base address read once at
entry stay valid until it returns, and every access is checked against that size.
"""

from __future__ import annotations

import ctypes
from typing import Final, final

import wasmtime

U32_MAX: Final = 0xFFFFFFFF


def in_bounds(ptr: int, length: int, size: int) -> bool:
    """True when `[ptr, ptr + length)` lies inside `size` bytes (i32 arguments may be negative)."""
    return 0 <= ptr <= U32_MAX and 0 <= length <= U32_MAX and ptr + length <= size


@final
class GuestMemory:
    """One host call's view of the guest's exported `memory`."""

    __slots__ = ("_base", "size")

    def __init__(self, mem: wasmtime.Memory, store: wasmtime.Caller) -> None:
        self.size: int = mem.data_len(store)
        self._base: int = ctypes.cast(mem.data_ptr(store), ctypes.c_void_p).value or 0

    def contains(self, ptr: int, length: int) -> bool:
        return in_bounds(ptr, length, self.size)

    def read(self, ptr: int, length: int) -> bytes | None:
        """Copy `length` bytes at `ptr`, or None when any byte lies outside guest memory."""
        if not in_bounds(ptr, length, self.size):
            return None
        if length == 0:
            return b""
        return ctypes.string_at(self._base + ptr, length)

    def write(self, ptr: int, data: bytes) -> bool:
        """Write `data` at `ptr`; False (and nothing written) when it would leave guest memory."""
        if not in_bounds(ptr, len(data), self.size):
            return False
        if data:
            ctypes.memmove(self._base + ptr, data, len(data))
        return True

    def write_u32(self, ptr: int, value: int) -> bool:
        return self.write(ptr, (value & U32_MAX).to_bytes(4, "little"))
