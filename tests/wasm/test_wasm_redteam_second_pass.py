"""Second red-team pass against the WASM guest boundary, from the module's side.

Each case runs a real module (WAT compiled here) in a real sandbox and asserts the coded
outcome. The first group are bugs this pass found and fixed; the rest pin probes that were
already blocked, so a later change cannot open them quietly.

Found and fixed (each failed before its fix):

- `path_open` with an `fd_out` wasmtime cannot write opened the file, then trapped: the
  descriptor stayed in the store uncounted, one more past `MAX_OPEN_FILES` per call.
- A guest still running after `dispose()` (no wallClockMs) went on opening the host's files
  through its store's preopens.
- A clock-only `poll_oneoff` for the longest timeouts (2**64 - 1 ns, relative or absolute)
  passed a wait the platform cannot represent to `threading.Event.wait`; the `OverflowError`
  escaped the host function and ended the guest (`SAND_WASM_TRAP`) at once.
- The JSON the imports decode admitted values no other guest can send and the rest of the
  host cannot carry: lone UTF-16 surrogates from `\\u` escapes, integers past 64 bits,
  `NaN`/`Infinity` and overflowing floats. An event published with one was answered
  `SUCCESS` and then dropped (with a warning per delivery) by every VM subscriber, whose
  wire codec refuses it. Nesting past the decoder's recursion bound was `IO`, as if an
  adapter had failed.
- Errnos said the wrong thing. Text that is not UTF-8 (a name, topic, host, SQL) and an
  input over 1 MiB inside guest memory were `FAULT`, which says a pointer lies outside it;
  an adapter refusing the guest's argument (`SAND_INVALID_ARGUMENT`) was `IO`. A `db_query`
  result JSON cannot carry (a BLOB, a non-finite REAL) was `INVAL` after the statement ran
  (or, for infinity, written as non-JSON `Infinity` with `SUCCESS`), and a secret value
  that is not UTF-8 was `INVAL`: both are the host's failure to answer, now `IO`.

Found outside the files this pass may change, pinned as an expected failure: a trap's
`__cause__` is wasmtime's own error, whose text quotes the module's name section.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import traceback
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Final

import pytest
import wasmtime

from _descriptors import descriptors_under
from suaveplan_sandbox.adapters import Adapters, QueryResult
from suaveplan_sandbox.errors import SuaveplanError, WireValue
from suaveplan_sandbox.metrics import InMemoryMetrics, PrometheusMetrics
from suaveplan_sandbox.permissions import DenyReason, PermissionPolicy
from suaveplan_sandbox.testing import RecordingAudit
from suaveplan_sandbox.testing._fakes import DictSecrets, FakeDb, FakeFetch, InMemoryEvents
from suaveplan_sandbox.wasm import Errno, WasmSandbox, create_wasm_sandbox
from suaveplan_sandbox.wasm._imports import MAX_INPUT
from suaveplan_sandbox.wasm._sandbox import MAX_DENIALS
from suaveplan_sandbox.wasm._wasi_guard import MAX_OPEN_FILES
from wasm._guest_thread import guest_threads, released, running

WASI: Final = "wasi_snapshot_preview1"
WASI_PERM: Final = 63
WASI_NOTCAPABLE: Final = 76
SECRET: Final = "s3cr3t-Value-91f2"
# The `suaveplan` imports, their arity, and the guest memory the generic guest has.
ARITY: Final = {
    "sock_connect": 4,
    "sock_send": 4,
    "sock_recv": 4,
    "sock_close": 1,
    "secrets_get": 5,
    "events_publish": 4,
    "db_query": 7,
    "fetch": 5,
}
PAGE: Final = 65536
OUT: Final = PAGE  # the generic guest's output buffer: the whole second page
LEN_OUT: Final = 60_000
STR_AT: Final = 50_000  # where `_strings` segments start


def _esc(data: bytes) -> str:
    return "".join(f"\\{b:02x}" for b in data)


def _imports_wat(data: bytes = b"", strings: Sequence[bytes] = (), *, pages: int = 2) -> str:
    """Every import as a raw export, `data` at 0, each of `strings` at STR_AT + 256 * i."""
    parts = []
    for name, n in ARITY.items():
        params = " ".join(["i32"] * n)
        args = " ".join(f"(local.get {i})" for i in range(n))
        parts.append(f'(import "suaveplan" "{name}" (func ${name} (param {params}) (result i32)))')
        parts.append(
            f'(func (export "{name}") (param {params}) (result i32) (call ${name} {args}))'
        )
    imports = [p for p in parts if p.startswith("(import")]
    funcs = [p for p in parts if p.startswith("(func")]
    segments = [f'(data (i32.const 0) "{_esc(data)}")'] if data else []
    segments += [
        f'(data (i32.const {STR_AT + 256 * i}) "{_esc(s)}")' for i, s in enumerate(strings)
    ]
    return (
        "(module "
        + " ".join(imports)
        + f' (memory (export "memory") {pages}) '
        + " ".join(segments)
        + " "
        + " ".join(funcs)
        + ' (func (export "fill") (param i32 i32 i32)'
        + " (memory.fill (local.get 0) (local.get 1) (local.get 2)))"
        + ' (func (export "load") (param i32) (result i32) (i32.load (local.get 0)))'
        + ' (func (export "load8") (param i32) (result i32) (i32.load8_u (local.get 0)))'
        + ' (func (export "trap") unreachable)'
        + ' (func (export "grow_then_secret") (param $at i32) (result i32)'
        + "  (drop (memory.grow (i32.const 1)))"
        + "  (call $secrets_get (i32.const 50000) (i32.const 7) (local.get $at) (i32.const 64)"
        + "    (i32.const 60000))))"
    )


def _at(index: int) -> int:
    return STR_AT + 256 * index


def _policy(root: Path, **permissions: object) -> PermissionPolicy:
    return PermissionPolicy.from_manifest(
        {
            "name": "guest",
            "permissions": {"fetch": ["api.stripe.com"], **permissions},
            "secrets": [{"name": "API_KEY"}],
            "events": {"publishes": ["guest.*"]},
            "database": {"tablePrefix": "guest_"},
        },
        root=root,
    )


class _Host:
    """The adapters a guest may reach, recording what reached them."""

    def __init__(self, rows: Sequence[Sequence[WireValue]] = ()) -> None:
        self.fetch = FakeFetch()
        self.events = InMemoryEvents()
        self.secrets = DictSecrets({"API_KEY": SECRET})
        table = tuple(tuple(row) for row in rows)
        self.db = FakeDb(lambda _sql, _params: QueryResult(columns=("v",), rows=table, rowcount=0))
        self.metrics = InMemoryMetrics()
        self.audit = RecordingAudit()

    def adapters(self) -> Adapters:
        return Adapters(fetch=self.fetch, events=self.events, secrets=self.secrets, db=self.db)

    def asked(self) -> int:
        """How many requests reached the gateway (any outcome)."""
        return int(self.metrics.value("plugin.capability_calls_total"))


async def _sandbox(
    wat: Callable[[str], Path], root: Path, host: _Host, text: str, **permissions: object
) -> WasmSandbox:
    return await create_wasm_sandbox(
        wasm_module_path=wat(text),
        policy=_policy(root, **permissions),
        proxies=host.adapters(),
        metrics=host.metrics,
        audit=host.audit,
    )


@pytest.fixture
def host() -> Iterator[_Host]:
    made = _Host()
    yield made
    made.fetch.close()


# -- found: path_open's fd_out ----------------------------------------------------------------

OPEN_WAT: Final = f"""
(module
  (import "{WASI}" "path_open"
    (func $open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 100) "a.txt")
  (func $open_to (param $out i32) (result i32)
    (call $open (i32.const 3) (i32.const 0) (i32.const 100) (i32.const 5) (i32.const 0)
      (i64.const 2) (i64.const 0) (i32.const 0) (local.get $out)))
  (func (export "open_to") (param $out i32) (result i32) (call $open_to (local.get $out)))
  (func (export "open_many_to") (param $n i32) (param $out i32) (result i32)
    (local $i i32) (local $last i32)
    (loop $l
      (local.set $last (call $open_to (local.get $out)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (local.get $n))))
    (local.get $last)))
