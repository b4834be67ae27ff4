"""The memory.grow rewrite (`wasm/_instrument.py`), from the attacker's side and against the
originals: hostile bytes never raise and never get a guessed rewrite, and a rewritten module
computes exactly what the original does (only the host's memoryMb verdict may differ)."""

from __future__ import annotations

import tempfile
import tracemalloc
from pathlib import Path
from typing import Final

import pytest
import wasmtime
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.wasm import _engine
from suaveplan_sandbox.wasm._instrument import (
    MAX_GROWS,
    REFUSALS_EXPORT,
    REFUSED_PAGES_EXPORT,
    Instrumented,
    NotInstrumented,
    Skip,
    instrument,
)

FIXTURES: Final = Path(__file__).parent / "fixtures"
PAGE: Final = 65536

GROW_WAT: Final = """
(module
  (memory (export "memory") 1 {max})
  (func (export "grow_by") (param $pages i32) (result i32)
    (local $n i32)
    (block $done
      (loop $again
        (br_if $done (i32.eq (memory.grow (local.get $pages)) (i32.const -1)))
        (local.set $n (i32.add (local.get $n) (i32.const 1)))
        (br $again)))
    (local.get $n))
  (func (export "grow") (param i32) (result i32) (memory.grow (local.get 0))))
"""

# Every instruction family the walker decodes, with `0x40 0x00` (the encoding of
# `memory.grow 0`) hidden in a data segment, an empty block type before `unreachable`,
# `i32.const -64` before `unreachable`, v128/f32/f64 constants and a fill value. Only the
# three real `memory.grow`s may be rewritten.
KITCHEN_SINK_WAT: Final = r"""
(module
  (type $pair (func (param i32) (result i32 i32)))
  (type $un (func (param i32) (result i32)))
  (memory (export "memory") 1)
  (table $t 2 funcref)
  (elem (i32.const 0) func $sq $inc)
  (global $g (mut i32) (i32.const 0))
  (data (i32.const 16) "\40\00\40\00hidden")
  (func $sq (param i32) (result i32) (i32.mul (local.get 0) (local.get 0)))
  (func $inc (param i32) (result i32) (i32.add (local.get 0) (i32.const 1)))
  (func $two (type $pair) (local.get 0) (i32.const -64))
  (func (export "mix") (param $n i32) (result i64)
    (local $acc i64) (local $v v128) (local $a i32) (local $b i32)
    (if (i32.eq (local.get $n) (i32.const 99999)) (then i32.const -64 unreachable))
    (if (i32.eqz (i32.const 1)) (then unreachable))
    (local.set $acc (i64.extend_i32_u (memory.grow (local.get $n))))
    (local.set $acc (i64.add (local.get $acc)
      (i64.extend_i32_u (i32.load8_u offset=16 (i32.const 0)))))
    (local.set $v (v128.const i8x16 0x40 0x00 0x40 0x00 1 2 3 4 5 6 7 8 9 10 11 12))
    (local.set $acc (i64.add (local.get $acc)
      (i64.extend_i32_s (i32x4.extract_lane 1 (local.get $v)))))
    (local.set $v (i8x16.shuffle 15 14 13 12 11 10 9 8 7 6 5 4 3 2 1 0
      (local.get $v) (local.get $v)))
    (v128.store offset=64 (i32.const 0) (local.get $v))
    (local.set $acc (i64.add (local.get $acc) (i64.load offset=64 (i32.const 0))))
    (memory.fill (i32.const 100) (i32.const 0x40) (i32.const 8))
    (memory.copy (i32.const 200) (i32.const 100) (i32.const 8))
    (local.set $acc (i64.xor (local.get $acc) (i64.load (i32.const 200))))
    (local.set $acc (i64.add (local.get $acc)
      (i64.extend_i32_s (i32.extend8_s (i32.const 0xC0)))))
    (local.set $acc (i64.add (local.get $acc)
      (i64.extend_i32_s (i32.trunc_sat_f32_s (f32.const 0x1p-143)))))
    (local.set $acc (i64.add (local.get $acc)
      (i64.reinterpret_f64 (f64.const 0x0.0000000000040p-1022))))
    (local.set $acc (i64.add (local.get $acc) (i64.extend_i32_u (ref.is_null (ref.null func)))))
    (local.set $acc (i64.add (local.get $acc) (i64.extend_i32_u (table.size $t))))
    (local.set $acc (i64.add (local.get $acc)
      (i64.extend_i32_u (call_indirect (type $un) (local.get $n)
        (i32.and (local.get $n) (i32.const 1))))))
    (block $out (result i32 i32) (call $two (local.get $n)))
    (local.set $b) (local.set $a)
    (local.set $acc (i64.add (local.get $acc)
      (i64.extend_i32_s (i32.add (local.get $a) (local.get $b)))))
    (block $z (block $y (block $x
      (br_table $x $y $z (i32.rem_u (local.get $n) (i32.const 3))))
      (global.set $g (i32.const 1)) (br $z))
      (global.set $g (i32.const 2)))
    (local.set $acc (i64.add (local.get $acc)
      (i64.extend_i32_u (select (result i32) (global.get $g) (i32.const 7) (local.get $n)))))
    (local.set $acc (i64.add (local.get $acc) (i64.extend_i32_u (memory.grow (i32.const 1)))))
    (i64.add (local.get $acc) (i64.extend_i32_u (memory.size))))
  (func (export "grow") (param i32) (result i32) (memory.grow (local.get 0))))
"""


