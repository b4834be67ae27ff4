"""Bounds on what compiling a module may cost the host, checked before wasmtime compiles it.

`max_module_bytes` bounds the file, not the work: Cranelift's cost grows with the number of
functions (about 30 µs and 6 KB of host memory each, for an empty one), with locals (a
function declaring 50,000 locals costs 6 bytes and 2 ms), and *faster than linearly* within
one function — many locals live across many blocks (20,000 of each, a 0.3 MB module, made
Cranelift ask for 26 GB and abort the whole process), or deep nesting over a tall operand
stack. wasmtime-py offers no compile budget, so the module's headers are read here, cheaply
(section headers, counts, each body's size and local declarations; never an instruction),
and a module over any bound is refused with `SAND_WASM_INSTANTIATION_FAILED`,
`details.stage="bounds"` and `details.reason` one of `Bound`'s values, before any compile.
The figures were measured on the 2-core development machine with wasmtime 51 and one
compile thread (`docs/wasm-abi.md`, Module size). The bounds are generous for toolchain
output; they cap the cost, they do not make it small.

`check_compile_bounds(wasm)` expects bytes wasmtime has validated: anything it cannot read
is refused (`Bound.MALFORMED`), never passed through.
"""

from __future__ import annotations

import enum
from typing import Final, final

from suaveplan_sandbox.errors import SuaveplanError, WireValue

# Sections of any kind, custom ones included (host-side walks loop over them).
MAX_SECTIONS: Final = 256
MAX_TYPES: Final = 100_000
MAX_IMPORTS: Final = 10_000
# Imported plus defined functions: ~3 s of one core and ~0.6 GB at the bound.
MAX_FUNCTIONS: Final = 100_000
MAX_EXPORTS: Final = 100_000
# Data and element segments: wasmtime's own limit (100,000 each) is cheap (~0.05 s) to compile.
MAX_GLOBALS: Final = 100_000
# The code section's size, and one function body's.
MAX_CODE_BYTES: Final = 64 * 1024 * 1024
MAX_FUNCTION_BYTES: Final = 256 * 1024
# Locals declared by one function, by all of them, and the entries declaring them.
MAX_FUNCTION_LOCALS: Final = 10_000
MAX_TOTAL_LOCALS: Final = 1_000_000
MAX_LOCAL_GROUPS: Final = 1_000_000
# One function's locals times its body bytes: the quadratic term (locals live across blocks).
# At the bound Cranelift spends about 0.4 s and 0.2 GB on that function.
MAX_LOCALS_TIMES_BYTES: Final = 64_000_000

_FUNCTION, _CODE = 3, 10


@final
class Bound(enum.Enum):
    """Which bound a module exceeded (`details.reason`)."""

    SECTIONS = "too-many-sections"
    TYPES = "too-many-types"
    IMPORTS = "too-many-imports"
    FUNCTIONS = "too-many-functions"
    EXPORTS = "too-many-exports"
    GLOBALS = "too-many-globals"
    CODE_BYTES = "code-too-large"
    FUNCTION_BYTES = "function-too-large"
    FUNCTION_LOCALS = "too-many-locals"
    TOTAL_LOCALS = "too-many-locals-in-module"
    LOCAL_GROUPS = "too-many-local-declarations"
    LOCALS_TIMES_BYTES = "function-too-costly"
    MALFORMED = "malformed"


# Sections whose first field is a count with a bound of its own.
_COUNTED: Final = {
    1: (Bound.TYPES, MAX_TYPES),
    2: (Bound.IMPORTS, MAX_IMPORTS),
    6: (Bound.GLOBALS, MAX_GLOBALS),
    7: (Bound.EXPORTS, MAX_EXPORTS),
}


class _Exceeded(Exception):  # internal: becomes the coded error in `check_compile_bounds`
    def __init__(self, bound: Bound, limit: int | None = None, function: int | None = None) -> None:
        super().__init__(bound.value)
        self.bound, self.limit, self.function = bound, limit, function


