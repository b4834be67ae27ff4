"""New modules are compiled in a resource-limited child process, never in the host.

A compile past the child's memory or CPU limit, or a child killed mid-compile, is
`SAND_WASM_INSTANTIATION_FAILED` with `details.stage="compile"`; the host goes on and the
next compile gets a fresh child. Replies are checked before they are trusted; the header
bounds are a create option that the module cache never widens; a cache hit never touches the
child. No wall-clock time is asserted: each hostile module is sized so that it fails under
the small limit it is given and compiles under the defaults.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import wasmtime

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.wasm import CompileLimits, _engine, create_wasm_sandbox
from suaveplan_sandbox.wasm import _compile_bounds as bounds
from suaveplan_sandbox.wasm._compile_child import (
    REAP_CHECK_S,
    REAP_CHECKS,
    CompileServer,
    _reap,
    compile_server,
)
from suaveplan_sandbox.wasm._compile_child_main import EXIT_OUT_OF_MEMORY
from suaveplan_sandbox.wasm._compile_wire import (
    COMPILE,
    COMPILED,
    HEADER,
    MAX_TEXT_BYTES,
    READY,
    REFUSED,
    REPLIES,
    Compiled,
    MalformedFrame,
    Refused,
    encode_compile_head,
    parse_compile,
    parse_header,
    parse_ready,
    parse_reply,
)
from suaveplan_sandbox.wasm._engine_config import SETTINGS_TAG
from wasm._module_bytes import STAND_IN_CHILD_PRELUDE, answer, leb, salted, section

MIB = 1024 * 1024


def _module(bodies: list[bytes]) -> bytes:
    types = section(1, leb(1) + b"\x60\x00\x00")  # (func)
    funcs = section(3, leb(len(bodies)) + b"\x00" * len(bodies))
    code = section(10, leb(len(bodies)) + b"".join(leb(len(b)) + b for b in bodies))
    return salted(b"\0asm\x01\0\0\0" + types + funcs + code)


def _deep_nesting(n: int) -> bytes:
    """One function: n nested blocks, each keeping a value on the operand stack across the
    next. Within every header bound; Cranelift's memory grows faster than linearly with n
    (n = 10,000, 60 KB: ~0.2 GB; 20,000: ~0.8 GB)."""
    body = b"\x00" + b"\x41\x00\x02\x7f" * n + b"\x41\x00" + b"\x0b\x6a" * n + b"\x1a\x0b"
    return _module([body])


# 250,000 empty functions take ~8 s of one core to compile (100,000 took 3.4 s here): far
# more than the 1-2 s a one-second CPU limit allows, and slow enough to be killed mid-compile.
SLOW_FUNCTIONS = 250_000
ADMITS_SLOW = CompileLimits(max_functions=SLOW_FUNCTIONS)


def _slow_to_compile() -> bytes:
    return _module([b"\x00\x0b"] * SLOW_FUNCTIONS)


def _policy(root: Path) -> PermissionPolicy:
    return PermissionPolicy.from_manifest({"name": "guest", "permissions": {}}, root=root)


def _write(tmp_path: Path, wasm: bytes) -> Path:
    path = tmp_path / f"{uuid.uuid4().hex}.wasm"
    path.write_bytes(wasm)
    return path


async def _answers(root: Path, tmp_path: Path, n: int, **options: object) -> int:
    path = _write(tmp_path, answer(n))
    async with await create_wasm_sandbox(
        wasm_module_path=path,
        policy=_policy(root),
        **options,  # type: ignore[arg-type]
    ) as sb:
        result = await sb.call("answer")
    assert isinstance(result, int)
    return result


# -- the child's limits ----------------------------------------------------------------------


async def test_a_compile_over_the_memory_cap_is_refused_and_the_host_goes_on(
    root: Path, tmp_path: Path
) -> None:
    small = CompileLimits(memory_bytes=64 * MIB)
    server = compile_server()
    # An ordinary module compiles under the small cap: the cap does not refuse compiling.
    assert await _answers(root, tmp_path, 5, compile_limits=small) == 5
    starts = server.starts
    path = _write(tmp_path, _deep_nesting(10_000))
    with pytest.raises(SuaveplanError) as info:
        await create_wasm_sandbox(wasm_module_path=path, policy=_policy(root), compile_limits=small)
    assert info.value.code == "SAND_WASM_INSTANTIATION_FAILED"
    assert info.value.details["stage"] == "compile"
    assert info.value.details["reason"] == "compile-resources"
    # The host is still here, and the next create gets a fresh child.
    assert await _answers(root, tmp_path, 6) == 6
    assert server.starts == starts + 1
    # The same module compiles under the default cap: it was the cap that refused it.
    async with await create_wasm_sandbox(wasm_module_path=path, policy=_policy(root)):
        pass


async def test_a_compile_over_the_cpu_limit_is_refused_and_the_host_goes_on(
    root: Path, tmp_path: Path
) -> None:
    path = _write(tmp_path, _slow_to_compile())
    with pytest.raises(SuaveplanError) as info:
        await create_wasm_sandbox(
            wasm_module_path=path,
            policy=_policy(root),
            compile_limits=dataclasses.replace(ADMITS_SLOW, cpu_seconds=1),
        )
    assert info.value.code == "SAND_WASM_INSTANTIATION_FAILED"
    assert info.value.details == {
        "stage": "compile",
        "reason": "compile-resources",
        "signal": "SIGXCPU",
    }
    assert await _answers(root, tmp_path, 7) == 7


async def test_a_compile_child_killed_mid_compile_is_a_coded_error_and_the_next_create_works(
    root: Path, tmp_path: Path
) -> None:
    server = compile_server()
    path = _write(tmp_path, _slow_to_compile())
    task = asyncio.create_task(
        create_wasm_sandbox(wasm_module_path=path, policy=_policy(root), compile_limits=ADMITS_SLOW)
    )
    for _ in range(6000):  # a liveness guard, not a timing assertion
        if server.busy_pid is not None or task.done():
            break
        await asyncio.sleep(0.005)
    victim = server.busy_pid
    assert victim is not None
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(SuaveplanError) as info:
        await task
    assert info.value.code == "SAND_WASM_INSTANTIATION_FAILED"
    assert info.value.details == {
        "stage": "compile",
        "reason": "compile-resources",
        "signal": "SIGKILL",
    }
    assert await _answers(root, tmp_path, 8) == 8
    assert server.pid not in (None, victim)


def test_the_host_process_never_compiles_a_guest_module(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("compiled in the host process")

    monkeypatch.setattr(wasmtime.Module, "__init__", refuse)
    module = _engine.load_module(answer(9))
    store = wasmtime.Store(_engine.engine())
    store.set_epoch_deadline(1 << 30)
    export = wasmtime.Instance(store, module, []).exports(store)["answer"]
    assert isinstance(export, wasmtime.Func) and export(store) == 9


async def test_concurrent_compiles_each_get_their_own_module(root: Path, tmp_path: Path) -> None:
    # Large enough (1 MiB each) that every request takes many writes: interleaved frames
    # would be malformed or answer the wrong module.
    paths = [_write(tmp_path, answer(n, pad=MIB)) for n in range(6)]
    before = _engine.compile_count()

    async def answer_of(path: Path) -> object:
        async with await create_wasm_sandbox(wasm_module_path=path, policy=_policy(root)) as sb:
            return await sb.call("answer")

    assert await asyncio.gather(*(answer_of(p) for p in paths)) == list(range(6))
    assert _engine.compile_count() - before == 6


# -- the child's replies -----------------------------------------------------------------------

_SOURCE = b"\0asm\x01\0\0\0"
_DIGEST = hashlib.sha256(_SOURCE).digest()


def test_a_well_formed_reply_is_accepted() -> None:
    assert parse_reply(COMPILED, _DIGEST + b"native", source=_SOURCE) == Compiled(
        artefact=b"native"
    )
    assert parse_reply(REFUSED, b"bad magic", source=_SOURCE) == Refused(
        message="bad magic", valid=False
    )
    assert parse_header(HEADER.pack(COMPILED, 100), expect=REPLIES, max_payload=100) == (
        COMPILED,
        100,
    )
    head = encode_compile_head(len(_SOURCE), memory_bytes=5 * MIB, cpu_seconds=7)
    kind, length = parse_header(head[: HEADER.size], expect=frozenset({COMPILE}), max_payload=99)
    request = parse_compile(head[HEADER.size :] + _SOURCE)
    assert (kind, length) == (COMPILE, len(head) - HEADER.size + len(_SOURCE))
    assert (request.memory_bytes, request.cpu_seconds, request.source) == (5 * MIB, 7, _SOURCE)


@pytest.mark.parametrize(
    ("header", "why"),
    [
        pytest.param(HEADER.pack(COMPILED, 101), "too-large", id="length-over-the-bound"),
        pytest.param(HEADER.pack(COMPILED, 2**32 - 1), "too-large", id="length-u32-max"),
        pytest.param(HEADER.pack(ord("Z"), 1), "unexpected-kind", id="unknown-kind"),
        pytest.param(HEADER.pack(READY, 1), "unexpected-kind", id="ready-instead-of-reply"),
        pytest.param(HEADER.pack(COMPILE, 1), "unexpected-kind", id="a-request-as-reply"),
        pytest.param(HEADER.pack(COMPILED, 1)[:4], "short-header", id="short-header"),
    ],
)
def test_a_forged_reply_header_is_refused_before_its_payload_is_read(
    header: bytes, why: str
) -> None:
    with pytest.raises(MalformedFrame) as info:
        parse_header(header, expect=REPLIES, max_payload=100)
    assert info.value.why == why


@pytest.mark.parametrize(
    ("kind", "payload", "why"),
    [
        pytest.param(COMPILED, _DIGEST, "short-payload", id="digest-without-artefact"),
        pytest.param(COMPILED, b"x" * 31, "short-payload", id="short-digest"),
        pytest.param(
            COMPILED, hashlib.sha256(b"other").digest() + b"native", "wrong-digest", id="other"
        ),
        pytest.param(REFUSED, b"\xff\xfe", "not-utf8", id="refusal-not-utf8"),
        pytest.param(REFUSED, b"x" * (MAX_TEXT_BYTES + 1), "too-large", id="refusal-too-long"),
        pytest.param(READY, b"{}", "unexpected-kind", id="ready"),
    ],
)
def test_a_forged_reply_payload_is_refused(kind: int, payload: bytes, why: str) -> None:
    with pytest.raises(MalformedFrame) as info:
        parse_reply(kind, payload, source=_SOURCE)
    assert info.value.why == why


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        (b"{", "not-json"),
        (b"[]", "bad-ready"),
        (b'{"settings": "x"}', "bad-ready"),
        (b'{"settings": 1, "wasmtime": "w"}', "bad-ready"),
        (b'{"settings": "x", "wasmtime": "w", "more": 1}', "bad-ready"),
    ],
)
def test_a_forged_ready_is_refused(payload: bytes, why: str) -> None:
    with pytest.raises(MalformedFrame) as info:
        parse_ready(payload)
    assert info.value.why == why


# A stand-in child: says READY (as told), reads one request, then sends REPLY.
_FORGED = (
    STAND_IN_CHILD_PRELUDE
    + r"""
