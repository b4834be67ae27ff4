"""A module refused once is refused again from memory, never by asking the compile child again.

Refusals are cached by the sha256 of the module's bytes, in a bounded LRU, and only for as
much as the refusal depends on: invalid bytes on nothing, a header bound on the create's
bounds, a compile failure on the create's memory and CPU limits (and the module's shape is
still judged by the asking create's bounds first, as for a cached success). A child that
died (out of memory or CPU, killed) is not cached: that can be the machine's doing, not the
module's. Counts, never time: compile-child requests, validations and header walks.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import wasmtime

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.wasm import CompileLimits, _engine, create_wasm_sandbox
from suaveplan_sandbox.wasm import _compile_bounds as bounds
from suaveplan_sandbox.wasm._compile_child import CompileServer
from suaveplan_sandbox.wasm._engine_config import SETTINGS_TAG
from wasm._module_bytes import STAND_IN_CHILD_PRELUDE, answer

MIB = 1024 * 1024

# A stand-in child answering every request with FAILED ("oops"): valid bytes wasmtime would
# not compile, as wasmtime's own limits might refuse them.
_FAILS_EVERY_COMPILE = (
    STAND_IN_CHILD_PRELUDE
    + r"""
while True:
    kind, length = struct.unpack(">BI", exact(5))
    exact(length)
    REPLY
"""
)
_FAILED = 'sock.sendall(struct.pack(">BI", ord("F"), 4) + b"oops")'
_DIES = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"


def _server(reply: str) -> CompileServer:
    ready = json.dumps({"settings": SETTINGS_TAG, "wasmtime": wasmtime.__file__}).encode()
    source = _FAILS_EVERY_COMPILE.replace("READY_PAYLOAD", repr(ready)).replace("REPLY", reply)
    return CompileServer(bootstrap=source)


@pytest.fixture
def failing_child(monkeypatch: pytest.MonkeyPatch) -> Iterator[CompileServer]:
    server = _server(_FAILED)
    monkeypatch.setattr(_engine, "compile_server", lambda: server)
    yield server
    server.close()


def _refusal(wasm: bytes, limits: CompileLimits = bounds.DEFAULT_COMPILE_LIMITS) -> SuaveplanError:
    with pytest.raises(SuaveplanError) as info:
        _engine.load_module(wasm, limits=limits)
    return info.value


def _same(a: SuaveplanError, b: SuaveplanError) -> bool:
    same_cause = type(a.__cause__) is type(b.__cause__) and str(a.__cause__) == str(b.__cause__)
    return (a.code, a.message, a.details) == (b.code, b.message, b.details) and same_cause


class _Counting:
    """Counts calls to a module-level function while passing them through."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, owner: object, name: str) -> None:
        self.calls = 0
        real = getattr(owner, name)

        def counted(*args: object, **kwargs: object) -> object:
            self.calls += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, counted)


def test_a_compile_failure_is_answered_again_without_asking_the_child(
    failing_child: CompileServer,
) -> None:
    wasm = answer(1)
    first = _refusal(wasm)
    assert first.details == {"stage": "compile", "reason": "compile-failed"}
    assert failing_child.requests == 1
    again = _refusal(wasm)
    assert _same(again, first)
    assert again is not first  # a fresh error each time: nothing shares a traceback
    assert isinstance(again.__cause__, wasmtime.WasmtimeError)
    assert str(again.__cause__) == "oops"
    assert failing_child.requests == 1