def _u32(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    for _ in range(5):
        if pos >= end:
            raise _Exceeded(Bound.MALFORMED)
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            if result >> 32:
                raise _Exceeded(Bound.MALFORMED)
            return result, pos
    raise _Exceeded(Bound.MALFORMED)


def _check_code(buf: bytes, pos: int, end: int) -> None:
    if end - pos > MAX_CODE_BYTES:
        raise _Exceeded(Bound.CODE_BYTES, MAX_CODE_BYTES)
    bodies, pos = _u32(buf, pos, end)
    total_locals = groups_seen = 0
    for index in range(bodies):
        size, pos = _u32(buf, pos, end)
        body_end = pos + size
        if body_end > end:
            raise _Exceeded(Bound.MALFORMED)
        if size > MAX_FUNCTION_BYTES:
            raise _Exceeded(Bound.FUNCTION_BYTES, MAX_FUNCTION_BYTES, index)
        groups, pos = _u32(buf, pos, body_end)
        groups_seen += groups
        if groups_seen > MAX_LOCAL_GROUPS:
            raise _Exceeded(Bound.LOCAL_GROUPS, MAX_LOCAL_GROUPS, index)
        local_count = 0
        for _ in range(groups):
            n, pos = _u32(buf, pos, body_end)
            pos += 1  # the value type (validated by wasmtime)
            local_count += n
            if local_count > MAX_FUNCTION_LOCALS:
                raise _Exceeded(Bound.FUNCTION_LOCALS, MAX_FUNCTION_LOCALS, index)
        if local_count * size > MAX_LOCALS_TIMES_BYTES:
            raise _Exceeded(Bound.LOCALS_TIMES_BYTES, MAX_LOCALS_TIMES_BYTES, index)
        total_locals += local_count
        if total_locals > MAX_TOTAL_LOCALS:
            raise _Exceeded(Bound.TOTAL_LOCALS, MAX_TOTAL_LOCALS, index)
        pos = body_end


def _limits(buf: bytes, pos: int, end: int) -> int:
    if pos >= end:
        raise _Exceeded(Bound.MALFORMED)
    flags = buf[pos]
    _, pos = _u32(buf, pos + 1, end)
    if flags & 1:
        _, pos = _u32(buf, pos, end)
    return pos


def _imported_functions(buf: bytes, pos: int, end: int) -> int:
    """How many functions the import section imports (of a module valid under our config:
    reference types are one byte, limits 32-bit)."""
    count, pos = _u32(buf, pos, end)
    functions = 0
    for _ in range(count):
        for _name in range(2):
            n, pos = _u32(buf, pos, end)
            pos += n
        if pos >= end:
            raise _Exceeded(Bound.MALFORMED)
        kind = buf[pos]
        pos += 1
        if kind == 0x00:  # function: type index
            functions += 1
            _, pos = _u32(buf, pos, end)
        elif kind == 0x01:  # table: reference type, limits
            pos = _limits(buf, pos + 1, end)
        elif kind == 0x02:  # memory: limits
            pos = _limits(buf, pos, end)
        elif kind == 0x03:  # global: value type, mutability
            pos += 2
        else:
            raise _Exceeded(Bound.MALFORMED)
    if pos != end:
        raise _Exceeded(Bound.MALFORMED)
    return functions


def _walk(wasm: bytes) -> None:
    end = len(wasm)
    pos = 8
    sections = 0
    imported = defined = 0
    while pos < end:
        sections += 1
        if sections > MAX_SECTIONS:
            raise _Exceeded(Bound.SECTIONS, MAX_SECTIONS)
        sid = wasm[pos]
        size, start = _u32(wasm, pos + 1, end)
        pos = start + size
        if pos > end:
            raise _Exceeded(Bound.MALFORMED)
        if sid in _COUNTED:
            bound, limit = _COUNTED[sid]
            count, _ = _u32(wasm, start, pos)
            if count > limit:
                raise _Exceeded(bound, limit)
            if sid == 2:
                imported = _imported_functions(wasm, start, pos)
        elif sid == _FUNCTION:
            defined, _ = _u32(wasm, start, pos)
            if defined > MAX_FUNCTIONS:
                raise _Exceeded(Bound.FUNCTIONS, MAX_FUNCTIONS)
        elif sid == _CODE:
            _check_code(wasm, start, pos)
    if imported + defined > MAX_FUNCTIONS:
        raise _Exceeded(Bound.FUNCTIONS, MAX_FUNCTIONS)


def check_compile_bounds(wasm: bytes) -> None:
    """Refuse a (validated) module over any bound; see the module docstring."""
    try:
        _walk(wasm)
    except _Exceeded as exc:
        details: dict[str, WireValue] = {"stage": "bounds", "reason": exc.bound.value}
        if exc.limit is not None:
            details["limit"] = exc.limit
        if exc.function is not None:
            details["function"] = exc.function
        raise SuaveplanError(
            "SAND_WASM_INSTANTIATION_FAILED",
            "the module exceeds a bound on what compiling it may cost",
            details,
        ) from None
