"""`GuestMemory`, from the guest's side: any (pointer, length) it passes is either wholly inside
its linear memory or refused; nothing raises and nothing outside is touched."""

from __future__ import annotations

import wasmtime
from hypothesis import given, settings
from hypothesis import strategies as st

from suaveplan_sandbox.wasm import _engine
from suaveplan_sandbox.wasm._memory import U32_MAX, GuestMemory

PAGE = 65536
_WAT = '(module (memory (export "memory") 1) (func (export "grow") (result i32) (memory.grow (i32.const 1))))'

# i32 arguments reach Python signed; guests can pass anything in that range, and u32 values.
_i32 = st.one_of(
    st.integers(-(2**31), 2**31 - 1),
    st.integers(0, U32_MAX),
    st.sampled_from([0, 1, PAGE - 4, PAGE - 1, PAGE, PAGE + 1, 2 * PAGE, U32_MAX]),
)


def _memory() -> tuple[wasmtime.Store, wasmtime.Memory]:
    store = wasmtime.Store(_engine.engine())
    store.set_epoch_deadline(1 << 62)
    instance = wasmtime.Instance(store, wasmtime.Module(_engine.engine(), _WAT), [])
    mem = instance.exports(store)["memory"]
    assert isinstance(mem, wasmtime.Memory)
    return store, mem


STORE, MEM = _memory()


def _inside(ptr: int, length: int) -> bool:
    return ptr >= 0 and length >= 0 and ptr + length <= PAGE


@settings(max_examples=300, deadline=None)
@given(ptr=_i32, length=_i32)
def test_read_is_refused_exactly_when_any_byte_lies_outside(ptr: int, length: int) -> None:
    view = GuestMemory(MEM, STORE)  # type: ignore[arg-type]  # a Store is Storelike too
    got = view.read(ptr, length)
    if _inside(ptr, length):
        assert got is not None and len(got) == length
    else:
        assert got is None


@settings(max_examples=300, deadline=None)
@given(ptr=_i32, data=st.binary(max_size=16))
def test_write_outside_writes_nothing_and_inside_writes_exactly_there(
    ptr: int, data: bytes
) -> None:
    MEM.write(STORE, b"\0" * PAGE, 0)
    view = GuestMemory(MEM, STORE)  # type: ignore[arg-type]
    wrote = view.write(ptr, data)
    after = bytes(MEM.read(STORE, 0, PAGE))
    if _inside(ptr, len(data)):
        assert wrote
        assert after[ptr : ptr + len(data)] == data
        assert after[:ptr].count(0) == ptr and after[ptr + len(data) :].count(0) == (
            PAGE - ptr - len(data)
        )
    else:
        assert not wrote
        assert after == b"\0" * PAGE


def test_the_view_is_of_the_size_at_entry() -> None:
    store, mem = _memory()
    view = GuestMemory(mem, store)  # type: ignore[arg-type]
    assert view.size == PAGE and view.read(PAGE, 1) is None
    assert mem.grow(store, 1) == 1
    # A new host call sees the grown memory; the old view still refuses what it never saw.
    assert GuestMemory(mem, store).read(PAGE, 1) == b"\0"  # type: ignore[arg-type]
    assert view.read(PAGE, 1) is None