def _wasm(text: str) -> bytes:
    return bytes(wasmtime.wat2wasm(text))


def _rewritten(wasm: bytes) -> Instrumented:
    out = instrument(wasm)
    assert isinstance(out, Instrumented), out
    return out


def _valid(wasm: bytes) -> bool:
    try:
        wasmtime.Module.validate(_engine.engine(), wasm)
    except wasmtime.WasmtimeError:
        return False
    return True


def _leb(value: int) -> bytes:
    out = bytearray()
    while True:
        b, value = value & 0x7F, value >> 7
        out.append(b | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _module(*sections: tuple[int, bytes]) -> bytes:
    return b"\0asm\x01\0\0\0" + b"".join(bytes([sid]) + _leb(len(p)) + p for sid, p in sections)


# A hand-assembled module: (memory 1) and one function `(drop (memory.grow (i32.const 1)))`.
_TYPES: Final = (1, b"\x01\x60\x00\x00")
_FUNCS: Final = (3, b"\x01\x00")
_MEMORY: Final = (5, b"\x01\x00\x01")


def _code(body: bytes) -> tuple[int, bytes]:
    return (10, b"\x01" + _leb(len(body)) + body)


_GROW_BODY: Final = b"\x00\x41\x01\x40\x00\x1a\x0b"  # no locals; i32.const 1; grow; drop; end


def test_the_hand_assembled_module_is_valid_and_instrumented() -> None:
    wasm = _module(_TYPES, _FUNCS, _MEMORY, _code(_GROW_BODY))
    assert _valid(wasm)
    out = _rewritten(wasm)
    assert out.grows == 1 and out.declared_max_pages is None
    assert _valid(out.wasm)


# -- hostile bytes ---------------------------------------------------------------------------


def test_every_truncation_of_a_module_is_left_alone_or_rewritten_validly() -> None:
    wasm = _wasm(KITCHEN_SINK_WAT)
    for cut in range(len(wasm)):
        out = instrument(wasm[:cut])
        if isinstance(out, Instrumented):  # a cut at a section boundary can be a module
            assert _valid(out.wasm) == _valid(wasm[:cut])
        else:
            assert out.reason in {Skip.MALFORMED, Skip.NO_MEMORY_GROW, Skip.UNSUPPORTED}


@pytest.mark.parametrize(
    ("wasm", "reason"),
    [
        pytest.param(b"", Skip.MALFORMED, id="empty"),
        pytest.param(b"\0asm", Skip.MALFORMED, id="magic-only"),
        pytest.param(b"\0asm\x0d\0\x01\0", Skip.UNSUPPORTED, id="component"),
        pytest.param(b"\x7fELF\x01\0\0\0", Skip.MALFORMED, id="not-wasm"),
        # A section whose size runs past the end of the file.
        pytest.param(b"\0asm\x01\0\0\0\x01\xff\xff\xff\xff\x0f\x00", Skip.MALFORMED, id="size"),
        # A section size in six LEB128 bytes (u32 allows five).
        pytest.param(
            b"\0asm\x01\0\0\0\x00\x80\x80\x80\x80\x80\x00", Skip.MALFORMED, id="leb-too-long"
        ),
        # Five bytes whose value does not fit 32 bits.
        pytest.param(b"\0asm\x01\0\0\0\x00\xff\xff\xff\xff\x7f", Skip.MALFORMED, id="leb-range"),
        # A code section claiming 2^32-1 bodies in four bytes.
        pytest.param(
            _module(_TYPES, _FUNCS, _MEMORY, (10, b"\xff\xff\xff\xff\x0f")),
            Skip.MALFORMED,
            id="huge-count",
        ),
        # A body that claims more bytes than its section holds.
        pytest.param(
            _module(_TYPES, _FUNCS, _MEMORY, (10, b"\x01\x7f" + _GROW_BODY)),
            Skip.MALFORMED,
            id="body-size",
        ),
        # A body with 2^32-1 local groups.
        pytest.param(
            _module(_TYPES, _FUNCS, _MEMORY, _code(b"\xff\xff\xff\xff\x0f\x0b")),
            Skip.MALFORMED,
            id="locals-count",
        ),
        # i32.const with a six-byte immediate.
        pytest.param(
            _module(_TYPES, _FUNCS, _MEMORY, _code(b"\x00\x41\x80\x80\x80\x80\x80\x00\x1a\x0b")),
            Skip.MALFORMED,
            id="immediate-leb",
        ),
        # A body that stops in the middle of `memory.grow`'s immediate.
        pytest.param(
            _module(_TYPES, _FUNCS, _MEMORY, _code(b"\x00\x41\x01\x40")),
            Skip.MALFORMED,
            id="cut-immediate",
        ),
        # A body whose instructions do not end with `end`.
        pytest.param(
            _module(_TYPES, _FUNCS, _MEMORY, _code(b"\x00\x41\x01\x40\x00\x1a")),
            Skip.MALFORMED,
            id="no-end",
        ),
        # Function and code sections of different lengths.
        pytest.param(
            _module(_TYPES, (3, b"\x02\x00\x00"), _MEMORY, _code(_GROW_BODY)),
            Skip.MALFORMED,
            id="count-mismatch",
        ),
        # Sections out of order (memory after code).
        pytest.param(
            _module(_TYPES, _FUNCS, _code(_GROW_BODY), _MEMORY), Skip.MALFORMED, id="order"
        ),
        # A section id the format does not define.
        pytest.param(_module(_TYPES, (42, b"")), Skip.UNSUPPORTED, id="section-id"),
        # An opcode byte no proposal we decode assigns (0xfe, atomics).
        pytest.param(
            _module(_TYPES, _FUNCS, _MEMORY, _code(b"\x00\xfe\x03\x00\x40\x00\x1a\x0b")),
            Skip.UNSUPPORTED,
            id="opcode",
        ),
        # memory.grow of memory 1 (multi-memory): only memory 0 is instrumented.
        pytest.param(
            _module(_TYPES, _FUNCS, _MEMORY, _code(b"\x00\x41\x01\x40\x01\x1a\x0b")),
            Skip.UNSUPPORTED,
            id="memory-1",
        ),
        # A 64-bit memory.
        pytest.param(
            _module(_TYPES, _FUNCS, (5, b"\x01\x04\x01"), _code(_GROW_BODY)),
            Skip.UNSUPPORTED,
            id="memory64",
        ),
        # A shared memory (threads): another thread could grow it between the hook's grow
        # and its memory.size, and wasmtime grows shared memories outside the limiter.
        pytest.param(
            _module(_TYPES, _FUNCS, (5, b"\x01\x03\x01\x10"), _code(_GROW_BODY)),
            Skip.UNSUPPORTED,
            id="shared-memory",
        ),
        # A shared memory that is not memory 0 is refused just the same.
        pytest.param(
            _module(_TYPES, _FUNCS, (5, b"\x02\x00\x01\x03\x01\x10"), _code(_GROW_BODY)),
            Skip.UNSUPPORTED,
            id="shared-memory-1",
        ),
        # A GC rec group in the type section (type indices would not be entry indices).
        pytest.param(
            _module((1, b"\x01\x4e\x01\x60\x00\x00"), _FUNCS, _MEMORY, _code(_GROW_BODY)),
            Skip.UNSUPPORTED,
            id="rec-group",
        ),
        # No memory.grow at all: nothing to rewrite.
        pytest.param(
            _module(_TYPES, _FUNCS, _MEMORY, _code(b"\x00\x0b")), Skip.NO_MEMORY_GROW, id="none"
        ),
    ],
)
def test_hostile_or_unknown_bytes_are_left_alone_with_a_reason(wasm: bytes, reason: Skip) -> None:
    out = instrument(wasm)
    assert isinstance(out, NotInstrumented)
    assert out.reason is reason, out


def test_a_module_already_exporting_a_reserved_name_is_left_alone() -> None:
    for name in (REFUSALS_EXPORT, REFUSED_PAGES_EXPORT):
        text = f'(module (memory 1) (global (export "{name}") (mut i64) (i64.const 0))'
        text += ' (func (export "g") (result i32) (memory.grow (i32.const 1))))'
        out = instrument(_wasm(text))
        assert isinstance(out, NotInstrumented) and out.reason is Skip.RESERVED_EXPORT


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    base=st.sampled_from(["kitchen", "grow", "fsprobe"]),
)
def test_mutated_modules_never_raise_and_a_rewrite_is_valid_when_its_source_is(
    data: st.DataObject, base: str
) -> None:
    wasm = bytearray(_BASES[base])
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(wasm) - 1))
        how = data.draw(st.sampled_from(["flip", "insert", "delete"]))
        if how == "flip":
            wasm[at] = data.draw(st.integers(0, 255))
        elif how == "insert":
            wasm[at:at] = data.draw(st.binary(min_size=1, max_size=6))
        else:
            del wasm[at : at + data.draw(st.integers(1, 8))]
    out = instrument(bytes(wasm))  # never raises, whatever the bytes
    if isinstance(out, Instrumented) and _valid(bytes(wasm)):
        assert _valid(out.wasm)


