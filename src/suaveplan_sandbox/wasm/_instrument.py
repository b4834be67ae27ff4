"""Rewrite a guest module so that a refused `memory.grow` leaves a record the host can read.

wasmtime-py (50.0.1) has no resource-limiter callback: a `memory.grow` refused by the
store's `memoryMb` limit just returns -1 to the guest. To tell *exactly* whether memoryMb
refused a grow, every `memory.grow` of memory 0 in every function body is replaced by
`call $grow_hook`, a function appended to the module that runs the same `memory.grow` and,
when it returns -1, counts the refusal and records the total size it asked for (memory.size
+ delta, in pages) in two appended mutable i64 globals, exported as `REFUSALS_EXPORT` and
`REFUSED_PAGES_EXPORT`. Appending *defined* functions, globals and one function type shifts
no existing index (imports come first in each index space; the new type is the last), so
nothing else in the module changes; the guest sees the same -1 or previous size as before.

Theory of operation: `instrument(wasm)` walks the binary once, section by section and the
code section instruction by instruction, and returns either `Instrumented` (the new bytes
and memory 0's declared maximum) or `NotInstrumented(reason)`. It never raises: everything
it reads is attacker bytes, so each read is bounds-checked, LEB128 numbers are at most 5
(32-bit) or 10 (64-bit) bytes and in range, counts are checked against the bytes left, and
the walk is a flat loop (block nesting is not tracked, so no recursion). Anything it does not
know — an opcode outside MVP, sign-extension, non-trapping conversions, bulk memory,
reference types, SIMD (with relaxed SIMD), multi-value and tail calls; GC or exception
types; memory64; shared memories; custom page sizes; a `memory.grow` of another memory; an
export already named like ours — is not guessed at: the module stays as it is and the host
keeps inferring the verdict from sizes (`docs/wasm-abi.md`, Budgets). Nor is a code section
larger than `MAX_REWRITE_CODE_BYTES` walked (the walk holds the GIL). A module without
`memory.grow` needs no rewrite.

Why our own walker: the maintained pure-Python decoders on PyPI (`pywasm`, an interpreter;
`wasm-tools`, a triage/report tool; `wasm`/`wasm-tob`, MVP-only and unmaintained since
2019-2023) decode to reports or interpreter structures and none re-encodes a module, so a
rewrite would still need this encoder plus a second, larger parser of attacker bytes whose
error behaviour we do not control. What the rewrite needs is small: instruction *lengths*
(not their meaning), a few section counts, and re-encoded sizes. The original module is
validated by wasmtime before it is rewritten (see `_engine.load_module`), so the rewrite
never turns an invalid module (say, one naming a global index that only the appended
globals would make valid) into a valid one, and the rewritten bytes are validated again
when compiled; if wasmtime rejects them, the original is compiled instead.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final, final

REFUSALS_EXPORT: Final = "suaveplan:memory-grow-refusals"
REFUSED_PAGES_EXPORT: Final = "suaveplan:memory-grow-refused-pages"
_RESERVED: Final = frozenset({REFUSALS_EXPORT.encode(), REFUSED_PAGES_EXPORT.encode()})

_MAGIC: Final = b"\0asm\x01\0\0\0"
# Section ids in the order the binary format requires them (custom sections, id 0, may
# stand anywhere). Tag (13) sits between memory and global; data count (12) before code.
_ORDER: Final = (1, 2, 3, 4, 5, 13, 6, 7, 8, 9, 12, 10, 11)
_RANK: Final = {sid: rank for rank, sid in enumerate(_ORDER)}
_TYPE, _IMPORT, _FUNCTION, _MEMORY, _GLOBAL, _EXPORT, _CODE = 1, 2, 3, 5, 6, 7, 10
_START: Final = 8
# Value types of MVP, SIMD and reference types (i32 i64 f32 f64 v128 funcref externref).
_VALTYPES: Final = frozenset({0x7F, 0x7E, 0x7D, 0x7C, 0x7B, 0x70, 0x6F})
_REFTYPES: Final = frozenset({0x70, 0x6F})
# Guards against absurd inputs before wasmtime's own limits would apply.
MAX_MODULE_BYTES: Final = 256 * 1024 * 1024
# The most `memory.grow` instructions a module may have and still be rewritten. The walk
# keeps a span per instruction (and the rewrite two parts): without a bound a module made of
# `memory.grow`s would cost the host ~75 times its size in memory. Real modules have a few
# (an allocator's sbrk); one with more is left as it is (`UNSUPPORTED`, inference).
MAX_GROWS: Final = 4096
# The largest code section rewritten. The walk is pure Python (about 0.2 s per MB of code on
# the development machine) and holds the GIL but for the interpreter's switch interval, so
# a larger module is left as it is (`TOO_LARGE`, inference) instead of slowing the host.
MAX_REWRITE_CODE_BYTES: Final = 4 * 1024 * 1024


@final
class Skip(enum.Enum):
    """Why a module was left as it is (the host then infers the verdict from sizes)."""

    NO_MEMORY_GROW = "no-memory-grow"
    MALFORMED = "malformed"  # truncated, lying sizes, LEB128 overflow, counts past the end
    UNSUPPORTED = "unsupported"  # a construct the walker does not know: not guessed at
    RESERVED_EXPORT = "reserved-export"  # the module already exports one of our names
    REJECTED = "rejected"  # wasmtime refused the rewritten bytes (set by the engine)
    TOO_LARGE = "too-large"  # a code section over MAX_REWRITE_CODE_BYTES: not walked


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Instrumented:
    """The rewritten module; `declared_max_pages` is memory 0's own maximum, if it has one."""

    wasm: bytes
    declared_max_pages: int | None
    grows: int  # how many `memory.grow` instructions now call the hook


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class NotInstrumented:
    reason: Skip
    detail: str = ""