kind, length = struct.unpack(">BI", exact(5))
source = exact(length)[12:]
digest = hashlib.sha256(source).digest()
sock.sendall(REPLY)
sock.recv(1)
"""
)


def _forged(reply: str, *, settings: str = SETTINGS_TAG) -> CompileServer:
    ready = json.dumps({"settings": settings, "wasmtime": wasmtime.__file__}).encode()
    source = _FORGED.replace("READY_PAYLOAD", repr(ready)).replace("REPLY", reply)
    return CompileServer(bootstrap=source)


@pytest.mark.parametrize(
    ("reply", "why"),
    [
        pytest.param(
            'struct.pack(">BI", ord("O"), 40) + b"\\0" * 40', "wrong-digest", id="wrong-digest"
        ),
        pytest.param('struct.pack(">BI", ord("O"), 2**32 - 1)', "too-large", id="too-large"),
        pytest.param('struct.pack(">BI", ord("Z"), 0)', "unexpected-kind", id="unknown-kind"),
    ],
)
def test_a_child_sending_a_forged_reply_is_refused_and_stopped(reply: str, why: str) -> None:
    server = _forged(reply)
    try:
        with pytest.raises(SuaveplanError) as info:
            server.compile(_SOURCE, memory_bytes=64 * MIB, cpu_seconds=5)
        assert info.value.code == "SAND_WASM_INSTANTIATION_FAILED"
        assert info.value.details == {
            "stage": "compile",
            "reason": "compile-reply-malformed",
            "why": why,
        }
        assert server.pid is None
    finally:
        server.close()


def test_an_artefact_that_does_not_load_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    # The right digest, but not a wasmtime artefact.
    server = _forged('struct.pack(">BI", ord("O"), 38) + digest + b"native"')
    monkeypatch.setattr(_engine, "compile_server", lambda: server)
    try:
        with pytest.raises(SuaveplanError) as info:
            _engine.load_module(answer(10))
        assert info.value.details == {
            "stage": "compile",
            "reason": "compile-reply-malformed",
            "why": "deserialize",
        }
        assert isinstance(info.value.__cause__, wasmtime.WasmtimeError)
        assert server.pid is None
    finally:
        server.close()


def test_a_child_that_does_not_answer_in_time_is_killed(monkeypatch: pytest.MonkeyPatch) -> None:
    # The wait is WALL_FACTOR x cpu_seconds + WALL_SLACK_S; shrunk so the test is quick.
    from suaveplan_sandbox.wasm import _compile_child

    monkeypatch.setattr(_compile_child, "WALL_FACTOR", 0)
    monkeypatch.setattr(_compile_child, "WALL_SLACK_S", 0.2)
    server = _forged("b''")  # takes the request, never answers
    with pytest.raises(SuaveplanError) as info:
        server.compile(_SOURCE, memory_bytes=64 * MIB, cpu_seconds=1)
    assert info.value.details == {"stage": "compile", "reason": "compile-timeout"}
    assert server.pid is None


def test_a_child_that_exits_mid_request_is_a_child_failure() -> None:
    server = _forged("(sys.exit(5), b'')[1]")
    with pytest.raises(SuaveplanError) as info:
        server.compile(_SOURCE, memory_bytes=64 * MIB, cpu_seconds=5)
    assert info.value.details == {"stage": "compile", "reason": "compile-child-failed", "exit": 5}
    assert server.pid is None


def test_valid_bytes_wasmtime_would_not_compile_are_a_compile_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = _forged('struct.pack(">BI", ord("F"), 4) + b"oops"')
    monkeypatch.setattr(_engine, "compile_server", lambda: server)
    try:
        with pytest.raises(SuaveplanError) as info:
            _engine.load_module(answer(14))
        assert info.value.details == {"stage": "compile", "reason": "compile-failed"}
        assert isinstance(info.value.__cause__, wasmtime.WasmtimeError)
        assert str(info.value.__cause__) == "oops"
        assert server.pid is not None  # an answer, not a failure of the child
    finally:
        server.close()


def test_a_child_that_died_while_idle_is_replaced_without_failing_a_compile() -> None:
    server = CompileServer()
    try:
        assert isinstance(server.compile(_SOURCE, memory_bytes=64 * MIB, cpu_seconds=5), Compiled)
        first = server.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        for _ in range(2000):  # a liveness guard, not a timing assertion
            if server.pid is None:
                break
            time.sleep(0.005)
        assert server.pid is None
        assert isinstance(server.compile(_SOURCE, memory_bytes=64 * MIB, cpu_seconds=5), Compiled)
        assert server.pid not in (None, first)
        assert (server.starts, server.requests) == (2, 2)
    finally:
        server.close()


def test_a_child_whose_engine_differs_from_the_hosts_is_refused() -> None:
    server = _forged("b''", settings="0" * 12)
    with pytest.raises(SuaveplanError) as info:
        server.compile(_SOURCE, memory_bytes=64 * MIB, cpu_seconds=5)
    assert info.value.details == {
        "stage": "compile",
        "reason": "compile-child-unavailable",
        "why": "engine-mismatch",
    }
    assert server.pid is None
    assert server.requests == 0


def test_the_real_child_announces_the_hosts_engine_settings() -> None:
    server = CompileServer()
    try:
        reply = server.compile(_SOURCE, memory_bytes=64 * MIB, cpu_seconds=5)
        assert isinstance(reply, Compiled)
        wasmtime.Module.deserialize(_engine.engine(), reply.artefact)  # loads here
        assert (server.starts, server.requests) == (1, 1)
    finally:
        server.close()
    assert server.pid is None


# -- CompileLimits -------------------------------------------------------------------------------


def test_compile_limits_default_to_the_bounds_constants() -> None:
    limits = CompileLimits()
    assert limits.max_functions == bounds.MAX_FUNCTIONS
    assert limits.max_function_bytes == bounds.MAX_FUNCTION_BYTES
    assert limits.max_locals_times_bytes == bounds.MAX_LOCALS_TIMES_BYTES
    assert limits.memory_bytes == bounds.DEFAULT_COMPILE_MEMORY_BYTES
    assert limits.cpu_seconds == bounds.DEFAULT_COMPILE_CPU_SECONDS
    with pytest.raises(dataclasses.FrozenInstanceError):
        limits.cpu_seconds = 5  # type: ignore[misc]


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(CompileLimits)])
@pytest.mark.parametrize("bad", [-1, True, 1.5, None, "7"])
def test_compile_limits_refuse_a_value_that_is_not_a_count(field: str, bad: object) -> None:
    with pytest.raises(SuaveplanError) as info:
        CompileLimits(**{field: bad})  # type: ignore[arg-type]
    assert info.value.code == "SAND_INVALID_ARGUMENT"
    assert info.value.details == {"argument": "compile_limits", "field": field}


@pytest.mark.parametrize(
    ("field", "bad"),
    [("memory_bytes", 0), ("memory_bytes", 2**48 + 1), ("cpu_seconds", 0), ("cpu_seconds", 2**31)],
)
def test_compile_resource_limits_must_be_in_range(field: str, bad: int) -> None:
    with pytest.raises(SuaveplanError) as info:
        CompileLimits(**{field: bad})
    assert info.value.details == {"argument": "compile_limits", "field": field}


@pytest.mark.parametrize("bad", [None, {"cpu_seconds": 5}, 5])
async def test_create_refuses_compile_limits_of_another_type(root: Path, bad: object) -> None:
    with pytest.raises(SuaveplanError) as info:
        await create_wasm_sandbox(
            wasm_module_path=root / "never-read.wasm",
            policy=_policy(root),
            compile_limits=bad,  # type: ignore[arg-type]
        )
    assert info.value.code == "SAND_INVALID_ARGUMENT"
    assert info.value.details == {"argument": "compile_limits"}


# -- bounds as an option, and the caches ---------------------------------------------------------


async def test_raised_bounds_admit_a_module_the_defaults_refuse_and_the_cache_keeps_them(
    root: Path, tmp_path: Path
) -> None:
    wasm = _module([b"\x01" + leb(bounds.MAX_FUNCTION_LOCALS + 1) + b"\x7f\x0b"])
    path = _write(tmp_path, wasm)
    with pytest.raises(SuaveplanError) as info:
        await create_wasm_sandbox(wasm_module_path=path, policy=_policy(root))
    assert info.value.details["reason"] == "too-many-locals"
    raised = CompileLimits(max_function_locals=bounds.MAX_FUNCTION_LOCALS + 1)
    async with await create_wasm_sandbox(
        wasm_module_path=path, policy=_policy(root), compile_limits=raised
    ):
        pass
    # Compiled and cached under the larger bound, the module is still refused under the
    # default one: by file (the cached identity) and by bytes.
    with pytest.raises(SuaveplanError) as again:
        await create_wasm_sandbox(wasm_module_path=path, policy=_policy(root))
    assert again.value.details == {
        "stage": "bounds",
        "reason": "too-many-locals",
        "limit": bounds.MAX_FUNCTION_LOCALS,
        "function": 0,
    }
    with pytest.raises(SuaveplanError) as by_bytes:
        _engine.load_module(wasm)
    assert by_bytes.value.details["reason"] == "too-many-locals"
    assert _engine.cached_module_file(path) is None
    assert _engine.cached_module_file(path, limits=raised) is not None


async def test_lowered_bounds_refuse_a_module_the_defaults_admitted_from_either_cache(
    root: Path, tmp_path: Path
) -> None:
    wasm = answer(11)
    path = _write(tmp_path, wasm)
    cache = tmp_path / "cache"
    async with await create_wasm_sandbox(
        wasm_module_path=path, policy=_policy(root), cache_dir=cache
    ) as sb:
        assert await sb.call("answer") == 11
    low = CompileLimits(max_functions=0)
    with pytest.raises(SuaveplanError) as info:
        await create_wasm_sandbox(wasm_module_path=path, policy=_policy(root), compile_limits=low)
    assert info.value.details == {"stage": "bounds", "reason": "too-many-functions", "limit": 0}
    # Not from the disk cache either: the bounds are checked before it is read.
    _engine._modules.pop(hashlib.sha256(wasm).hexdigest())
    server = compile_server()
    requests = server.requests
    with pytest.raises(SuaveplanError) as disk:
        await create_wasm_sandbox(
            wasm_module_path=path, policy=_policy(root), cache_dir=cache, compile_limits=low
        )
    assert disk.value.details["reason"] == "too-many-functions"
    assert server.requests == requests


async def test_a_cache_hit_never_touches_the_compile_child(root: Path, tmp_path: Path) -> None:
    server = compile_server()
    wasm = answer(12)
    path = _write(tmp_path, wasm)
    cache = tmp_path / "cache"
    async with await create_wasm_sandbox(
        wasm_module_path=path, policy=_policy(root), cache_dir=cache
    ):
        pass
    server.close()
    seen = (server.starts, server.requests, _engine.compile_count())
    # From memory: by file identity, and by bytes.
    async with await create_wasm_sandbox(wasm_module_path=path, policy=_policy(root)) as sb:
        assert await sb.call("answer") == 12
    _engine.load_module(wasm)
    # From the disk cache, the in-memory entry dropped.
    _engine._modules.pop(hashlib.sha256(wasm).hexdigest())
    async with await create_wasm_sandbox(
        wasm_module_path=path, policy=_policy(root), cache_dir=cache
    ) as sb:
        assert await sb.call("answer") == 12
    assert (server.starts, server.requests, _engine.compile_count()) == seen
    assert server.pid is None
    # A miss does start it again.
    assert await _answers(root, tmp_path, 13) == 13
    assert server.starts == seen[0] + 1


# -- reaping a child after EOF (no real process, no real time) --------------------------------


class _ExitingChild:
    """A stand-in `Popen`: it ends with `code` once waits have lasted `after` seconds, on a clock
    only its waits advance. Being killed ends it at once (with `-SIGKILL`) unless `stuck`
    (a process in uninterruptible sleep). An unbounded wait for a child that may not end
    fails the test: it would hang the host."""

    def __init__(self, *, after: float, code: int, stuck: bool = False) -> None:
        self.after, self.code, self.stuck = after, code, stuck
        self.clock = 0.0
        self.killed_at: float | None = None
        self.waits = 0

    def wait(self, timeout: float | None = None) -> int:
        self.waits += 1
        if self.killed_at is not None and not self.stuck:
            return -signal.SIGKILL
        assert timeout is not None, "an unbounded wait for a child that may not end"
        if self.clock + timeout >= self.after:
            self.clock = self.after
            return self.code
        self.clock += timeout
        raise subprocess.TimeoutExpired("compile-child", timeout)

    def kill(self) -> None:
        self.killed_at = self.clock


def test_a_child_slow_to_finish_exiting_after_eof_is_reported_by_its_signal() -> None:
    # Failed before: the host waited one second after EOF, then killed the child and
    # reported no signal (`compile-child-failed`) for a child the kernel had already ended.
    child = _ExitingChild(after=3.0, code=-signal.SIGXCPU)
    assert _reap(child, wait=True) == {"signal": "SIGXCPU"}  # type: ignore[arg-type]
    assert child.killed_at is None
    exited = _ExitingChild(after=3.0, code=EXIT_OUT_OF_MEMORY)
    assert _reap(exited, wait=True) == {"exit": EXIT_OUT_OF_MEMORY}  # type: ignore[arg-type]


@pytest.mark.parametrize("stuck", [False, True], ids=["killable", "uninterruptible"])
def test_a_child_that_does_not_end_after_eof_is_killed_and_never_waited_for_unboundedly(
    stuck: bool,
) -> None:
    # Failed before for a child in uninterruptible sleep: after the kill the host waited for
    # it without a bound.
    child = _ExitingChild(after=float("inf"), code=0, stuck=stuck)
    assert _reap(child, wait=True) == {}  # type: ignore[arg-type]
    assert child.killed_at == pytest.approx(REAP_CHECKS * REAP_CHECK_S)
    assert child.waits == REAP_CHECKS + 1


def test_without_eof_a_running_child_is_killed_at_once() -> None:
    child = _ExitingChild(after=float("inf"), code=0)
    assert _reap(child, wait=False) == {}  # type: ignore[arg-type]
    assert child.killed_at == 0.0
    ended = _ExitingChild(after=0.0, code=-signal.SIGKILL)
    assert _reap(ended, wait=False) == {"signal": "SIGKILL"}  # type: ignore[arg-type]