_BASES: Final = {
    "kitchen": _wasm(KITCHEN_SINK_WAT),
    "grow": _wasm(GROW_WAT.format(max="")),
    "fsprobe": (FIXTURES / "fsprobe.wasm").read_bytes(),
}


def test_memory_grow_patterns_inside_immediates_and_data_are_not_rewritten() -> None:
    wasm = _wasm(KITCHEN_SINK_WAT)
    assert wasm.count(b"\x40\x00") > 3  # the hidden patterns are really there
    out = _rewritten(wasm)
    assert out.grows == 3
    assert b"\x40\x00\x40\x00hidden" in out.wasm  # the data segment is untouched
    assert _valid(out.wasm)


def _grows_module(per_body: list[int]) -> bytes:
    """One function per entry, each with that many `(drop (memory.grow (i32.const 0)))`."""
    bodies = [b"\x00" + b"\x41\x00\x40\x00\x1a" * n + b"\x0b" for n in per_body]
    funcs = (3, _leb(len(bodies)) + b"\x00" * len(bodies))
    code = (10, _leb(len(bodies)) + b"".join(_leb(len(b)) + b for b in bodies))
    return _module(_TYPES, funcs, _MEMORY, code)


def test_a_module_with_more_than_max_grows_is_left_alone() -> None:
    wasm = _grows_module([MAX_GROWS // 2, 0, MAX_GROWS // 2 + 1])
    assert _valid(wasm)
    out = instrument(wasm)
    assert isinstance(out, NotInstrumented) and out.reason is Skip.UNSUPPORTED


def test_up_to_max_grows_are_rewritten_around_bodies_without_one() -> None:
    per_body = [0, 3, 0, 0, MAX_GROWS - 4, 1, 0]
    out = _rewritten(_grows_module(per_body))
    assert out.grows == MAX_GROWS
    assert _valid(out.wasm)
    # Every body without a grow is there byte for byte: size 2, no locals, `end`.
    assert out.wasm.count(b"\x02\x00\x0b") >= per_body.count(0)


@pytest.mark.parametrize(
    "per_body",
    [
        pytest.param([200_000], id="1-MB-of-memory-grow"),
        pytest.param([0] * 300_000 + [1], id="300k-bodies-without-one"),
    ],
)
def test_walking_a_hostile_module_costs_host_memory_bounded_by_its_size(
    per_body: list[int],
) -> None:
    wasm = _grows_module(per_body)
    tracemalloc.start()
    try:
        instrument(wasm)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Remembering every grow, or every body, cost 50-70 times the module's size.
    assert peak < 4 * len(wasm), peak


def test_a_module_without_memory_grow_is_not_rewritten() -> None:
    out = instrument((FIXTURES / "spin.wasm").read_bytes())
    assert isinstance(out, NotInstrumented) and out.reason is Skip.NO_MEMORY_GROW


def test_sections_the_rewrite_needs_are_added_in_format_order_when_missing() -> None:
    # No global and no export section: both are created, before the code section.
    wasm = _module(_TYPES, _FUNCS, _MEMORY, _code(_GROW_BODY))
    out = _rewritten(wasm)
    module = wasmtime.Module(_engine.engine(), out.wasm)
    assert sorted(e.name for e in module.exports) == sorted([REFUSALS_EXPORT, REFUSED_PAGES_EXPORT])


def test_the_declared_maximum_of_memory_zero_is_reported() -> None:
    assert _rewritten(_wasm(GROW_WAT.format(max="8"))).declared_max_pages == 8
    assert _rewritten(_wasm(GROW_WAT.format(max=""))).declared_max_pages is None


# -- the rewrite computes what the original computes -----------------------------------------

_compiled: dict[tuple[str, bool], wasmtime.Module] = {}


def _compiled_module(name: str, wasm: bytes, rewritten: bool) -> wasmtime.Module:
    key = (name, rewritten)
    if key not in _compiled:
        source = _rewritten(wasm).wasm if rewritten else wasm
        _compiled[key] = wasmtime.Module(_engine.engine(), source)
    return _compiled[key]


def _store(limit_mb: int | None) -> wasmtime.Store:
    store = wasmtime.Store(_engine.engine())
    store.set_epoch_deadline(1 << 62)
    if limit_mb is not None:
        store.set_limits(memory_size=limit_mb * 1024 * 1024)
    return store


Outcome = tuple[object, ...]


def _call_both(
    name: str, wasm: bytes, limit_mb: int | None, calls: list[tuple[str, int]]
) -> tuple[list[Outcome], list[Outcome], int]:
    """Outcomes of the same calls on the original and the rewrite; refusals the hook saw."""
    results: list[list[Outcome]] = []
    refused = 0
    for rewritten in (False, True):
        store = _store(limit_mb)
        instance = wasmtime.Instance(store, _compiled_module(name, wasm, rewritten), [])
        exports = instance.exports(store)
        memory = exports["memory"]
        assert isinstance(memory, wasmtime.Memory)
        seen: list[Outcome] = []
        for export, arg in calls:
            func = exports[export]
            assert isinstance(func, wasmtime.Func)
            try:
                seen.append(("value", func(store, arg), memory.data_len(store)))
            except wasmtime.Trap as trap:
                seen.append(("trap", trap.trap_code, memory.data_len(store)))
        if rewritten:
            counter = exports[REFUSALS_EXPORT]
            assert isinstance(counter, wasmtime.Global)
            refused = counter.value(store)
        results.append(seen)
    return results[0], results[1], refused


_pages = st.one_of(st.integers(0, 40), st.sampled_from([64, 100, 65535, 65536, 2**31, 2**32 - 1]))


@settings(max_examples=60, deadline=None)
@given(
    limit_mb=st.integers(1, 6),
    maximum=st.sampled_from(["", "8", "70"]),
    calls=st.lists(st.tuples(st.sampled_from(["grow", "grow_by"]), _pages), max_size=4),
)
def test_a_rewritten_grow_module_behaves_like_the_original(
    limit_mb: int, maximum: str, calls: list[tuple[str, int]]
) -> None:
    # grow_by with 0 pages never ends; keep it to growth that is eventually refused.
    calls = [(e, p if e == "grow" or p else 1) for e, p in calls]
    wasm = _wasm(GROW_WAT.format(max=maximum))
    original, rewritten, refused = _call_both(f"grow{maximum}", wasm, limit_mb, calls)
    assert rewritten == original
    # The hook counted exactly the refusals the guest saw: each grow_by ends on one, and a
    # plain grow returns -1 for one.
    seen = sum(1 for (e, _), r in zip(calls, original, strict=True) if e == "grow_by" or r[1] == -1)
    assert refused == seen


@settings(max_examples=60, deadline=None)
@given(
    limit_mb=st.one_of(st.none(), st.integers(1, 4)),
    args=st.lists(st.one_of(st.integers(0, 70), st.just(2**32 - 1)), min_size=1, max_size=4),
)
def test_the_rewritten_kitchen_sink_computes_what_the_original_computes(
    limit_mb: int | None, args: list[int]
) -> None:
    wasm = _BASES["kitchen"]
    calls = [("mix", a) for a in args]
    original, rewritten, _ = _call_both("kitchen", wasm, limit_mb, calls)
    assert rewritten == original


def _bare_run(
    wasm_name: str,
    wasm: bytes,
    *,
    rewritten: bool,
    argv: list[str],
    stdin: bytes = b"",
    limit_mb: int,
) -> Outcome:
    """A WASI command run under bare wasmtime: exit code, stdout, stderr, memory size."""
    module = _compiled_module(wasm_name, wasm, rewritten)
    linker = wasmtime.Linker(_engine.engine())
    linker.define_wasi()
    store = _store(limit_mb)
    out, err = bytearray(), bytearray()
    with tempfile.NamedTemporaryFile() as fh:
        fh.write(stdin)
        fh.flush()
        wasi = wasmtime.WasiConfig()
        wasi.argv = argv
        wasi.stdin_file = fh.name
        wasi.stdout_custom = out.extend
        wasi.stderr_custom = err.extend
        wasi.preopen_dir(str(_ROOT), "/", False)
        store.set_wasi(wasi)
        instance = linker.instantiate(store, module)
        exports = instance.exports(store)
        start, memory = exports["_start"], exports["memory"]
        assert isinstance(start, wasmtime.Func) and isinstance(memory, wasmtime.Memory)
        try:
            start(store)
            code: object = 0
        except wasmtime.ExitTrap as exc:
            code = exc.code
        except wasmtime.Trap as trap:
            code = trap.trap_code
        return code, bytes(out), bytes(err), memory.data_len(store)


_ROOT: Final = Path(tempfile.mkdtemp(prefix="suaveplan-instrument-"))
(_ROOT / "a.txt").write_text("hello")


@settings(max_examples=40, deadline=None)
@given(
    argv=st.one_of(
        st.tuples(
            st.sampled_from(["read", "write", "echo", "readdir", "nope"]),
            st.sampled_from(["/a.txt", "/missing", "/", "../x", "a.txt"]),
        ).map(list),
        st.just([]),
    ),
    stdin=st.binary(max_size=300),
)
def test_the_rewritten_fsprobe_fixture_runs_like_the_original(
    argv: list[str], stdin: bytes
) -> None:
    wasm = _BASES["fsprobe"]
    full = ["fsprobe", *argv]
    # fsprobe starts with 257 pages (16 MiB + 64 KiB of wasi-libc stack and heap).
    runs = [
        _bare_run("fsprobe", wasm, rewritten=r, argv=full, stdin=stdin, limit_mb=32)
        for r in (False, True)
    ]
    assert runs[1] == runs[0]


@pytest.mark.parametrize("limit_mb", [17, 18, 24, 33])
def test_the_rewritten_membomb_fixture_runs_like_the_original(limit_mb: int) -> None:
    wasm = (FIXTURES / "membomb.wasm").read_bytes()
    original = _bare_run("membomb", wasm, rewritten=False, argv=["membomb"], limit_mb=limit_mb)
    assert original[0] == 3  # malloc failed: the guest saw the refusal
    rewritten = _bare_run("membomb", wasm, rewritten=True, argv=["membomb"], limit_mb=limit_mb)
    assert rewritten == original


def test_the_hook_records_each_refusal_and_the_size_asked_for() -> None:
    wasm = _wasm(GROW_WAT.format(max=""))
    store = _store(2)  # 32 pages
    instance = wasmtime.Instance(
        store, wasmtime.Module(_engine.engine(), _rewritten(wasm).wasm), []
    )
    exports = instance.exports(store)
    grow, refusals, pages = exports["grow"], exports[REFUSALS_EXPORT], exports[REFUSED_PAGES_EXPORT]
    assert isinstance(grow, wasmtime.Func)
    assert isinstance(refusals, wasmtime.Global) and isinstance(pages, wasmtime.Global)
    assert grow(store, 3) == 1 and refusals.value(store) == 0
    assert grow(store, 100) == -1
    assert (refusals.value(store), pages.value(store)) == (1, 104)
    assert grow(store, 2**32 - 1) == -1  # the delta is unsigned: 4 + 2^32 - 1 pages
    assert (refusals.value(store), pages.value(store)) == (2, 4 + 2**32 - 1)


# Guests that name the items the rewrite appends, to forge or hide the refusal record: each
# names an index only the rewrite would make valid. Indices: one imported global (0) and one
# defined (1), so the counters would be 2 and 3; one imported function (0) and `g` (1), so
# the hook would be function 2.
_FORGERY_HEAD: Final = """(module
  (import "h" "f" (func (param i32) (result i32)))
  (import "h" "gl" (global i32))
  (global (mut i32) (i32.const 0))
  (memory 1)
  (table 1 funcref)
  (func (export "g") (result i32)
"""


@pytest.mark.parametrize(
    ("body", "rewrite_valid"),
    [
        pytest.param("(global.set 2 (i64.const 0))", True, id="zero-the-refusal-counter"),
        pytest.param("(global.set 3 (i64.const 1))", True, id="write-the-requested-pages"),
        pytest.param("(drop (global.get 2))", True, id="read-the-refusal-counter"),
        pytest.param("(drop (call 2 (i32.const 1)))", True, id="call-the-hook"),
        # ref.func also needs the function declared in an element segment, which ours is not.
        pytest.param("(table.set (i32.const 0) (ref.func 2))", False, id="ref-func-the-hook"),
    ],
)
def test_a_guest_naming_the_appended_items_is_refused_not_rewritten_into_validity(
    body: str, rewrite_valid: bool
) -> None:
    text = _FORGERY_HEAD + f"    {body}\n    (memory.grow (i32.const 1))))"
    wasm = _wasm(text)
    assert not _valid(wasm)
    assert _valid(_rewritten(wasm).wasm) is rewrite_valid  # what validating first prevents
    with pytest.raises(SuaveplanError) as info:
        _engine.load_module(wasm)
    assert info.value.code == "SAND_WASM_INSTANTIATION_FAILED"
    assert isinstance(info.value.__cause__, wasmtime.WasmtimeError)  # wasmtime's own reason


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param('(export "x" (global 2))', id="export-the-counter"),
        pytest.param("(elem (i32.const 0) func 2)", id="element-names-the-hook"),
        pytest.param("(start 2)", id="start-is-the-hook"),
    ],
)
def test_sections_naming_the_appended_items_are_refused_too(extra: str) -> None:
    text = _FORGERY_HEAD + f"    (memory.grow (i32.const 1)))\n  {extra})"
    wasm = _wasm(text)
    assert not _valid(wasm)
    with pytest.raises(SuaveplanError) as info:
        _engine.load_module(wasm)
    assert info.value.code == "SAND_WASM_INSTANTIATION_FAILED"
    assert isinstance(info.value.__cause__, wasmtime.WasmtimeError)