def test_a_cached_compile_failure_holds_only_for_the_limits_it_was_refused_under(
    failing_child: CompileServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    wasm = answer(2)
    _refusal(wasm)
    assert failing_child.requests == 1
    # More memory or CPU might compile it: the child is asked again.
    more = CompileLimits(memory_bytes=bounds.DEFAULT_COMPILE_MEMORY_BYTES + MIB)
    assert _refusal(wasm, more).details["reason"] == "compile-failed"
    assert failing_child.requests == 2
    # A hit (the same memory and CPU, no new walk of the headers) is still judged by the
    # asking create's bounds first, as a cached success is.
    walks = _Counting(monkeypatch, _engine, "check_compile_bounds")
    tight = dataclasses.replace(more, max_functions=0)
    assert _refusal(wasm, tight).details == {
        "stage": "bounds",
        "reason": "too-many-functions",
        "limit": 0,
    }
    assert _refusal(wasm, more).details["reason"] == "compile-failed"
    assert (failing_child.requests, walks.calls) == (2, 0)


def test_a_child_that_died_compiling_is_asked_again_next_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = _server(_DIES)
    monkeypatch.setattr(_engine, "compile_server", lambda: server)
    try:
        wasm = answer(3)
        for _ in range(2):
            assert _refusal(wasm).details == {
                "stage": "compile",
                "reason": "compile-resources",
                "signal": "SIGKILL",
            }
        assert (server.requests, server.starts) == (2, 2)
    finally:
        server.close()


async def test_invalid_bytes_are_refused_again_without_validating_them_again(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing_child: CompileServer
) -> None:
    path = tmp_path / "bad-magic.wasm"
    path.write_bytes(b"\0wasm\x01\0\0" + uuid.uuid4().bytes)
    policy = PermissionPolicy.from_manifest({"name": "guest", "permissions": {}}, root=root)
    validations = _Counting(monkeypatch, wasmtime.Module, "validate")
    errors = []
    for _ in range(3):
        with pytest.raises(SuaveplanError) as info:
            await create_wasm_sandbox(wasm_module_path=path, policy=policy)
        errors.append(info.value)
    assert errors[0].code == "SAND_WASM_INSTANTIATION_FAILED"
    assert errors[0].details == {"stage": "instantiate"}
    assert isinstance(errors[0].__cause__, wasmtime.WasmtimeError)  # wasmtime's reason
    assert all(_same(e, errors[0]) for e in errors)
    assert validations.calls == 1
    assert failing_child.requests == 0
    # Whatever the limits: invalid bytes are invalid under any of them.
    assert _same(_refusal(path.read_bytes(), CompileLimits(max_functions=0)), errors[0])
    assert validations.calls == 1


def test_a_bounds_refusal_is_reused_under_the_same_bounds_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    wasm = answer(4)
    low = CompileLimits(max_functions=0)
    walks = _Counting(monkeypatch, _engine, "check_compile_bounds")
    first = _refusal(wasm, low)
    assert first.details == {"stage": "bounds", "reason": "too-many-functions", "limit": 0}
    # The same bounds (other resource limits: the bounds do not depend on them).
    assert _same(_refusal(wasm, dataclasses.replace(low, cpu_seconds=5)), first)
    assert walks.calls == 1
    # Other bounds: judged afresh, and admitted.
    before = _engine.compile_count()
    module = _engine.load_module(wasm)
    assert _engine.compile_count() == before + 1
    assert walks.calls == 2
    # Now the module is cached: its shape answers every create, the refusal is gone.
    assert _engine.load_module(wasm) is module
    assert _same(_refusal(wasm, low), first)
    assert walks.calls == 2


def test_the_refusal_cache_is_bounded_and_forgets_the_least_recently_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_engine, "MAX_REFUSALS", 2)
    validations = _Counting(monkeypatch, wasmtime.Module, "validate")
    a, b, c = (b"\0wasm\x01\0\0" + uuid.uuid4().bytes for _ in range(3))
    _refusal(a)
    _refusal(b)
    _refusal(a)  # a is now the most recently used
    assert validations.calls == 2
    _refusal(c)  # evicts b
    assert validations.calls == 3
    _refusal(a)
    assert validations.calls == 3
    _refusal(b)
    assert validations.calls == 4
    assert len(_engine._refusals) <= 2