"""


def _fs_policy(root: Path, *rules: str) -> PermissionPolicy:
    return PermissionPolicy.from_manifest(
        {"name": "guest", "permissions": {"fs": list(rules)}}, root=root
    )


@pytest.mark.parametrize(
    ("fd_out", "errno"),
    [
        pytest.param(PAGE, Errno.FAULT, id="just-past-memory"),
        pytest.param(PAGE - 2, Errno.INVAL, id="misaligned-straddling-the-end"),
        pytest.param(-4, Errno.FAULT, id="negative"),
        pytest.param(2**31 - 4, Errno.FAULT, id="far-past-memory"),
        pytest.param(65, Errno.INVAL, id="misaligned"),
    ],
)
async def test_a_path_open_whose_fd_out_cannot_be_written_opens_nothing(
    root: Path, wat: Callable[[str], Path], fd_out: int, errno: Errno
) -> None:
    async with await create_wasm_sandbox(
        wasm_module_path=wat(OPEN_WAT), policy=_fs_policy(root, "uploads/*")
    ) as sb:
        before = descriptors_under(root)
        # wasmtime opened the file and then trapped writing its number: the descriptor
        # stayed in the store, uncounted, one per call.
        assert await sb.call("open_to", fd_out) == errno
        assert await sb.call("open_many_to", 500, fd_out) == errno
        assert descriptors_under(root) == before
        assert sb.state == "ready"
        # The count still holds for opens that succeed.
        assert await sb.call("open_many_to", 500, 64) == Errno.MFILE
        assert descriptors_under(root) - before == MAX_OPEN_FILES
    assert descriptors_under(root) <= before


BUSY_OPEN_WAT: Final = f"""
(module
  (import "{WASI}" "path_open"
    (func $open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "{WASI}" "fd_close" (func $close (param i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 100) "a.txt")
  ;; Opens and closes a.txt until an open fails (its errno) or n rounds pass (0).
  (func (export "open_until_refused") (param $n i32) (result i32) (local $e i32)
    (loop $l
      (local.set $e (call $open (i32.const 3) (i32.const 0) (i32.const 100) (i32.const 5)
        (i32.const 0) (i64.const 2) (i64.const 0) (i32.const 0) (i32.const 64)))
      (if (local.get $e) (then (return (local.get $e))))
      (drop (call $close (i32.load (i32.const 64))))
      (local.set $n (i32.sub (local.get $n) (i32.const 1)))
      (br_if $l (local.get $n)))
    (i32.const 0)))
"""


async def test_a_guest_running_on_after_dispose_opens_no_more_files(
    root: Path, wat: Callable[[str], Path]
) -> None:
    # Without wallClockMs nothing interrupts guest code; but its store's preopens are the
    # host's files, and after dispose its next shadowed WASI call ends it.
    sb = await create_wasm_sandbox(
        wasm_module_path=wat(BUSY_OPEN_WAT), policy=_fs_policy(root, "uploads/*")
    )
    busy = asyncio.create_task(sb.call("open_until_refused", 50_000_000))
    assert await running(sb)
    await asyncio.sleep(0.2)
    assert not busy.done()
    threads = guest_threads(sb)
    await sb.dispose()
    with pytest.raises(SuaveplanError):
        await asyncio.wait_for(busy, timeout=60)  # was: opening files for minutes more
    assert await released(threads)


# -- found: the longest clock polls -------------------------------------------------------------

SLEEP_WAT: Final = f"""
(module
  (import "{WASI}" "poll_oneoff" (func $poll (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "sleep") (param $clock i32) (param $ns i64) (param $flags i32) (result i32)
    (i64.store (i32.const 0) (i64.const 1))
    (i32.store8 (i32.const 8) (i32.const 0))
    (i32.store (i32.const 16) (local.get $clock))
    (i64.store (i32.const 24) (local.get $ns))
    (i32.store16 (i32.const 40) (local.get $flags))
    (call $poll (i32.const 0) (i32.const 512) (i32.const 1) (i32.const 200))))
"""
LONGEST: Final = [
    pytest.param(1, 0, id="monotonic-relative"),
    pytest.param(0, 0, id="realtime-relative"),
    pytest.param(1, 1, id="monotonic-absolute"),
    pytest.param(0, 1, id="realtime-absolute"),
]


@pytest.mark.parametrize(("clock", "flags"), LONGEST)
async def test_the_longest_clock_poll_sleeps_until_the_sandbox_is_disposed(
    root: Path, wat: Callable[[str], Path], clock: int, flags: int
) -> None:
    sb = await create_wasm_sandbox(wasm_module_path=wat(SLEEP_WAT), policy=_fs_policy(root))
    sleeping = asyncio.create_task(sb.call("sleep", clock, -1, flags))  # 2**64 - 1 ns
    assert await running(sb)
    await asyncio.sleep(0.3)
    # It used to end the guest at once (`SAND_WASM_TRAP`, an OverflowError from the wait).
    assert not sleeping.done()
    assert sb.state == "ready"
    threads = guest_threads(sb)
    await sb.dispose()
    with pytest.raises(SuaveplanError):
        await asyncio.wait_for(sleeping, timeout=10)
    assert await released(threads)


@pytest.mark.parametrize(("clock", "flags"), LONGEST)
async def test_the_longest_clock_poll_ends_at_the_wall_clock_budget(
    root: Path, wat: Callable[[str], Path], clock: int, flags: int
) -> None:
    rules = PermissionPolicy.from_manifest(
        {"name": "guest", "permissions": {"budgets": {"wallClockMs": 100}}}, root=root
    )
    async with await create_wasm_sandbox(wasm_module_path=wat(SLEEP_WAT), policy=rules) as sb:
        with pytest.raises(SuaveplanError) as info:
            await sb.call("sleep", clock, -1, flags)
        assert info.value.code == "BUDGET_EXCEEDED"
        assert info.value.details["budget"] == "wallClockMs"


# -- found: JSON outside the wire's values --------------------------------------------------

DEEP: Final = 5000
# JSON values no VM guest can send (msgpack carries none of them) and no strict JSON
# consumer accepts.
OUTSIDE: Final = {
    "lone-high-surrogate": '"\\ud800"',
    "lone-low-surrogate": '"\\udc00"',
    "high-surrogate-then-letter": '"\\ud800\\u0041"',
    "surrogate-key": '{"\\udfff": 1}',
    "int-past-u64": str(2**64),
    "int-below-i64": str(-(2**63) - 1),
    "NaN": "NaN",
    "Infinity": "Infinity",
    "-Infinity": "-Infinity",
    "overflowing-float": "1e999",
    "overflowing-negative-float": "-1e999",
}
# What is inside: each decodes to exactly this value.
INSIDE: Final[dict[str, tuple[str, WireValue]]] = {
    "surrogate-pair": ('"\\ud83d\\ude00"', "\U0001f600"),
    "escaped-backslash-u": ('"\\\\ud800"', "\\ud800"),
    "u64-max": (str(2**64 - 1), 2**64 - 1),
    "i64-min": (str(-(2**63)), -(2**63)),
    "largest-float": ("1.7976931348623157e308", 1.7976931348623157e308),
    "nul-in-string": ('"a\\u0000b"', "a\x00b"),
}


def _document(kind: str, value: str) -> bytes:
    if kind == "events_publish":
        return f'{{"v":{value}}}'.encode()
    if kind == "db_query":
        return f"[{value}]".encode()
    return f'{{"url":"https://api.stripe.com/x","v":{value}}}'.encode()


async def _send_json(sb: WasmSandbox, kind: str, length: int) -> int:
    result: int
    if kind == "events_publish":  # topic "guest.t" at _at(0)
        result = await sb.call(kind, _at(0), 7, 0, length)
    elif kind == "db_query":  # "SELECT ?" at _at(1)
        result = await sb.call(kind, _at(1), 8, 0, length, OUT, PAGE, LEN_OUT)
    else:
        result = await sb.call(kind, 0, length, OUT, PAGE, LEN_OUT)
    return result


JSON_KINDS: Final = ["events_publish", "db_query", "fetch"]
STRINGS: Final = (b"guest.t", b"SELECT ?")


@pytest.mark.parametrize("kind", JSON_KINDS)
@pytest.mark.parametrize("value", list(OUTSIDE.values()), ids=list(OUTSIDE))
async def test_json_values_no_other_guest_can_send_are_inval_before_the_gateway(
    root: Path, wat: Callable[[str], Path], host: _Host, kind: str, value: str
) -> None:
    data = _document(kind, value)
    sb = await _sandbox(wat, root, host, _imports_wat(data, STRINGS))
    async with sb:
        assert await _send_json(sb, kind, len(data)) == Errno.INVAL
        assert sb.state == "ready"
    assert host.asked() == 0  # refused before the gateway: no decision, no adapter
    assert host.events.published == []
    assert host.db.queries == []
    assert host.fetch.requests == []


@pytest.mark.parametrize("kind", JSON_KINDS)
async def test_json_nested_past_the_decoder_bound_is_inval(
    root: Path, wat: Callable[[str], Path], host: _Host, kind: str
) -> None:
    data = _document(kind, "[" * DEEP + "]" * DEEP)
    sb = await _sandbox(wat, root, host, _imports_wat(data, STRINGS))
    async with sb:
        assert await _send_json(sb, kind, len(data)) == Errno.INVAL  # was IO
    assert host.asked() == 0


@pytest.mark.parametrize("case", list(INSIDE.values()), ids=list(INSIDE))
async def test_json_values_inside_the_wire_still_reach_the_adapter_exactly(
    root: Path, wat: Callable[[str], Path], host: _Host, case: tuple[str, WireValue]
) -> None:
    value, expected = case
    data = _document("events_publish", value)
    sb = await _sandbox(wat, root, host, _imports_wat(data, STRINGS))
    async with sb:
        assert await _send_json(sb, "events_publish", len(data)) == Errno.SUCCESS
    assert host.events.published == [("guest", "guest.t", {"v": expected})]


async def test_a_payload_an_adapter_refuses_as_an_argument_is_inval(
    root: Path, wat: Callable[[str], Path], host: _Host
) -> None:
    # 300 levels decode, but event payloads are at most 256 deep: the bus says
    # SAND_INVALID_ARGUMENT, which is the guest's argument, not an adapter failure (IO).
    data = _document("events_publish", "[" * 300 + "]" * 300)
    sb = await _sandbox(wat, root, host, _imports_wat(data, STRINGS))
    async with sb:
        assert await _send_json(sb, "events_publish", len(data)) == Errno.INVAL
    assert host.events.published == []


# -- found: text that is not UTF-8 --------------------------------------------------------------

NOT_UTF8: Final = {
    "ff": b"API_KEY\xff",
    "encoded-surrogate": b"\xed\xa0\x80",
    "overlong-slash": b"\xc0\xaf",
    "truncated": b"API_KEY\xe2\x82",
}


@pytest.mark.parametrize("text", list(NOT_UTF8.values()), ids=list(NOT_UTF8))
@pytest.mark.parametrize("kind", ["secrets_get", "events_publish", "db_query", "sock_connect"])
async def test_text_that_is_not_utf8_is_inval_and_never_reaches_the_gateway(
    root: Path, wat: Callable[[str], Path], host: _Host, kind: str, text: bytes
) -> None:
    sb = await _sandbox(wat, root, host, _imports_wat(text))
    n = len(text)
    calls = {
        "secrets_get": (0, n, OUT, 64, LEN_OUT),
        "events_publish": (0, n, 0, 0),
        "db_query": (0, n, 0, 0, OUT, 64, LEN_OUT),
        "sock_connect": (0, n, 443, LEN_OUT),
    }
    async with sb:
        assert await sb.call(kind, *calls[kind]) == Errno.INVAL  # was FAULT
    assert host.asked() == 0


async def test_an_input_over_one_mib_is_inval_inside_memory_and_fault_past_it(
    root: Path, wat: Callable[[str], Path], host: _Host
) -> None:
    sb = await _sandbox(wat, root, host, _imports_wat(pages=17))
    over = MAX_INPUT + 1
    async with sb:
        assert await sb.call("events_publish", 0, over, 0, 0) == Errno.INVAL  # was FAULT
        assert await sb.call("events_publish", 0, 4, 0, over) == Errno.INVAL
        assert await sb.call("secrets_get", 0, over, OUT, 64, LEN_OUT) == Errno.INVAL
        assert await sb.call("events_publish", 17 * PAGE - 4, over, 0, 0) == Errno.FAULT
    assert host.asked() == 0


async def test_a_secret_value_that_is_not_utf8_is_io_not_the_guests_fault(
    root: Path, wat: Callable[[str], Path], host: _Host
) -> None:
    # An environment variable holding bytes that are not UTF-8 reads back (surrogateescape)
    # as a str with lone surrogates: the host cannot write it, the guest asked nothing wrong.
    host.secrets = DictSecrets({"API_KEY": "ab\udc80cd"})
    sb = await _sandbox(wat, root, host, _imports_wat(b"", (b"API_KEY",)))
    async with sb:
        await sb.call("fill", OUT, 0x55, 8)
        assert await sb.call("secrets_get", _at(0), 7, OUT, 64, LEN_OUT) == Errno.IO  # was INVAL
        assert await sb.call("load", OUT) == 0x55555555


# -- found: db results JSON cannot carry -------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [b"\x00\xff", math.inf, -math.inf, math.nan],
    ids=["blob", "inf", "-inf", "nan"],
)
async def test_a_db_result_json_cannot_carry_is_io_and_never_half_written(
    root: Path, wat: Callable[[str], Path], value: WireValue
) -> None:
    host = _Host(rows=[[value]])
    try:
        sb = await _sandbox(wat, root, host, _imports_wat(b"[]", STRINGS))
        async with sb:
            await sb.call("fill", OUT, 0x55, 64)
            result = await sb.call("db_query", _at(1), 8, 0, 2, OUT, PAGE, LEN_OUT)
            assert result == Errno.IO  # blob: was INVAL; inf/nan: SUCCESS with non-JSON
            assert await sb.call("load", OUT) == 0x55555555  # nothing written
        assert len(host.db.queries) == 1
    finally:
        host.fetch.close()


async def test_a_db_result_is_strict_json(root: Path, wat: Callable[[str], Path]) -> None:
    host = _Host(rows=[["\U0001f600", 2**63 - 1, 1.5, None]])
    try:
        sb = await _sandbox(wat, root, host, _imports_wat(b"[]", STRINGS))
        async with sb:
            assert await sb.call("db_query", _at(1), 8, 0, 2, OUT, PAGE, LEN_OUT) == 0
            length = await sb.call("load", LEN_OUT)
            raw = bytes([await sb.call("load8", OUT + i) for i in range(length)])
        assert json.loads(raw) == {
            "columns": ["v"],
            "rows": [["\U0001f600", 2**63 - 1, 1.5, None]],
            "rowcount": 0,
        }
    finally:
        host.fetch.close()


# -- trap text: the cause is a bounded, printable stand-in -----------------------------------


async def test_a_trap_carries_no_unbounded_or_raw_guest_text(
    root: Path, wat: Callable[[str], Path]
) -> None:
    # A guest names its function 100,000 characters ending in a terminal escape; wasmtime's
    # backtrace quotes it in the trap's message, chained as the coded error's __cause__, so
    # a host logging the error (`logger.exception`) writes the guest's text into its log.
    name = "A" * 100_000 + "\\1b]0;owned\\07\\0aforged log line"
    text = f'(module (func (@name "{name}") (export "boom") unreachable))'
    async with await create_wasm_sandbox(wasm_module_path=wat(text), policy=_fs_policy(root)) as sb:
        with pytest.raises(SuaveplanError) as info:
            await sb.call("boom")
    assert info.value.code == "SAND_WASM_TRAP"
    shown = "".join(traceback.format_exception(info.value))
    assert len(shown) < 16_384
    assert "\x1b" not in shown
    assert "forged log line" not in shown


# -- probes already blocked: pointers, lengths and memories ---------------------------------


@pytest.mark.parametrize(
    ("args", "errno"),
    [
        # (name_ptr, name_len, buf, cap, len_out)
        pytest.param((-16, 32, OUT, 64, LEN_OUT), Errno.FAULT, id="name-wraps-32-bits"),
        pytest.param((_at(2), -1, OUT, 64, LEN_OUT), Errno.FAULT, id="name-len-u32-max"),
        pytest.param((_at(2), 7, -16, 32, LEN_OUT), Errno.FAULT, id="buf-wraps-32-bits"),
        pytest.param((_at(2), 7, OUT, -1, LEN_OUT), Errno.FAULT, id="cap-u32-max"),
        pytest.param((_at(2), 7, OUT, 64, -1), Errno.FAULT, id="len-out-u32-max"),
        pytest.param((_at(2), 7, 2 * PAGE - 8, 64, LEN_OUT), Errno.FAULT, id="buf-past-end"),
        pytest.param((_at(2), 7, 2 * PAGE, 0, LEN_OUT), Errno.NOBUFS, id="empty-buf-at-end"),
        pytest.param((_at(2), 0, OUT, 64, LEN_OUT), Errno.ACCES, id="empty-name"),
        pytest.param((_at(2), 7, OUT, 64, OUT + 2), Errno.SUCCESS, id="len-out-inside-buf"),
        pytest.param((_at(2), 7, _at(2), 64, _at(2)), Errno.SUCCESS, id="all-overlapping"),
    ],
)
async def test_pointer_and_length_edges_get_an_errno_and_touch_nothing_outside(
    root: Path,
    wat: Callable[[str], Path],
    host: _Host,
    args: tuple[int, ...],
    errno: Errno,
) -> None:
    sb = await _sandbox(wat, root, host, _imports_wat(b"", (b"", b"", b"API_KEY")))
    async with sb:
        assert await sb.call("secrets_get", *args) == errno
        assert sb.state == "ready"
        assert await sb.call("load8", 0) == 0  # the page before the strings is untouched


async def test_memory_grown_between_two_imports_is_seen_by_the_second(
    root: Path, wat: Callable[[str], Path], host: _Host
) -> None:
    sb = await _sandbox(wat, root, host, _imports_wat(b"", (b"API_KEY",)))
    async with sb:
        # The view is taken per import: the third page exists by the time the import runs.
        assert await sb.call("grow_then_secret", 2 * PAGE + 100) == Errno.SUCCESS
        assert await sb.call("load", LEN_OUT) == len(SECRET)
        assert await sb.call("load8", 2 * PAGE + 100) == ord(SECRET[0])
        assert await sb.call("grow_then_secret", 4 * PAGE) == Errno.FAULT  # one page past


MEMORY_LIKE: Final = {
    "global": '(global (export "memory") i32 (i32.const 0)) (memory (export "mem") 1)',
    "table": '(table (export "memory") 1 funcref) (memory (export "mem") 1)',
    "no-memory": "",
    "empty-memory": '(memory (export "memory") 0)',
}


@pytest.mark.parametrize("memory", list(MEMORY_LIKE.values()), ids=list(MEMORY_LIKE))
async def test_an_export_named_memory_that_is_no_usable_memory_is_fault(
    root: Path, wat: Callable[[str], Path], host: _Host, memory: str
) -> None:
    text = f"""
    (module
      (import "suaveplan" "secrets_get" (func $sg (param i32 i32 i32 i32 i32) (result i32)))
      (import "{WASI}" "poll_oneoff" (func $poll (param i32 i32 i32 i32) (result i32)))
      (import "{WASI}" "path_open"
        (func $open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
      {memory}
      (func (export "secret") (result i32)
        (call $sg (i32.const 0) (i32.const 7) (i32.const 64) (i32.const 64) (i32.const 8)))
      (func (export "poll") (result i32)
        (call $poll (i32.const 0) (i32.const 64) (i32.const 1) (i32.const 8)))
      (func (export "open") (result i32)
        (call $open (i32.const 3) (i32.const 0) (i32.const 0) (i32.const 1) (i32.const 0)
          (i64.const 2) (i64.const 0) (i32.const 0) (i32.const 8))))
    """
    sb = await _sandbox(wat, root, host, text, fs=["uploads/*"])
    async with sb:
        before = descriptors_under(root)
        for export in ("secret", "poll", "open"):
            assert await sb.call(export) == Errno.FAULT, export
        assert descriptors_under(root) == before
        assert sb.state == "ready"
    assert host.secrets.requested == []


MEMORY_KINDS: Final = {
    "memory64": '(memory (export "memory") i64 1)',
    "shared": '(memory (export "memory") 1 1 shared)',
    "two-memories": '(memory (export "memory") 1) (memory $two 1)',
}


@pytest.mark.parametrize("memory", list(MEMORY_KINDS.values()), ids=list(MEMORY_KINDS))
async def test_memories_the_host_cannot_bound_are_refused_before_any_import_runs(
    root: Path, wat: Callable[[str], Path], host: _Host, memory: str
) -> None:
    text = f"""
    (module
      (import "suaveplan" "secrets_get" (func $sg (param i32 i32 i32 i32 i32) (result i32)))
      {memory}
      (func $start (drop (call $sg (i32.const 0) (i32.const 7) (i32.const 64) (i32.const 64)
        (i32.const 8))))
      (start $start))
    """
    with pytest.raises(SuaveplanError) as info:
        await _sandbox(wat, root, host, text)
    assert info.value.code == "SAND_WASM_INSTANTIATION_FAILED"
    assert host.secrets.requested == []


START_WAT: Final = f"""
(module
  (import "suaveplan" "secrets_get" (func $sg (param i32 i32 i32 i32 i32) (result i32)))
  (import "{WASI}" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "API_KEY")
  (func $start
    (drop (call $sg (i32.const 0) (i32.const 7) (i32.const 256) (i32.const 64) (i32.const 8))))
  (start $start)
  (func (export "wipe") (i32.store8 (i32.const 256) (i32.const 0)))
  (func (export "load8") (param i32) (result i32) (i32.load8_u (local.get 0)))
  (func (export "_start") (call $exit (i32.load8_u (i32.const 256)))))
"""


async def test_an_import_in_a_runs_start_function_writes_that_runs_memory_only(
    root: Path, wat: Callable[[str], Path], host: _Host
) -> None:
    sb = await _sandbox(wat, root, host, START_WAT)
    async with sb:
        assert await sb.call("load8", 256) == ord(SECRET[0])  # create's start function
        await sb.call("wipe")
        result = await sb.run()  # its own instance: its start function fills its memory
        assert result.exit_code == ord(SECRET[0])
        assert await sb.call("load8", 256) == 0  # the long-lived memory was not touched
    assert host.secrets.requested == ["API_KEY", "API_KEY"]


async def test_imports_answer_after_a_trap_and_the_sandbox_refuses_after_dispose(
    root: Path, wat: Callable[[str], Path], host: _Host
) -> None:
    sb = await _sandbox(wat, root, host, _imports_wat(b"", (b"API_KEY",)))
    with pytest.raises(SuaveplanError) as info:
        await sb.call("trap")
    assert info.value.code == "SAND_WASM_TRAP"
    assert await sb.call("secrets_get", _at(0), 7, OUT, 64, LEN_OUT) == Errno.SUCCESS
    await sb.dispose()
    with pytest.raises(SuaveplanError) as info:
        await sb.call("secrets_get", _at(0), 7, OUT, 64, LEN_OUT)
    assert info.value.code == "SAND_WASM_DISPOSED"
    assert host.secrets.requested == ["API_KEY"]


# -- probes already blocked: WASI ---------------------------------------------------------------

PATHS: Final = {
    "a": b"a.txt",
    "made": b"made",
    "up": b"../private/s.txt",
    "absolute": b"/private/s.txt",
    "etc": b"/etc/passwd",
    "proc": b"/proc/self/root/etc/passwd",
    "dotdot": b"..",
    "link": b"link",
}
PATH_AT: Final = {name: 2048 + 64 * i for i, name in enumerate(PATHS)}
FS_WAT: Final = (
    f"""
(module
  (import "{WASI}" "path_open"
    (func $open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "{WASI}" "path_symlink" (func $symlink (param i32 i32 i32 i32 i32) (result i32)))
  (import "{WASI}" "path_link" (func $link (param i32 i32 i32 i32 i32 i32 i32) (result i32)))
  (import "{WASI}" "path_rename" (func $rename (param i32 i32 i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
"""
    + "\n".join(
        f'  (data (i32.const {PATH_AT[name]}) "{_esc(text)}")' for name, text in PATHS.items()
    )
    + """
  (func (export "open") (param $fd i32) (param $p i32) (param $n i32) (param $follow i32)
      (param $oflags i32) (param $rights i64) (result i32)
    (call $open (local.get $fd) (local.get $follow) (local.get $p) (local.get $n)
      (local.get $oflags) (local.get $rights) (i64.const 0) (i32.const 0) (i32.const 1024)))
  (func (export "symlink") (param i32 i32 i32 i32 i32) (result i32)
    (call $symlink (local.get 0) (local.get 1) (local.get 2) (local.get 3) (local.get 4)))
  (func (export "link") (param i32 i32 i32 i32 i32 i32) (result i32)
    (call $link (local.get 0) (i32.const 0) (local.get 1) (local.get 2) (local.get 3)
      (local.get 4) (local.get 5)))
  (func (export "rename") (param i32 i32 i32 i32 i32 i32) (result i32)
    (call $rename (local.get 0) (local.get 1) (local.get 2) (local.get 3) (local.get 4)
      (local.get 5))))
"""
)
RW_FD, RO_FD = 3, 4  # `rw:data/*` then `uploads/*`
FD_READ, FD_WRITE = 1 << 1, 1 << 6
REFUSED: Final = {WASI_PERM, WASI_NOTCAPABLE, 44, 32}  # noent (no link made), loop (a link)


def _p(name: str) -> tuple[int, int]:
    return PATH_AT[name], len(PATHS[name])


@pytest.fixture
async def fs_sandbox(root: Path, wat: Callable[[str], Path]) -> AsyncIterator[WasmSandbox]:
    (root / "data").mkdir()
    rules = _fs_policy(root, "rw:data/*", "uploads/*")
    async with await create_wasm_sandbox(wasm_module_path=wat(FS_WAT), policy=rules) as sb:
        assert [(p.guest, p.writable) for p in sb.preopens] == [
            ("/data", True),
            ("/uploads", False),
        ]
        yield sb


@pytest.mark.parametrize("name", ["up", "absolute", "etc", "proc", "dotdot"])
@pytest.mark.parametrize("follow", [0, 1])
async def test_paths_leaving_a_preopen_are_refused(
    fs_sandbox: WasmSandbox, name: str, follow: int
) -> None:
    for fd in (RW_FD, RO_FD):
        assert await fs_sandbox.call("open", fd, *_p(name), follow, 0, FD_READ) in REFUSED


@pytest.mark.parametrize("target", ["up", "etc", "proc", "dotdot"])
async def test_a_symlink_the_guest_makes_cannot_lead_out_of_its_preopen(
    fs_sandbox: WasmSandbox, root: Path, target: str
) -> None:
    made = await fs_sandbox.call("symlink", *_p(target), RW_FD, *_p("link"))
    assert made in {Errno.SUCCESS, WASI_PERM, WASI_NOTCAPABLE}
    for follow in (0, 1):
        assert await fs_sandbox.call("open", RW_FD, *_p("link"), follow, 0, FD_READ) in REFUSED
    assert (root / "private" / "s.txt").read_text() == "secret"


async def test_a_read_only_file_cannot_be_linked_or_renamed_into_a_writable_preopen(
    fs_sandbox: WasmSandbox, root: Path
) -> None:
    # A hard link in `data` to `uploads/a.txt` would make the read-only file writable.
    assert await fs_sandbox.call("link", RO_FD, *_p("a"), RW_FD, *_p("made")) in REFUSED
    assert await fs_sandbox.call("rename", RO_FD, *_p("a"), RW_FD, *_p("made")) in REFUSED
    assert os.listdir(root / "data") == []
    assert (root / "uploads" / "a.txt").read_text() == "hello"
    assert await fs_sandbox.call("open", RO_FD, *_p("a"), 0, 0, FD_WRITE) == WASI_PERM


WASI_CALLS_WAT: Final = f"""
(module
  (import "{WASI}" "fd_readdir" (func $readdir (param i32 i32 i32 i64 i32) (result i32)))
  (import "{WASI}" "random_get" (func $random (param i32 i32) (result i32)))
  (import "{WASI}" "clock_time_get" (func $now (param i32 i64 i32) (result i32)))
  (import "{WASI}" "args_sizes_get" (func $args (param i32 i32) (result i32)))
  (import "{WASI}" "environ_sizes_get" (func $env (param i32 i32) (result i32)))
  (import "{WASI}" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
  (import "{WASI}" "fd_read" (func $read (param i32 i32 i32 i32) (result i32)))
  (import "{WASI}" "fd_close" (func $close (param i32) (result i32)))
  (import "{WASI}" "sock_accept" (func $accept (param i32 i32 i32) (result i32)))
  (import "{WASI}" "sock_recv" (func $srecv (param i32 i32 i32 i32 i32 i32) (result i32)))
  (import "{WASI}" "sock_send" (func $ssend (param i32 i32 i32 i32 i32) (result i32)))
  (import "{WASI}" "sock_shutdown" (func $sshut (param i32 i32) (result i32)))
  (import "suaveplan" "sock_send" (func $our_send (param i32 i32 i32 i32) (result i32)))
  (import "suaveplan" "sock_recv" (func $our_recv (param i32 i32 i32 i32) (result i32)))
  (import "suaveplan" "sock_close" (func $our_close (param i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "readdir") (param i32 i64) (result i32)
    (call $readdir (local.get 0) (i32.const 0) (i32.const 4096) (local.get 1) (i32.const 8192)))
  (func (export "random") (param i32 i32) (result i32) (call $random (local.get 0) (local.get 1)))
  (func (export "now") (param i32 i32) (result i32)
    (call $now (local.get 0) (i64.const 1) (local.get 1)))
  (func (export "args") (param i32 i32) (result i32) (call $args (local.get 0) (local.get 1)))
  (func (export "env") (param i32 i32) (result i32) (call $env (local.get 0) (local.get 1)))
  (func (export "write") (param i32 i32 i32 i32) (result i32)
    (call $write (local.get 0) (local.get 1) (local.get 2) (local.get 3)))
  (func (export "read") (param i32 i32 i32 i32) (result i32)
    (call $read (local.get 0) (local.get 1) (local.get 2) (local.get 3)))
  (func (export "close") (param i32) (result i32) (call $close (local.get 0)))
  (func (export "accept") (param i32) (result i32)
    (call $accept (local.get 0) (i32.const 0) (i32.const 100)))
  (func (export "srecv") (param i32) (result i32)
    (call $srecv (local.get 0) (i32.const 0) (i32.const 1) (i32.const 0) (i32.const 100)
      (i32.const 104)))
  (func (export "ssend") (param i32) (result i32)
    (call $ssend (local.get 0) (i32.const 0) (i32.const 1) (i32.const 0) (i32.const 100)))
  (func (export "sshut") (param i32) (result i32) (call $sshut (local.get 0) (i32.const 2)))
  (func (export "our_send") (param i32) (result i32)
    (call $our_send (local.get 0) (i32.const 0) (i32.const 1) (i32.const 100)))
  (func (export "our_recv") (param i32) (result i32)
    (call $our_recv (local.get 0) (i32.const 0) (i32.const 1) (i32.const 100)))
  (func (export "our_close") (param i32) (result i32) (call $our_close (local.get 0)))
  (func (export "answer") (result i32) (i32.const 42)))
"""
ANY_TRAP: Final = "trap"
WASI_CALLS: Final = [
    (("readdir", 3, -1), Errno.SUCCESS),  # cookie 2**64 - 1: nothing more to read
    (("readdir", 3, 2**40), Errno.SUCCESS),
    (("readdir", 99, 0), Errno.BADF),
    (("random", 0, PAGE), Errno.SUCCESS),  # the whole memory
    (("random", 0, PAGE + 1), ANY_TRAP),
    (("random", -1, 1), ANY_TRAP),
    (("random", 0, -1), ANY_TRAP),
    (("now", 1, PAGE - 3), ANY_TRAP),
    (("now", 1, -8), ANY_TRAP),
    (("now", 7, 0), ANY_TRAP),  # no such clock
    (("args", PAGE, 0), ANY_TRAP),
    (("env", 0, -1), ANY_TRAP),
    (("write", 1000, 0, 1, 200), Errno.BADF),  # an fd never opened
    (("write", 1, 0, 2**31 - 1, 200), Errno.NOMEM),  # an iovec count past memory: wasmtime's answer
    (("write", 1, 0, -1, 200), Errno.NOMEM),
    (("read", 77, 0, 1, 200), Errno.BADF),
    (("close", -1), Errno.BADF),
    (("close", 12345), Errno.BADF),
    (("accept", 3), 57),  # notsock: no socket is ever preopened
    (("accept", 1), 57),
    (("srecv", 3), 57),
    (("ssend", 1), 57),
    (("sshut", 3), 57),
    (("srecv", 55), Errno.BADF),
    (("our_send", 3), Errno.BADF),  # a WASI descriptor is no suaveplan socket
    (("our_recv", 0), Errno.BADF),
    (("our_close", 1), Errno.BADF),
]


@pytest.mark.parametrize(
    ("args", "outcome"), WASI_CALLS, ids=[" ".join(map(str, a)) for a, _ in WASI_CALLS]
)
async def test_wasi_calls_with_hostile_arguments_get_an_errno_or_a_coded_trap(
    root: Path, wat: Callable[[str], Path], args: tuple[object, ...], outcome: object
) -> None:
    async with await create_wasm_sandbox(
        wasm_module_path=wat(WASI_CALLS_WAT), policy=_fs_policy(root, "uploads/*")
    ) as sb:
        if outcome == ANY_TRAP:
            with pytest.raises(SuaveplanError) as info:
                await sb.call(*args)  # type: ignore[arg-type]
            assert info.value.code == "SAND_WASM_TRAP"
        else:
            assert await sb.call(*args) == outcome  # type: ignore[arg-type]
        assert sb.state == "ready"
        assert await sb.call("answer") == 42


IOVEC_WAT: Final = f"""
(module
  (import "{WASI}" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
  (import "{WASI}" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 2)
  (func (export "_start") (local $i i32)
    ;; 8,000 iovecs, each the whole first page: 500 MiB asked of one write.
    (loop $l
      (i32.store (i32.add (i32.const {PAGE}) (i32.mul (local.get $i) (i32.const 8)))
        (i32.const 0))
      (i32.store (i32.add (i32.const {PAGE + 4}) (i32.mul (local.get $i) (i32.const 8)))
        (i32.const {PAGE}))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (i32.const 8000))))
    (call $exit (call $write (i32.const 1) (i32.const {PAGE}) (i32.const 8000)
      (i32.const {PAGE - 8})))))
"""


async def test_a_write_of_many_huge_iovecs_is_held_to_the_output_cap(
    root: Path, wat: Callable[[str], Path]
) -> None:
    async with await create_wasm_sandbox(
        wasm_module_path=wat(IOVEC_WAT), policy=_fs_policy(root), max_output_bytes=1000
    ) as sb:
        result = await sb.run()
    assert result.exit_code == Errno.IO
    assert result.stdout == b"\x00" * 1000
    assert result.stdout_truncated


EXIT_WAT: Final = f"""
(module
  (import "{WASI}" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)
  (func (export "exit") (param i32) (call $exit (local.get 0)))
  (func (export "answer") (result i32) (i32.const 42)))
"""


@pytest.mark.parametrize("code", [126, 255, 2**31 - 1, -1])
async def test_an_exit_code_outside_0_to_125_is_a_coded_trap(
    root: Path, wat: Callable[[str], Path], code: int
) -> None:
    async with await create_wasm_sandbox(
        wasm_module_path=wat(EXIT_WAT), policy=_fs_policy(root)
    ) as sb:
        with pytest.raises(SuaveplanError) as info:
            await sb.call("exit", code)
        assert info.value.code == "SAND_WASM_TRAP"
        assert sb.state == "ready"
        assert await sb.call("answer") == 42


STDOUT_WAT: Final = f"""
(module
  (import "{WASI}" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 17)
  (data (i32.const 16) "GUEST-WROTE-THIS")
  (func (export "flood") (param $fd i32) (result i32) (local $i i32)
    (i32.store (i32.const 0) (i32.const 16))
    (i32.store (i32.const 4) (i32.const {16 * PAGE}))
    (loop $l
      (drop (call $write (local.get $fd) (i32.const 0) (i32.const 1) (i32.const 8)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (i32.const 16))))
    (i32.load (i32.const 8))))
"""


async def test_stdout_and_stderr_of_a_call_reach_nothing_of_the_host(
    root: Path, wat: Callable[[str], Path], capfd: pytest.CaptureFixture[str]
) -> None:
    async with await create_wasm_sandbox(
        wasm_module_path=wat(STDOUT_WAT), policy=_fs_policy(root)
    ) as sb:
        for fd in (1, 2):
            await sb.call("flood", fd)  # 16 MiB a stream, outside `run`'s capture
    out, err = capfd.readouterr()
    assert "GUEST-WROTE-THIS" not in out
    assert "GUEST-WROTE-THIS" not in err


# -- probes already blocked: what a guest makes the host hold ----------------------------------


async def test_denials_a_guest_varies_create_no_new_metric_series(
    root: Path, wat: Callable[[str], Path]
) -> None:
    # Every guest-chosen text (hosts, topics, secret names, URLs, SQL) in a denial: the
    # series are per plugin, capability and reason, each from a closed set.
    prometheus = pytest.importorskip("prometheus_client")
    registry = prometheus.CollectorRegistry()
    sink = PrometheusMetrics(registry)
    strings = []
    for i in range(60):
        strings += [
            f"evil{i}.example.com".encode(),
            f"other.topic.{i}\x00\n".encode(),
            f"SECRET_{i}".encode(),
            f'{{"url":"https://evil{i}.example.com/"}}'.encode(),
            f"DROP TABLE t{i}".encode(),
        ]
    offsets = [sum(len(x) for x in strings[:i]) for i in range(len(strings))]
    text = _imports_wat(b"".join(strings))
    sb = await create_wasm_sandbox(
        wasm_module_path=wat(text), policy=_policy(root), proxies=_Host().adapters(), metrics=sink
    )
    async with sb:
        for i, s in enumerate(strings):
            at, n = offsets[i], len(s)
            kind = i % 5
            if kind == 0:
                assert await sb.call("sock_connect", at, n, 443, LEN_OUT) == Errno.ACCES
            elif kind == 1:
                assert await sb.call("events_publish", at, n, 0, 0) == Errno.ACCES
            elif kind == 2:
                assert await sb.call("secrets_get", at, n, OUT, 64, LEN_OUT) == Errno.ACCES
            elif kind == 3:
                assert await sb.call("fetch", at, n, OUT, 64, LEN_OUT) == Errno.ACCES
            else:
                assert await sb.call("db_query", at, n, 0, 0, OUT, 64, LEN_OUT) == Errno.ACCES
        assert sb.denials_total == len(strings)
        assert len(sb.denials) == min(len(strings), MAX_DENIALS)
        for error in sb.denials:
            shown = json.dumps(error.to_wire())
            assert len(shown) < 300
            assert "evil" not in shown
            assert "SECRET_" not in shown
            assert "topic" not in shown
            assert "DROP" not in shown
    reasons = {r.value for r in DenyReason}
    series = [
        s
        for metric in registry.collect()
        for s in metric.samples
        if s.name.startswith("plugin_") and s.name.endswith("_total")
    ]
    assert series
    for sample in series:
        assert sample.labels.get("plugin") == "guest"
        assert sample.labels.get("capability", "fetch") in {"fetch", "events", "secrets", "db"}
        assert sample.labels.get("reason", "host-not-in-allowlist") in reasons
        assert sample.labels.get("outcome", "deny") in {"ok", "deny", "error"}
    assert len(series) <= 4 * len(reasons) + 4 * 3


async def test_a_secret_the_guest_puts_in_a_url_is_kept_out_of_the_audit_log(
    root: Path, wat: Callable[[str], Path], host: _Host
) -> None:
    request = f'{{"url":"https://api.stripe.com/x?k={SECRET}"}}'.encode()
    sb = await _sandbox(wat, root, host, _imports_wat(request, (b"API_KEY",)))
    async with sb:
        assert await sb.call("secrets_get", _at(0), 7, OUT, 64, LEN_OUT) == Errno.SUCCESS
        assert await sb.call("fetch", 0, len(request), OUT, PAGE, LEN_OUT) == Errno.SUCCESS
    assert len(host.fetch.requests) == 1  # the guest's data is its own to send
    resources = [r.resource or "" for r in host.audit.records]
    assert any("api.stripe.com" in r for r in resources)
    assert not any(SECRET in r for r in resources)


PARAMS_WAT: Final = """
(module
  (import "suaveplan" "db_query" (func $q (param i32 i32 i32 i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 4)
  (data (i32.const 0) "SELECT ?")
  ;; Writes `[0,0,...,0]` (n + 1 zeros) at 1024 and queries with it as the params.
  (func (export "query_with_zeros") (param $n i32) (result i32) (local $i i32)
    (i32.store8 (i32.const 1024) (i32.const 0x5b))
    (loop $l
      (i32.store16 (i32.add (i32.const 1025) (i32.mul (local.get $i) (i32.const 2)))
        (i32.const 0x2c30))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (local.get $n))))
    (i32.store16 (i32.add (i32.const 1025) (i32.mul (local.get $n) (i32.const 2)))
      (i32.const 0x5d30))
    (call $q (i32.const 0) (i32.const 8) (i32.const 1024)
      (i32.add (i32.const 3) (i32.mul (local.get $n) (i32.const 2)))
      (i32.const 250000) (i32.const 64) (i32.const 8))))
"""


async def test_a_huge_parameter_list_is_denied_before_the_adapter(
    root: Path, wat: Callable[[str], Path], host: _Host
) -> None:
    sb = await _sandbox(wat, root, host, PARAMS_WAT)
    async with sb:
        assert await sb.call("query_with_zeros", 100_000) == Errno.ACCES
    assert host.db.queries == []
    denied = host.metrics.value("plugin.permission_denied_total", plugin="guest", capability="db")
    assert denied == 1


async def test_a_topic_longer_than_the_limit_is_denied(
    root: Path, wat: Callable[[str], Path], host: _Host
) -> None:
    topic = b"guest." + b"t" * 251  # 257 characters: `guest.*` would match it
    sb = await _sandbox(wat, root, host, _imports_wat(topic))
    async with sb:
        assert await sb.call("events_publish", 0, len(topic), 0, 0) == Errno.ACCES
        assert await sb.call("events_publish", 0, len(topic) - 1, 0, 0) == Errno.SUCCESS
    assert [t for _, t, _ in host.events.published] == [topic[:-1].decode()]


def test_the_generic_guest_compiles() -> None:
    wasmtime.wat2wasm(_imports_wat(b"x", (b"y",)))


def test_the_json_depth_bound_is_ours_on_every_python() -> None:
    # The decoder's own bound moved with the version (about 1,000 on 3.11; far deeper on
    # 3.13, where 5,000 levels decoded and reached the gateway): the imports judge depth
    # themselves, the same everywhere.
    from suaveplan_sandbox.wasm._imports import MAX_JSON_DEPTH, _too_deep

    for opener, closer in (("[", "]"), ('{"a":', "}")):
        at = opener * MAX_JSON_DEPTH + "0" + closer * MAX_JSON_DEPTH
        past = opener * (MAX_JSON_DEPTH + 1) + "0" + closer * (MAX_JSON_DEPTH + 1)
        assert not _too_deep(at, json.loads(at))
        assert _too_deep(past, json.loads(past))