def test_an_invalid_module_is_not_made_valid_by_the_rewrite() -> None:
    # `global.set 0` names a global the module does not have, but the rewrite appends one.
    text = '(module (memory 1) (func (export "g") (global.set 0 (i64.const 5))'
    text += " (drop (memory.grow (i32.const 1)))))"
    wasm = _wasm(text)
    assert not _valid(wasm) and _valid(_rewritten(wasm).wasm)
    with pytest.raises(SuaveplanError) as info:
        _engine.load_module(wasm)
    assert info.value.code == "SAND_WASM_INSTANTIATION_FAILED"
    assert isinstance(info.value.__cause__, wasmtime.WasmtimeError)


# Every index space the rewrite touches, with items before ours in each: imported functions
# and globals, a start function that grows, a passive data segment (data count section +
# memory.init), a declared `ref.func` called through a table, a name section naming them.
INDEX_SPACES_WAT: Final = r"""
(module $spaces
  (import "h" "add" (func $add (param i32 i32) (result i32)))
  (import "h" "base" (global $base i32))
  (global $started (mut i32) (i32.const 0))
  (global $k i64 (i64.const 42))
  (memory (export "memory") 1)
  (table $t 2 funcref)
  (elem declare func $twice)
  (data $msg "\40\00grown")
  (func $twice (param i32) (result i32) (i32.mul (local.get 0) (i32.const 2)))
  (func $init
    (global.set $started (memory.grow (i32.const 1)))
    (memory.init $msg (i32.const 100) (i32.const 0) (i32.const 7)))
  (start $init)
  (func (export "run") (param $n i32) (result i64)
    (table.set $t (i32.const 1) (ref.func $twice))
    (i64.add
      (i64.add (global.get $k) (i64.extend_i32_u (global.get $started)))
      (i64.add
        (i64.extend_i32_u (call $add (global.get $base)
          (call_indirect $t (param i32) (result i32) (local.get $n) (i32.const 1))))
        (i64.add (i64.load8_u offset=102 (i32.const 0))
          (i64.extend_i32_s (memory.grow (local.get $n)))))))
  (func (export "size") (result i32) (memory.size)))
"""


