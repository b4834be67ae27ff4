"""Bounds on what compiling a module may cost the host, checked before it is compiled.

`max_module_bytes` bounds the file, not the work: Cranelift's cost grows with the number of
functions (about 30 µs and 6 KB of memory each, for an empty one), with locals (a function
declaring 50,000 locals costs 6 bytes and 2 ms), and *faster than linearly* within one
function — many locals live across many blocks (20,000 of each, a 0.3 MB module, made
Cranelift ask for 26 GB), or deep nesting over a tall operand stack. wasmtime-py offers no
compile budget, so two gates stand before a new module's native code:

1. Here, cheaply, in the host: the module's headers are read (section headers, counts, each
   body's size and local declarations; never an instruction), and a module over any header
   bound is refused with `SAND_WASM_INSTANTIATION_FAILED`, `details.stage="bounds"` and
   `details.reason` one of `Bound`'s values, before anything else reads or compiles it.
2. The compile itself runs in a child process under `CompileLimits.memory_bytes` and
   `cpu_seconds` (`_compile_child`): what the bounds miss ends that child, not the host.

The bounds are `CompileLimits` fields (`create_wasm_sandbox(compile_limits=...)`), defaulting
to the constants below. The figures were measured on the 2-core development machine with
wasmtime 51 and one compile thread (`docs/wasm-abi.md`, Module size). The bounds are generous
for toolchain output; they cap the cost, they do not make it small.

`check_compile_bounds(wasm, limits)` expects bytes wasmtime has validated: anything it cannot
read is refused (`Bound.MALFORMED`), never passed through. It returns the module's
`CompileShape` — every measure the bounds compare — which the module cache keeps beside the
compiled module, so that a cache hit is judged by the *asking* host's limits
(`check_compile_shape`) without the bytes: a module another create admitted under larger
bounds is still refused under smaller ones.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
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
# What one compile may add to the compile child's address space (RLIMIT_AS), and the CPU time
# it may use (RLIMIT_CPU, whole seconds). Within the header bounds a compile has been measured
# at up to 3.1 GB (deep nesting, which the bounds do not catch) and tens of seconds (64 MiB of
# code); our fixtures take under 20 MB and 0.1 s. A compile past either ends the child:
# `details.stage="compile"`, `details.reason="compile-resources"`.
DEFAULT_COMPILE_MEMORY_BYTES: Final = 2 * 1024 * 1024 * 1024
DEFAULT_COMPILE_CPU_SECONDS: Final = 60
# Upper ends of the two resource limits (beyond them the numbers mean nothing to the kernel).
_MAX_MEMORY_BYTES: Final = 2**48
_MAX_CPU_SECONDS: Final = 2**31 - 1

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


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class CompileLimits:
    """What compiling one new module may cost; `create_wasm_sandbox(compile_limits=...)`.

    `memory_bytes` (>= 1): address space the compile may add to the compile child's
    (RLIMIT_AS); `cpu_seconds` (>= 1): CPU time it may use there (RLIMIT_CPU, whole
    seconds). A compile past either is `SAND_WASM_INSTANTIATION_FAILED` with
    `details.stage="compile"`, and the host goes on. The `max_*` fields (>= 0) are the header
    bounds a module must be within before it is compiled, or served from the module cache
    (`details.stage="bounds"`; docs/wasm-abi.md, Module size). Defaults: the module's
    constants. A field that is not an `int` (`bool` is not) in range is
    `SAND_INVALID_ARGUMENT` with `details.field`.
    """

    memory_bytes: int = DEFAULT_COMPILE_MEMORY_BYTES
    cpu_seconds: int = DEFAULT_COMPILE_CPU_SECONDS
    max_sections: int = MAX_SECTIONS
    max_types: int = MAX_TYPES
    max_imports: int = MAX_IMPORTS
    max_functions: int = MAX_FUNCTIONS
    max_exports: int = MAX_EXPORTS
    max_globals: int = MAX_GLOBALS
    max_code_bytes: int = MAX_CODE_BYTES
    max_function_bytes: int = MAX_FUNCTION_BYTES
    max_function_locals: int = MAX_FUNCTION_LOCALS
    max_total_locals: int = MAX_TOTAL_LOCALS
    max_local_groups: int = MAX_LOCAL_GROUPS
    max_locals_times_bytes: int = MAX_LOCALS_TIMES_BYTES

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            low, high = _RANGES.get(field.name, (0, None))
            if type(value) is not int or value < low or (high is not None and value > high):
                within = f"{low}..{high}" if high is not None else f">= {low}"
                raise SuaveplanError(
                    "SAND_INVALID_ARGUMENT",
                    f"compile_limits.{field.name} must be an int {within}",
                    {"argument": "compile_limits", "field": field.name},
                )


_RANGES: Final[dict[str, tuple[int, int | None]]] = {
    "memory_bytes": (1, _MAX_MEMORY_BYTES),
    "cpu_seconds": (1, _MAX_CPU_SECONDS),
}
DEFAULT_COMPILE_LIMITS: Final = CompileLimits()

# Each bound and the `CompileLimits` field that sets it, in the order a cached module's shape
# is judged (`check_compile_shape`).
_LIMIT_FIELD: Final[dict[Bound, str]] = {
    Bound.SECTIONS: "max_sections",
    Bound.TYPES: "max_types",
    Bound.IMPORTS: "max_imports",
    Bound.FUNCTIONS: "max_functions",
    Bound.EXPORTS: "max_exports",
    Bound.GLOBALS: "max_globals",
    Bound.CODE_BYTES: "max_code_bytes",
    Bound.FUNCTION_BYTES: "max_function_bytes",
    Bound.LOCAL_GROUPS: "max_local_groups",
    Bound.FUNCTION_LOCALS: "max_function_locals",
    Bound.LOCALS_TIMES_BYTES: "max_locals_times_bytes",
    Bound.TOTAL_LOCALS: "max_total_locals",
}
# Sections whose first field is a count with a bound of its own.
_COUNTED: Final = {1: Bound.TYPES, 2: Bound.IMPORTS, 6: Bound.GLOBALS, 7: Bound.EXPORTS}


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class CompileShape:
    """Every measure of a module the bounds compare, for a module that was within them.

    `measures`: (bound, value, function) — the value is the module's count or total, or for
    a per-function bound the largest over its functions, with the index (among defined
    functions) of the first function that has it.
    """

    measures: tuple[tuple[Bound, int, int | None], ...]


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


class _Tally:
    """The measures seen so far; `see` raises `_Exceeded` at the first one over its limit."""

    __slots__ = ("at", "limits", "values")

    def __init__(self, limits: CompileLimits) -> None:
        self.limits = limits
        self.values: dict[Bound, int] = {}
        self.at: dict[Bound, int] = {}

    def see(self, bound: Bound, value: int, function: int | None = None) -> None:
        if value > self.values.get(bound, -1):
            self.values[bound] = value
            if function is not None:
                self.at[bound] = function
        limit: int = getattr(self.limits, _LIMIT_FIELD[bound])
        if value > limit:
            raise _Exceeded(bound, limit, function)

    def shape(self) -> CompileShape:
        return CompileShape(
            measures=tuple(
                (bound, self.values.get(bound, 0), self.at.get(bound)) for bound in _LIMIT_FIELD
            )
        )


def _check_code(buf: bytes, pos: int, end: int, tally: _Tally) -> None:
    tally.see(Bound.CODE_BYTES, end - pos)
    limits = tally.limits
    # The per-body checks run once per function: plain locals, not `tally.see`, in the loop.
    max_bytes, max_locals = limits.max_function_bytes, limits.max_function_locals
    max_product, max_groups = limits.max_locals_times_bytes, limits.max_local_groups
    max_total = limits.max_total_locals
    largest = {Bound.FUNCTION_BYTES: (-1, 0), Bound.FUNCTION_LOCALS: (-1, 0)}
    largest[Bound.LOCALS_TIMES_BYTES] = (-1, 0)
    bodies, pos = _u32(buf, pos, end)
    total_locals = groups_seen = 0
    try:
        for index in range(bodies):
            size, pos = _u32(buf, pos, end)
            body_end = pos + size
            if body_end > end:
                raise _Exceeded(Bound.MALFORMED)
            if size > largest[Bound.FUNCTION_BYTES][0]:
                largest[Bound.FUNCTION_BYTES] = (size, index)
            if size > max_bytes:
                raise _Exceeded(Bound.FUNCTION_BYTES, max_bytes, index)
            groups, pos = _u32(buf, pos, body_end)
            groups_seen += groups
            if groups_seen > max_groups:
                raise _Exceeded(Bound.LOCAL_GROUPS, max_groups, index)
            local_count = 0
            for _ in range(groups):
                n, pos = _u32(buf, pos, body_end)
                pos += 1  # the value type (validated by wasmtime)
                local_count += n
                if local_count > max_locals:
                    raise _Exceeded(Bound.FUNCTION_LOCALS, max_locals, index)
            if local_count > largest[Bound.FUNCTION_LOCALS][0]:
                largest[Bound.FUNCTION_LOCALS] = (local_count, index)
            product = local_count * size
            if product > largest[Bound.LOCALS_TIMES_BYTES][0]:
                largest[Bound.LOCALS_TIMES_BYTES] = (product, index)
            if product > max_product:
                raise _Exceeded(Bound.LOCALS_TIMES_BYTES, max_product, index)
            total_locals += local_count
            if total_locals > max_total:
                raise _Exceeded(Bound.TOTAL_LOCALS, max_total, index)
            pos = body_end
    finally:
        for bound, (value, index) in largest.items():
            if value >= 0:
                tally.values[bound], tally.at[bound] = value, index
        tally.values[Bound.LOCAL_GROUPS] = groups_seen
        tally.values[Bound.TOTAL_LOCALS] = total_locals


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


def _walk(wasm: bytes, tally: _Tally) -> None:
    end = len(wasm)
    pos = 8
    sections = 0
    imported = defined = 0
    while pos < end:
        sections += 1
        tally.see(Bound.SECTIONS, sections)
        sid = wasm[pos]
        size, start = _u32(wasm, pos + 1, end)
        pos = start + size
        if pos > end:
            raise _Exceeded(Bound.MALFORMED)
        if sid in _COUNTED:
            count, _ = _u32(wasm, start, pos)
            tally.see(_COUNTED[sid], count)
            if sid == 2:
                imported = _imported_functions(wasm, start, pos)
                tally.see(Bound.FUNCTIONS, imported + defined)
        elif sid == _FUNCTION:
            defined, _ = _u32(wasm, start, pos)
            tally.see(Bound.FUNCTIONS, imported + defined)
        elif sid == _CODE:
            _check_code(wasm, start, pos, tally)


def _refused(exc: _Exceeded) -> SuaveplanError:
    details: dict[str, WireValue] = {"stage": "bounds", "reason": exc.bound.value}
    if exc.limit is not None:
        details["limit"] = exc.limit
    if exc.function is not None:
        details["function"] = exc.function
    return SuaveplanError(
        "SAND_WASM_INSTANTIATION_FAILED",
        "the module exceeds a bound on what compiling it may cost",
        details,
    )


def check_compile_bounds(
    wasm: bytes, limits: CompileLimits = DEFAULT_COMPILE_LIMITS
) -> CompileShape:
    """Refuse a (validated) module over any of `limits`' bounds; else its shape."""
    tally = _Tally(limits)
    try:
        _walk(wasm, tally)
    except _Exceeded as exc:
        raise _refused(exc) from None
    return tally.shape()


def bound_values(limits: CompileLimits) -> tuple[int, ...]:
    """The header bounds of `limits` (every `max_*` field): all a bounds refusal depends on."""
    return tuple(getattr(limits, field) for field in _LIMIT_FIELD.values())


def check_compile_shape(shape: CompileShape, limits: CompileLimits) -> None:
    """Refuse a module whose shape (from `check_compile_bounds`) is over `limits`' bounds."""
    for bound, value, function in shape.measures:
        limit: int = getattr(limits, _LIMIT_FIELD[bound])
        if value > limit:
            raise _refused(_Exceeded(bound, limit, function))