class _Cannot(Exception):  # internal control flow: never leaves `instrument`
    def __init__(self, reason: Skip, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def _malformed(detail: str) -> _Cannot:
    return _Cannot(Skip.MALFORMED, detail)


def _unsupported(detail: str) -> _Cannot:
    return _Cannot(Skip.UNSUPPORTED, detail)


@final
class _Reader:
    """Bounds-checked reads of `buf[pos:end]`; every failure is `_Cannot(MALFORMED)`."""

    __slots__ = ("buf", "end", "pos")

    def __init__(self, buf: bytes, pos: int, end: int) -> None:
        self.buf, self.pos, self.end = buf, pos, end

    def byte(self) -> int:
        if self.pos >= self.end:
            raise _malformed("unexpected end")
        b = self.buf[self.pos]
        self.pos += 1
        return b

    def skip(self, n: int) -> None:
        if n < 0 or n > self.end - self.pos:
            raise _malformed("a length runs past the end")
        self.pos += n

    def _leb(self, max_bytes: int) -> tuple[int, int]:
        result = shift = 0
        buf, pos, end = self.buf, self.pos, self.end
        for _ in range(max_bytes):
            if pos >= end:
                raise _malformed("unexpected end in a LEB128 number")
            b = buf[pos]
            pos += 1
            result |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                self.pos = pos
                return result, shift
        raise _malformed("a LEB128 number is too long")

    def u32(self) -> int:
        value, _ = self._leb(5)
        if value >> 32:
            raise _malformed("a u32 is out of range")
        return value

    def signed(self, bits: int) -> int:
        value, shift = self._leb(5 if bits <= 33 else 10)
        if value >> (shift - 1) & 1:
            value -= 1 << shift
        if not -(1 << (bits - 1)) <= value < 1 << (bits - 1):
            raise _malformed("a signed LEB128 number is out of range")
        return value

    def count(self, min_entry_bytes: int = 1) -> int:
        """A vector length, refused when the bytes left cannot hold that many entries."""
        n = self.u32()
        if n * min_entry_bytes > self.end - self.pos:
            raise _malformed("a count is larger than the bytes left")
        return n

    def name(self) -> bytes:
        n = self.u32()
        start = self.pos
        self.skip(n)
        return self.buf[start : self.pos]

    def valtype(self) -> int:
        t = self.byte()
        if t not in _VALTYPES:
            raise _unsupported(f"value type {t:#x}")
        return t

    def limits(self, *, memory: bool) -> tuple[int, int | None]:
        flags = self.byte()
        # 0x02/0x03: shared (threads: another thread could grow it between the hook's grow
        # and its memory.size, and wasmtime grows shared memories outside the store's
        # limiter); 0x04+: 64-bit; 0x08: custom page size. None is guessed at.
        if flags not in (0x00, 0x01):
            raise _unsupported(f"{'memory' if memory else 'table'} limits flags {flags:#x}")
        minimum = self.u32()
        maximum = self.u32() if flags & 1 else None
        return minimum, maximum


def _leb_u(value: int) -> bytes:
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


# Immediate kinds, indexed by opcode; 0 = unknown (not guessed at: UNSUPPORTED).
_NONE, _BLOCK, _IDX, _BR_TABLE, _IDX2, _SELECT_T, _MEMARG, _MEMIDX, _GROW = range(1, 10)
_I32, _I64, _F32, _F64, _REFNULL, _FC, _FD = range(10, 17)


def _opcode_table() -> bytes:
    kinds = bytearray(256)
    for op in (0x00, 0x01, 0x05, 0x0B, 0x0F, 0x1A, 0x1B, 0xD1, *range(0x45, 0xC5)):
        kinds[op] = _NONE
    for op in (0x02, 0x03, 0x04):
        kinds[op] = _BLOCK
    # br, br_if, call, return_call, local.*/global.*, table.get/set, ref.func
    for op in (0x0C, 0x0D, 0x10, 0x12, *range(0x20, 0x27), 0xD2):
        kinds[op] = _IDX
    kinds[0x0E] = _BR_TABLE
    kinds[0x11] = kinds[0x13] = _IDX2  # call_indirect, return_call_indirect
    kinds[0x1C] = _SELECT_T
    for op in range(0x28, 0x3F):
        kinds[op] = _MEMARG
    kinds[0x3F] = _MEMIDX
    kinds[0x40] = _GROW
    kinds[0x41], kinds[0x42], kinds[0x43], kinds[0x44] = _I32, _I64, _F32, _F64
    kinds[0xD0] = _REFNULL
    kinds[0xFC], kinds[0xFD] = _FC, _FD
    return bytes(kinds)


_KINDS: Final = _opcode_table()
# 0xFC sub-opcodes: 0-7 trunc_sat (none); 8 memory.init (data, mem); 9 data.drop (data);
# 10 memory.copy (mem, mem); 11 memory.fill (mem); 12 table.init (elem, table);
# 13 elem.drop; 14 table.copy; 15 table.grow; 16 table.size; 17 table.fill.
_FC_IMMEDIATES: Final = (0,) * 8 + (2, 1, 2, 1, 2, 1, 2, 1, 1, 1)
# 0xFD (SIMD) sub-opcodes with immediates; every other known one (up to 0x113, relaxed
# SIMD included) has none.
_FD_MEMARG: Final = frozenset(range(0, 12)) | {92, 93}
_FD_MEMARG_LANE: Final = frozenset(range(84, 92))
_FD_LANE: Final = frozenset(range(21, 35))
_FD_LAST: Final = 0x113


def _memarg(r: _Reader) -> None:
    align = r.u32()
    if align & 0x40:  # multi-memory: a memory index follows
        r.u32()
    r.u32()  # offset (memory64 modules are refused before code is read)


def _body_grows(r: _Reader, budget: int) -> list[tuple[int, int]]:
    """Walk one function body's instructions; the (start, end) of each `memory.grow 0`.

    More than `budget` of them is UNSUPPORTED (see `MAX_GROWS`).
    """
    kinds = _KINDS
    grows: list[tuple[int, int]] = []
    buf, end = r.buf, r.end
    while r.pos < end:
        start = r.pos
        op = buf[start]
        r.pos += 1
        kind = kinds[op]
        if kind == _NONE:
            continue
        if kind == _IDX:
            r.u32()
        elif kind == _MEMARG:
            _memarg(r)
        elif kind == _I32:
            r.signed(32)
        elif kind == _BLOCK:
            t = r.byte()
            if t != 0x40 and t not in _VALTYPES:
                r.pos -= 1
                if r.signed(33) < 0:  # a type index; negative = an unknown type form
                    raise _unsupported(f"block type {t:#x}")
        elif kind == _GROW:
            if r.u32() != 0:
                raise _unsupported("memory.grow of a memory other than memory 0")
            if len(grows) >= budget:
                raise _unsupported(f"more than {MAX_GROWS} memory.grow instructions")
            grows.append((start, r.pos))
        elif kind == _MEMIDX:
            r.u32()
        elif kind == _I64:
            r.signed(64)
        elif kind == _F32:
            r.skip(4)
        elif kind == _F64:
            r.skip(8)
        elif kind == _IDX2:
            r.u32()
            r.u32()
        elif kind == _BR_TABLE:
            for _ in range(r.count() + 1):
                r.u32()
        elif kind == _SELECT_T:
            for _ in range(r.count()):
                r.valtype()
        elif kind == _REFNULL:
            t = r.byte()
            if t not in _REFTYPES:
                raise _unsupported(f"heap type {t:#x}")
        elif kind == _FC:
            sub = r.u32()
            if sub >= len(_FC_IMMEDIATES):
                raise _unsupported(f"opcode 0xfc {sub}")
            for _ in range(_FC_IMMEDIATES[sub]):
                r.u32()
        elif kind == _FD:
            sub = r.u32()
            if sub in _FD_MEMARG:
                _memarg(r)
            elif sub in _FD_MEMARG_LANE:
                _memarg(r)
                r.byte()
            elif sub in _FD_LANE:
                r.byte()
            elif sub in (12, 13):  # v128.const, i8x16.shuffle
                r.skip(16)
            elif sub > _FD_LAST:
                raise _unsupported(f"opcode 0xfd {sub}")
        else:
            raise _unsupported(f"opcode {op:#x}")
    if r.pos != end or end <= 0 or buf[end - 1] != 0x0B:
        raise _malformed("a function body does not end with `end`")
    return grows


@final
@dataclass(slots=True)
class _Section:
    sid: int
    start: int  # payload start in the input
    end: int


def _sections(wasm: bytes) -> list[_Section]:
    if len(wasm) > MAX_MODULE_BYTES:
        raise _malformed("the module is too large")
    if len(wasm) < 8 or wasm[:4] != _MAGIC[:4]:
        raise _malformed("not a WebAssembly binary")
    if wasm[:8] != _MAGIC:
        raise _unsupported("not a core module of version 1")
    r = _Reader(wasm, 8, len(wasm))
    out: list[_Section] = []
    last_rank = -1
    while r.pos < r.end:
        sid = r.byte()
        size = r.u32()
        start = r.pos
        r.skip(size)
        if sid != 0:
            rank = _RANK.get(sid)
            if rank is None:
                raise _unsupported(f"section id {sid}")
            if rank <= last_rank:
                raise _malformed("sections out of order or repeated")
            last_rank = rank
        out.append(_Section(sid, start, r.pos))
    return out


@final
@dataclass(slots=True)
class _Facts:
    types: int = 0
    imported_funcs: int = 0
    imported_globals: int = 0
    memories: int = 0
    memory0_max: int | None = None
    defined_funcs: int = 0
    globals: int = 0
    exports: int = 0
    bodies: int = 0
    grows: int = 0  # memory.grow instructions seen so far
    first_body: int = 0  # where the first body starts in the code section


def _read_types(r: _Reader, facts: _Facts) -> None:
    facts.types = r.count(3)
    for _ in range(facts.types):
        form = r.byte()
        if form != 0x60:  # rec groups / subtypes (GC) would make indices != entries
            raise _unsupported(f"type form {form:#x}")
        for _ in range(r.count()):
            r.valtype()
        for _ in range(r.count()):
            r.valtype()


def _read_imports(r: _Reader, facts: _Facts) -> None:
    for _ in range(r.count(4)):
        r.name()
        r.name()
        kind = r.byte()
        if kind == 0x00:
            r.u32()
            facts.imported_funcs += 1
        elif kind == 0x01:
            if r.byte() not in _REFTYPES:
                raise _unsupported("table import of a reference type we do not know")
            r.limits(memory=False)
        elif kind == 0x02:
            _, maximum = r.limits(memory=True)
            if facts.memories == 0:
                facts.memory0_max = maximum
            facts.memories += 1
        elif kind == 0x03:
            r.valtype()
            if r.byte() not in (0, 1):
                raise _malformed("global mutability")
            facts.imported_globals += 1
        else:
            raise _unsupported(f"import kind {kind:#x}")


def _read_memories(r: _Reader, facts: _Facts) -> None:
    for _ in range(r.count(2)):
        _, maximum = r.limits(memory=True)
        if facts.memories == 0:
            facts.memory0_max = maximum
        facts.memories += 1


def _read_exports(r: _Reader, facts: _Facts) -> None:
    facts.exports = r.count(3)
    for _ in range(facts.exports):
        if r.name() in _RESERVED:
            raise _Cannot(Skip.RESERVED_EXPORT, "the module already exports a reserved name")
        r.byte()
        r.u32()


def _read_code(
    wasm: bytes, r: _Reader, facts: _Facts
) -> list[tuple[int, int, int, list[tuple[int, int]]]]:
    """Each body with a `memory.grow` as (start of its size field, start of its locals, end,
    grow spans); the others are copied as they are, so they cost nothing to remember."""
    facts.bodies = r.count(2)
    facts.first_body = r.pos
    bodies = []
    for _ in range(facts.bodies):
        head = r.pos
        size = r.u32()
        start = r.pos
        r.skip(size)
        body = _Reader(wasm, start, r.pos)
        for _ in range(body.count(2)):
            body.u32()
            body.valtype()
        spans = _body_grows(body, MAX_GROWS - facts.grows)
        if spans:
            facts.grows += len(spans)
            bodies.append((head, start, r.pos, spans))
    return bodies


def _section(sid: int, payload: bytes) -> bytes:
    return bytes([sid]) + _leb_u(len(payload)) + payload


def _hook_body(count_global: int, pages_global: int) -> bytes:
    """(func (param $delta i32) (result i32) (local $prev i32) …): see the module docstring."""
    c, p = _leb_u(count_global), _leb_u(pages_global)
    code = b"".join(
        (
            b"\x20\x00\x40\x00\x22\x01",  # local.get 0; memory.grow 0; local.tee 1
            b"\x41\x7f\x46\x04\x40",  # i32.const -1; i32.eq; if
            b"\x23" + c + b"\x42\x01\x7c\x24" + c,  # refusals += 1
            b"\x3f\x00\xad\x20\x00\xad\x7c\x24" + p,  # pages = size + delta (u64)
            b"\x0b\x20\x01\x0b",  # end; local.get 1; end
        )
    )
    body = b"\x01\x01\x7f" + code  # one local: i32
    return _leb_u(len(body)) + body


def _export(name: str, index: int) -> bytes:
    raw = name.encode()
    return _leb_u(len(raw)) + raw + b"\x03" + _leb_u(index)


def declares_start(wasm: bytes) -> bool:
    """Whether the module has a start function (section 8); True when its sections cannot be
    walked, so a caller keeping start functions off a thread fails closed."""
    try:
        return any(sec.sid == _START for sec in _sections(wasm))
    except _Cannot:
        return True


def instrument(wasm: bytes) -> Instrumented | NotInstrumented:
    """The module with every `memory.grow` of memory 0 routed through the refusal hook."""
    try:
        return _instrument(bytes(wasm))
    except _Cannot as exc:
        return NotInstrumented(reason=exc.reason, detail=exc.detail)


def _instrument(wasm: bytes) -> Instrumented | NotInstrumented:
    sections = _sections(wasm)
    facts = _Facts()
    bodies: list[tuple[int, int, int, list[tuple[int, int]]]] = []
    by_id: dict[int, _Section] = {}
    for sec in sections:
        if sec.sid == 0:
            continue
        by_id[sec.sid] = sec
        r = _Reader(wasm, sec.start, sec.end)
        if sec.sid == _TYPE:
            _read_types(r, facts)
        elif sec.sid == _IMPORT:
            _read_imports(r, facts)
        elif sec.sid == _FUNCTION:
            facts.defined_funcs = r.count()
            for _ in range(facts.defined_funcs):
                r.u32()
        elif sec.sid == _MEMORY:
            _read_memories(r, facts)
        elif sec.sid == _GLOBAL:
            facts.globals = r.count(3)
            r.pos = r.end  # entries are copied as they are
        elif sec.sid == _EXPORT:
            _read_exports(r, facts)
        elif sec.sid == _CODE:
            if sec.end - sec.start > MAX_REWRITE_CODE_BYTES:
                raise _Cannot(Skip.TOO_LARGE, f"code section over {MAX_REWRITE_CODE_BYTES} B")
            bodies = _read_code(wasm, r, facts)
        else:
            r.pos = r.end
        if r.pos != r.end:
            raise _malformed(f"section {sec.sid} has bytes past its entries")
    if facts.bodies != facts.defined_funcs:
        raise _malformed("function and code section counts differ")
    grows = facts.grows
    if grows == 0:
        return NotInstrumented(reason=Skip.NO_MEMORY_GROW)
    if _TYPE not in by_id or facts.memories == 0:
        raise _malformed("memory.grow without a type section or a memory")

    hook = facts.imported_funcs + facts.defined_funcs
    count_global = facts.imported_globals + facts.globals
    call_hook = b"\x10" + _leb_u(hook)

    def rewrite(sec: _Section) -> bytes:
        payload = wasm[sec.start : sec.end]
        r = _Reader(wasm, sec.start, sec.end)
        if sec.sid == _TYPE:
            r.u32()
            tail = wasm[r.pos : sec.end]
            return _leb_u(facts.types + 1) + tail + b"\x60\x01\x7f\x01\x7f"
        if sec.sid == _FUNCTION:
            r.u32()
            return _leb_u(facts.defined_funcs + 1) + wasm[r.pos : sec.end] + _leb_u(facts.types)
        if sec.sid == _GLOBAL:
            r.u32()
            return _leb_u(facts.globals + 2) + wasm[r.pos : sec.end] + new_globals
        if sec.sid == _EXPORT:
            r.u32()
            return _leb_u(facts.exports + 2) + wasm[r.pos : sec.end] + new_exports
        if sec.sid == _CODE:
            out = [_leb_u(facts.bodies + 1)]
            copied = facts.first_body  # bodies without a grow are copied in runs
            for head, start, end, spans in bodies:
                out.append(wasm[copied:head])
                copied = end
                parts: list[bytes] = []
                cursor = start
                for g_start, g_end in spans:
                    parts += (wasm[cursor:g_start], call_hook)
                    cursor = g_end
                parts.append(wasm[cursor:end])
                body = b"".join(parts)
                out += (_leb_u(len(body)), body)
            out.append(wasm[copied : sec.end])
            out.append(_hook_body(count_global, count_global + 1))
            return b"".join(out)
        return payload

    new_globals = b"\x7e\x01\x42\x00\x0b" * 2  # (mut i64) (i64.const 0), twice
    new_exports = _export(REFUSALS_EXPORT, count_global) + _export(
        REFUSED_PAGES_EXPORT, count_global + 1
    )
    missing = {_GLOBAL: b"\x02" + new_globals, _EXPORT: b"\x02" + new_exports}
    out = [_MAGIC]
    for sec in sections:
        if sec.sid != 0:
            for sid in sorted((s for s in missing if s not in by_id), key=_RANK.__getitem__):
                if _RANK[sid] < _RANK[sec.sid]:
                    out.append(_section(sid, missing.pop(sid)))
        out.append(_section(sec.sid, rewrite(sec)) if sec.sid != 0 else _raw(wasm, sec))
    for sid in sorted((s for s in missing if s not in by_id), key=_RANK.__getitem__):
        out.append(_section(sid, missing[sid]))
    return Instrumented(wasm=b"".join(out), declared_max_pages=facts.memory0_max, grows=grows)


def _raw(wasm: bytes, sec: _Section) -> bytes:
    return _section(0, wasm[sec.start : sec.end])