def test_items_before_ours_in_every_index_space_keep_their_indices() -> None:
    wasm = _wasm(INDEX_SPACES_WAT)
    out = _rewritten(wasm)
    assert out.grows == 2
    eng = _engine.engine()

    def run(source: bytes, limit_mb: int) -> tuple[list[Outcome], int | None]:
        store = _store(limit_mb)
        module = wasmtime.Module(eng, source)
        add = wasmtime.Func(
            store,
            wasmtime.FuncType([wasmtime.ValType.i32()] * 2, [wasmtime.ValType.i32()]),
            lambda a, b: a + b,
        )
        base = wasmtime.Global(
            store, wasmtime.GlobalType(wasmtime.ValType.i32(), False), wasmtime.Val.i32(1000)
        )
        instance = wasmtime.Instance(store, module, [add, base])
        exports = instance.exports(store)
        seen: list[Outcome] = []
        for n in (3, 40, 1):
            run_ = exports["run"]
            size = exports["size"]
            assert isinstance(run_, wasmtime.Func) and isinstance(size, wasmtime.Func)
            seen.append((run_(store, n), size(store)))
        counter = exports.get(REFUSALS_EXPORT) if source is not wasm else None
        return seen, counter.value(store) if isinstance(counter, wasmtime.Global) else None

    original, _ = run(wasm, limit_mb=2)
    rewritten, refused = run(out.wasm, limit_mb=2)
    assert rewritten == original
    # run(3): 42 + 1 (start grew from 1 page) + 1000 + 6 + 'g' (0x67) + 2 (size before)
    assert original[0] == (42 + 1 + 1000 + 6 + 0x67 + 2, 5)
    assert original[1][0] == 42 + 1 + 1000 + 80 + 0x67 - 1  # 40 more pages: refused
    assert refused == 1


def test_a_rewrite_wasmtime_refuses_falls_back_to_the_original_judged_by_inference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A walker bug (never the guest's doing): the rewritten bytes do not compile.
    # A trailing custom section makes bytes no other test has put in the module cache.
    name = b"suaveplan-test-rejected-rewrite"
    wasm = _wasm(GROW_WAT.format(max="")) + b"\x00" + _leb(len(name) + 1) + _leb(len(name)) + name
    broken = Instrumented(wasm=b"\0asm\x01\0\0\0\x01\x01", declared_max_pages=None, grows=2)
    monkeypatch.setattr(_engine, "instrument", lambda _: broken)
    module = _engine.load_module(wasm)
    outcome = _engine.grow_instrumentation(module)
    assert isinstance(outcome, NotInstrumented) and outcome.reason is Skip.REJECTED
    assert REFUSALS_EXPORT not in {e.name for e in module.exports}  # the original runs
    store = _store(None)
    grow = wasmtime.Instance(store, module, []).exports(store)["grow"]
    assert isinstance(grow, wasmtime.Func) and grow(store, 1) == 1
