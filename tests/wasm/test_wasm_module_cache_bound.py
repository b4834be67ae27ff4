"""The host's compiled-module caches are bounded: a long-lived host that loads one module
after another (every upload a new version) keeps at most `MAX_MODULES` compiled modules and
`MAX_FILE_DIGESTS` file identities, the least recently used dropped first. A dropped module
is compiled again on its next load; a sandbox already running it keeps its own reference.
Counts, never time."""

from __future__ import annotations

import uuid
from collections import OrderedDict
from pathlib import Path

import pytest
import wasmtime

from suaveplan_sandbox.wasm import _engine

WAT = '(module (func (export "answer") (result i32) (i32.const {n})))'


def _module(n: int) -> bytes:
    # A fresh constant per test run, so that no earlier test's cache entry answers.
    return bytes(wasmtime.wat2wasm(WAT.format(n=n)))


@pytest.fixture
def small_caches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_engine, "MAX_MODULES", 3)
    monkeypatch.setattr(_engine, "MAX_FILE_DIGESTS", 3)
    # Empty caches of its own: what earlier tests left there is not this test's to count.
    monkeypatch.setattr(_engine, "_modules", OrderedDict())
    monkeypatch.setattr(_engine, "_shapes", {})
    monkeypatch.setattr(_engine, "_digests", OrderedDict())


@pytest.mark.usefixtures("small_caches")
def test_the_module_cache_keeps_the_most_recently_used_and_compiles_a_dropped_one_again() -> None:
    base = uuid.uuid4().int % 1_000_000_000
    modules = [_module(base + i) for i in range(5)]
    loaded = [_engine.load_module(wasm) for wasm in modules[:3]]
    assert len(_engine._modules) <= 3
    _engine.load_module(modules[0])  # a hit: now the most recently used
    before = _engine.compile_count()
    _engine.load_module(modules[3])  # drops modules[1], the least recently used
    _engine.load_module(modules[4])  # drops modules[2]
    assert _engine.compile_count() == before + 2
    assert len(_engine._modules) <= 3 and len(_engine._shapes) <= 3
    again = _engine.compile_count()
    assert _engine.load_module(modules[0]) is loaded[0]  # kept: no compile
    assert _engine.compile_count() == again
    _engine.load_module(modules[1])  # dropped: compiled again
    assert _engine.compile_count() == again + 1
    # A module dropped from the cache still runs where it is held.
    store = wasmtime.Store(_engine.engine())
    store.set_epoch_deadline(1_000_000)  # the engine interrupts on epochs
    instance = wasmtime.Instance(store, loaded[2], [])
    answer = instance.exports(store)["answer"]
    assert isinstance(answer, wasmtime.Func)
    assert answer(store) == base + 2


@pytest.mark.usefixtures("small_caches")
def test_file_identities_are_bounded_too(tmp_path: Path) -> None:
    base = uuid.uuid4().int % 1_000_000_000
    for i in range(6):
        path = tmp_path / f"m{i}.wasm"
        path.write_bytes(_module(base + i))
        _engine.load_module_file(path)
    assert len(_engine._digests) <= 3
