"""Bounds-checked access to a guest's linear memory. Out of range is `None`, never an exception."""

from __future__ import annotations

import ctypes
from typing import Final

import wasmtime

U32_MAX: Final = 0xFFFFFFFF


def _in_bounds(ptr: int, length: int, size: int) -> bool:
    return 0 <= ptr <= U32_MAX and 0 <= length <= U32_MAX and ptr + length <= size


def read(mem: wasmtime.Memory, store: wasmtime.Caller, ptr: int, length: int) -> bytes | None:
    """Copy `length` bytes at `ptr`, or None when any byte lies outside guest memory."""
    size = mem.data_len(store)
    if not _in_bounds(ptr, length, size):
        return None
    if length == 0:
        return b""
    base = ctypes.addressof(mem.data_ptr(store).contents)
    return ctypes.string_at(base + ptr, length)


def write(mem: wasmtime.Memory, store: wasmtime.Caller, ptr: int, data: bytes) -> bool:
    """Write `data` at `ptr`; False (and nothing written) when it would leave guest memory."""
    size = mem.data_len(store)
    if not _in_bounds(ptr, len(data), size):
        return False
    if data:
        base = ctypes.addressof(mem.data_ptr(store).contents)
        ctypes.memmove(base + ptr, data, len(data))
    return True


def write_u32(mem: wasmtime.Memory, store: wasmtime.Caller, ptr: int, value: int) -> bool:
    return write(mem, store, ptr, (value & U32_MAX).to_bytes(4, "little"))
