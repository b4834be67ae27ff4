"""A worker that escaped the interpreter writes arbitrary bytes to its socket.

These plugins run with the in-interpreter layer switched off (the escape corpus's test-only
`load_plugin(..., _without_interpreter_layer=True)`): they find their IPC socket and
`os.write` the frames a test hands them, then stall, exit or return. Every case must end the
same way: the worker is killed, the caller gets a coded error, and the host process and a
second sandbox on the same loop carry on. No timing is asserted; `asyncio.wait_for` only
turns a hang into a failure.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import msgpack
import psutil
import pytest

from suaveplan_sandbox.adapters import Adapters
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.vm import VmSandbox, create_vm_sandbox
from suaveplan_sandbox.vm import _sandbox as vm_sandbox_module
from suaveplan_sandbox.vm._guest import PluginBundle, load_plugin
from suaveplan_sandbox.vm._sandbox import DEFAULT_MAX_FRAME_BYTES
from suaveplan_sandbox.vm._worker_loop import AdaptivePoll

# The start of every escaped plugin's source: its IPC socket, and a write that sends it all.
RAW_PRELUDE = """
import os, stat, time


def _fd():
    for fd in range(3, 1024):
        try:
            if stat.S_ISSOCK(os.fstat(fd).st_mode):
                return fd
        except OSError:
            pass
    raise RuntimeError("no socket")


def _write(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
"""

RAW = (
    RAW_PRELUDE
    + """


def send(chunks, then="stall"):
    fd = _fd()
    for chunk in chunks:
        _write(fd, chunk)
    if then == "exit":
        os._exit(0)
    if then == "stall":
        time.sleep(3600)
    return "sent"


def trickle(data, gap):
    # A byte at a time, each well within the host's polling window of the last.
    fd = _fd()
    for byte in data:
        _write(fd, bytes([byte]))
        end = time.perf_counter() + gap
        while time.perf_counter() < end:
            pass
    return "trickled"


def bomb(head, count, unit, tail=b""):
    # Built here: the frame is larger than what the host may send the worker.
    body = head + unit * count + tail
    send([len(body).to_bytes(4, "big") + body])
"""
)

# Module-level code of a plugin that forges its startup: it writes the frame and stalls.
STARTUP = """
import os, stat, time

for fd in range(3, 1024):
    try:
        if stat.S_ISSOCK(os.fstat(fd).st_mode):
            os.write(fd, {frame!r})
            break
    except OSError:
        pass
time.sleep(3600)
"""

OTHER = "def f():\n    return 2\n"
HANG = 30  # seconds before a case that never ends fails (not an assertion on time)


def frame(obj: object) -> bytes:
    body: bytes = msgpack.packb(obj, use_bin_type=True)
    return len(body).to_bytes(4, "big") + body


def raw_frame(body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + body


def _unchecked(path: str | Path) -> PluginBundle:
    return load_plugin(path, _without_interpreter_layer=True)


async def _escaped(
    tmp: Path,
    monkeypatch: pytest.MonkeyPatch,
    source: str,
    budgets: dict[str, int] | None = None,
    fs: object = None,
    *,
    policy: PermissionPolicy | None = None,
    proxies: Adapters | None = None,
    **options: Any,
) -> VmSandbox:
    """A sandbox running `source` with no interpreter layer (an escaped plugin). By default
    its policy grants `./data/*` reads and `budgets`, and its fs adapter is `fs` (a
    `StalledFs` unless given); `policy=` and `proxies=` replace them."""
    (tmp / "raw.py").write_text(source)
    if policy is None:
        policy = PermissionPolicy.from_manifest(
            {"name": "raw", "permissions": {"fs": ["./data/*"], "budgets": budgets or {}}},
            root=tmp,
        )
    if proxies is None:
        proxies = Adapters(fs=fs or StalledFs())  # type: ignore[arg-type]
    with monkeypatch.context() as patch:
        patch.setattr(vm_sandbox_module, "load_plugin", _unchecked)
        return await create_vm_sandbox(
            plugin_module_path=tmp / "raw.py", policy=policy, proxies=proxies, **options
        )


class StalledFs:
    """An fs adapter whose reads wait for ever (until cancelled), counting cancellations."""

    def __init__(self) -> None:
        self.started = 0
        self.cancelled = 0

    async def read_bytes(self, path: str, *, max_bytes: int) -> bytes:
        self.started += 1
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return b""


@pytest.fixture
async def other(tmp_path: Path) -> AsyncIterator[VmSandbox]:
    """A second, honest sandbox on the same loop: it must keep answering."""
    root = tmp_path / "other"
    root.mkdir()
    (root / "o.py").write_text(OTHER)
    policy = PermissionPolicy.from_manifest({"name": "other"}, root=root)
    async with await create_vm_sandbox(plugin_module_path=root / "o.py", policy=policy) as sb:
        yield sb


def _gone(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


async def _assert_killed(pid: int) -> None:
    for _ in range(500):
        if _gone(pid):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"worker {pid} still runs")


async def _coded_end(sb: VmSandbox, call: Any, other: VmSandbox) -> SuaveplanError:
    """The call's coded error, after checking the worker is gone and the rest carries on."""
    with pytest.raises(SuaveplanError) as info:
        await asyncio.wait_for(call, HANG)
    assert sb.state == "crashed"
    await _assert_killed(sb.pid)
    assert await other.call("f") == 2
    with pytest.raises(SuaveplanError) as later:
        await sb.call("send", [])
    assert later.value.code == "SAND_VM_WORKER_CRASHED"
    return info.value


def _next_id(sb: VmSandbox) -> int:
    return sb._next_id + 1


# -- length prefixes and framing ---------------------------------------------------------


@pytest.mark.parametrize(
    "case",
    [
        ([b"\x00\x00\x00\x00"], "stall", "wire:undecodable"),  # a body of nothing
        ([(DEFAULT_MAX_FRAME_BYTES + 1).to_bytes(4, "big")], "stall", "wire:frame-too-large"),
        ([b"\xff\xff\xff\xff"], "stall", "wire:frame-too-large"),  # 2**32 - 1
        ([b"\x80\x00\x00\x00"], "stall", "wire:frame-too-large"),  # -2**31 if it were signed
        # A frame dribbled out a byte at a time, then EOF before it is whole.
        ([bytes([b]) for b in frame(["log", "info", "x" * 40])[:-3]], "exit", "eof"),
        # Valid framing, trailing bytes inside the body.
        ([raw_frame(msgpack.packb(["log", "info", "x"]) + b"\xc0")], "stall", "wire:undecodable"),
    ],
    ids=["zero", "limit-plus-one", "max", "negative", "eof-mid-frame", "trailing-bytes"],
)
async def test_length_prefix_lies_end_the_worker(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    other: VmSandbox,
    case: tuple[list[bytes], str, str],
) -> None:
    chunks, then, why = case
    sb = await _escaped(tmp_path, monkeypatch, RAW)
    async with sb:
        err = await _coded_end(sb, sb.call("send", chunks, then), other)
    assert err.code == "SAND_VM_WORKER_CRASHED"
    assert err.details["why"] == why


async def test_a_frame_at_the_limit_is_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The largest frame the host reads: a 16 MiB result is the caller's (no elements to count).
    sb = await _escaped(tmp_path, monkeypatch, RAW)
    async with sb:
        # ["result", id, bin32 of the rest of the frame]
        head = b"\x93\xa6result" + msgpack.packb(_next_id(sb)) + b"\xc6"
        size = DEFAULT_MAX_FRAME_BYTES - len(head) - 4
        value = await asyncio.wait_for(
            sb.call("bomb", head + size.to_bytes(4, "big"), size, b"z"), HANG
        )
        assert value == b"z" * size
        assert sb.state == "idle"


async def test_a_frame_trickled_byte_by_byte_cannot_hold_the_hosts_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, other: VmSandbox
) -> None:
    # Every byte comes within the polling window of the last (widened, so that no pause of
    # the worker's ends the wait either), so only the inline wait's own bound (MAX_HOLD_MS)
    # hands the channel back to the loop; then the wall-clock budget fires long before the
    # frame is whole (a second or more of trickling). A wait that restarted with every byte
    # would hold the loop until the frame failed to decode.
    monkeypatch.setattr(vm_sandbox_module, "INLINE_WAIT_US", 10_000_000)
    sb = await _escaped(tmp_path, monkeypatch, RAW, budgets={"wallClockMs": 300})
    sb._poll = AdaptivePoll(10.0)  # the host's own window, too
    turns, done = 0, False

    async def ticker() -> None:
        nonlocal turns
        while not done:
            turns += 1
            await asyncio.sleep(0)

    tick = asyncio.ensure_future(ticker())
    try:
        async with sb:
            body = b"\x00" * 50_000
            call = sb.call("trickle", len(body).to_bytes(4, "big") + body, 0.00002)
            err = await _coded_end(sb, call, other)
            seen = turns
    finally:
        done = True
        await tick
    assert err.code == "BUDGET_EXCEEDED"
    assert seen >= 10


# -- msgpack bombs ------------------------------------------------------------------------


def _array32(count: int) -> bytes:
    return b"\xdd" + count.to_bytes(4, "big")


@pytest.mark.parametrize(
    "case",
    [
        # 16 MiB of empty arrays in one array: 1.2 GB of host lists before the element limit.
        ("result", b"\x90", "wire:undecodable"),  # the array announces more than the limit
        ("log", b"\x80", "wire:undecodable"),
        # The same in arrays of 1000, so no single array is over the limit.
        ("result", b"\xdc\x03\xe8" + b"\x90" * 1000, "wire:too-many-elements"),
        ("hostcall", b"\xdc\x03\xe8" + b"\x80" * 1000, "wire:too-many-elements"),
        # Maps of 100 distinct keys: dicts cost more than lists.
        (
            "result",
            b"\xde\x00\x64" + b"".join(b"\xa3%03d\xc0" % i for i in range(100)),
            "wire:too-many-elements",
        ),
    ],
    ids=["lists", "maps-in-a-log", "nested-lists", "nested-maps-hostcall", "maps-of-keys"],
)
async def test_element_bombs_end_the_worker_before_the_host_builds_them(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    other: VmSandbox,
    case: tuple[str, bytes, str],
) -> None:
    tag, unit, why = case
    sb = await _escaped(tmp_path, monkeypatch, RAW)
    async with sb:
        call_id = _next_id(sb)
        prefixes: dict[str, list[object]] = {
            "result": [call_id],
            "log": ["info"],
            "hostcall": [1, "fs"],
        }
        fields = prefixes[tag]
        head = msgpack.packb([tag, *fields], use_bin_type=True)
        head = bytes([head[0] + 1]) + head[1:]  # one more element: the bomb
        count = (DEFAULT_MAX_FRAME_BYTES - len(head) - 16) // len(unit)
        err = await _coded_end(sb, sb.call("bomb", head + _array32(count), count, unit), other)
    assert err.code == "SAND_VM_WORKER_CRASHED"
    assert err.details["why"] == why


_NAN_ID = b"\x93\xa6result\xcb" + msgpack.packb(math.nan)[1:] + b"\xc0"


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (raw_frame(b"\x93\xa6result\xcf\xff\xff\xff\xff\xff\xff\xff\xff\xc0"), "invalid-field"),
        (raw_frame(_NAN_ID), "invalid-field"),
        (frame(["result", True, None]), "invalid-field"),
        (frame(["hostcall", 1, b"fs", "read_bytes", {}]), "invalid-field"),  # bytes for str
        (frame(["hostcall", 1, "fs" * 129, "read_bytes", {}]), "invalid-field"),
        (frame(["hostcall", 1, "fs", "read_bytes", {b"path": "x"}]), "invalid-field"),
        (frame(["log", "info", b"text"]), "invalid-field"),
        (frame(["log", "info", "x" * (64 * 1024 + 1)]), "invalid-field"),
        (frame(["result", 1, msgpack.ExtType(5, b"x")]), "undecodable"),
        (frame(["result", 1, msgpack.Timestamp(1, 0)]), "undecodable"),
        (frame(["result", 1, {1: 2}]), "undecodable"),  # a non-str, non-bytes key
        (raw_frame(b"\x93\xa6result\x01\xa2\xff\xfe"), "undecodable"),  # invalid UTF-8
        (raw_frame(b"\x93\xa6result\x01\xa3\xed\xa0\x80"), "undecodable"),  # a surrogate
        (raw_frame(b"\x91" * 5000 + b"\xc0"), "undecodable"),  # nesting past msgpack's stack
        (frame(["nope", 1]), "unknown-message-type"),
        (frame({"result": 1}), "not-a-message"),
        (frame(["result", 1]), "wrong-field-count"),
    ],
)
async def test_malformed_values_end_the_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, other: VmSandbox, raw: bytes, why: str
) -> None:
    sb = await _escaped(tmp_path, monkeypatch, RAW)
    async with sb:
        err = await _coded_end(sb, sb.call("send", [raw]), other)
    assert err.code == "SAND_VM_WORKER_CRASHED"
    assert err.details["why"] == f"wire:{why}"


# -- messages out of protocol order -------------------------------------------------------


Frames = Callable[[int], list[bytes]]
_ERR = {"code": "SAND_FS_NOT_FOUND", "message": "m", "details": {}}


@pytest.mark.parametrize(
    "case",
    [
        (lambda i: [frame(["result", i + 1, 1])], "unexpected-reply", False),
        (lambda i: [frame(["failure", i + 7, _ERR])], "unexpected-reply", False),
        # The call is answered, then a second answer, a host call or a log line follows it.
        (lambda i: [frame(["result", i, 1]), frame(["result", i, 2])], "unexpected-reply", True),
        (
            lambda i: [frame(["result", i, 1]), frame(["hostcall", 1, "fs", "exists", {}])],
            "hostcall-outside-call",
            True,
        ),
        (
            lambda i: [frame(["result", i, 1]), frame(["log", "info", "x"])],
            "log-outside-call",
            True,
        ),
        # A second host call with the id of the one still running (a stalled read).
        (
            lambda i: [frame(["hostcall", 5, "fs", "read_bytes", {"path": "./data/a"}])] * 2,
            "hostcall-overlap",
            False,
        ),
        # Messages only the host sends, and a second Ready.
        (lambda i: [frame(["hostreply", 1, None])], "out-of-protocol", False),
        (lambda i: [frame(["hostfailure", 1, _ERR])], "out-of-protocol", False),
        (lambda i: [frame(["call", i, "f", [], {}])], "out-of-protocol", False),
        (lambda i: [frame(["event", i, "t", "t", None])], "out-of-protocol", False),
        (lambda i: [frame(["load", "d", {}])], "out-of-protocol", False),
        (lambda i: [frame(["ready", []])], "out-of-protocol", False),
        (lambda i: [frame(["hardened", {}])], "out-of-protocol", False),
        # An error map that is not `to_wire()` data.
        (lambda i: [frame(["failure", i, {"code": 7, "message": "m"}])], "malformed-error", False),
        (lambda i: [frame(["failure", i, {"message": "m"}])], "malformed-error", False),
    ],
    ids=[
        "result-unknown-id",
        "failure-unknown-id",
        "answered-twice",
        "hostcall-after-result",
        "log-after-result",
        "hostcall-id-collision",
        "hostreply",
        "hostfailure",
        "call",
        "event",
        "load",
        "second-ready",
        "second-hardening-report",
        "error-code-not-str",
        "error-without-code",
    ],
)
async def test_messages_out_of_protocol_order_end_the_worker(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    other: VmSandbox,
    case: tuple[Frames, str, bool],
) -> None:
    frames, why, answered = case
    sb = await _escaped(tmp_path, monkeypatch, RAW)
    async with sb:
        call = asyncio.ensure_future(sb.call("send", frames(_next_id(sb))))
        if answered:  # the call itself got its answer; what followed ended the worker
            assert await asyncio.wait_for(call, HANG) == 1
            for _ in range(500):
                if sb.state == "crashed":
                    break
                await asyncio.sleep(0.01)
            call = asyncio.ensure_future(sb.call("send", []))
            err = await _coded_end(sb, call, other)
            assert err.details["why"] == "earlier-crash"
            assert isinstance(err.cause, SuaveplanError)
            err = err.cause
        else:
            err = await _coded_end(sb, call, other)
    assert err.code == "SAND_VM_WORKER_CRASHED"
    assert err.details["why"] == why


async def test_an_answer_while_its_host_call_runs_ends_the_worker_and_the_adapter_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, other: VmSandbox
) -> None:
    # Otherwise each job could leave one adapter call running beside the next job's.
    fs = StalledFs()
    sb = await _escaped(tmp_path, monkeypatch, RAW, fs=fs)
    async with sb:
        hostcall = frame(["hostcall", 1, "fs", "read_bytes", {"path": "./data/a"}])
        result = frame(["result", _next_id(sb), "done"])
        err = await _coded_end(sb, sb.call("send", [hostcall, result]), other)
        assert err.details["why"] == "reply-during-hostcall"
        assert fs.started == 1  # the read had started, and was waiting
        for _ in range(10):
            await asyncio.sleep(0)
        assert fs.cancelled == 1  # ending the worker cancelled it


# -- error replies ------------------------------------------------------------------------


def _nested(depth: int) -> object:
    value: object = "leaf"
    for _ in range(depth):
        value = {"k": value}
    return value


@pytest.mark.parametrize("code", ["BUDGET_EXCEEDED", "SAND_FS_NOT_FOUND"])
async def test_a_failure_with_huge_details_and_a_deep_cause_chain_is_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: str
) -> None:
    sb = await _escaped(tmp_path, monkeypatch, RAW)
    async with sb:
        cause: dict[str, object] = {"code": "SAND_VM_DISPOSED", "message": "c"}
        for _ in range(200):
            cause = {"code": "BUDGET_EXCEEDED", "message": "c" * 10_000, "cause": cause}
        error = {
            "code": code,
            "message": "m" * 1_000_000,
            "details": {
                "budget": "wallClockMs",
                "deep": _nested(400),
                "wide": list(range(100_000)),
                **{f"k{i}": i for i in range(10_000)},
            },
            "cause": cause,
        }
        with pytest.raises(SuaveplanError) as info:
            await asyncio.wait_for(sb.call("send", [frame(["failure", _next_id(sb), error])]), HANG)
        err = info.value
        if code == "BUDGET_EXCEEDED":  # host-only: re-coded as the plugin's own error
            assert err.code == "SAND_VM_PLUGIN_ERROR"
            assert err.details["claimed_code"] == "BUDGET_EXCEEDED"
        else:  # a code a worker may relay: kept, but cut to size
            assert err.code == code
            assert len(err.message) <= 4096
            assert len(err.details) <= 64
        assert sb.state == "idle"  # the plugin's error: the worker stays
        depth, link = 0, err.cause
        while link is not None:
            depth, link = depth + 1, link.__cause__
        assert depth < 16
        assert len(msgpack.packb(err.to_wire())) < 2 * 1024 * 1024


# -- slow loris -----------------------------------------------------------------------------


async def test_half_a_frame_then_a_stall_ends_at_the_wall_clock_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, other: VmSandbox
) -> None:
    sb = await _escaped(tmp_path, monkeypatch, RAW, {"wallClockMs": 300})
    async with sb:
        half = frame(["result", _next_id(sb), "x" * 1000])[:500]
        call = asyncio.ensure_future(sb.call("send", [half]))
        # Until the half frame has arrived, or (a worker slower than the budget, on a loaded
        # machine) the budget ended the call first: an unbounded wait would hang there.
        while not sb._decoder.buffered and not call.done():
            assert await other.call("f") == 2  # and the loop serves others meanwhile
            await asyncio.sleep(0.01)
        err = await _coded_end(sb, call, other)
    assert err.code == "BUDGET_EXCEEDED"
    assert err.details["budget"] == "wallClockMs"


async def test_a_worker_stalling_before_it_is_ready_is_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, other: VmSandbox
) -> None:
    monkeypatch.setattr(vm_sandbox_module, "START_GRACE_S", 0.2)
    source = STARTUP.format(frame=frame(["ready", []])[:6])
    spawned: list[int] = []
    original = vm_sandbox_module.VmSandbox.dispose

    async def spy(self: VmSandbox) -> None:
        spawned.append(self.pid)
        await original(self)

    monkeypatch.setattr(vm_sandbox_module.VmSandbox, "dispose", spy)
    with pytest.raises(SuaveplanError) as info:
        await asyncio.wait_for(_escaped(tmp_path, monkeypatch, source, {"wallClockMs": 100}), HANG)
    assert info.value.code == "SAND_VM_WORKER_CRASHED"
    assert info.value.details["why"] == "start-timeout"
    assert spawned
    await _assert_killed(spawned[0])
    assert await other.call("f") == 2


@pytest.mark.parametrize(
    "case",
    [
        (
            frame(["ready", {"active": 5}, []]),
            "SAND_VM_WORKER_CRASHED",
            ("why", "wire:wrong-field-count"),
        ),
        # The worker reported its hardening before the plugin's module code ran; a second
        # report, from plugin code, is out of protocol rather than believed.
        (frame(["hardened", {}]), "SAND_VM_WORKER_CRASHED", ("why", "out-of-protocol")),
        (
            frame(
                [
                    "failure",
                    0,
                    {"code": "SAND_VM_HARDENING_UNAVAILABLE", "message": "m", "details": {}},
                ]
            ),
            "SAND_VM_PLUGIN_ERROR",
            ("claimed_code", "SAND_VM_HARDENING_UNAVAILABLE"),
        ),
        (
            frame(["failure", 0, {"code": "BUDGET_EXCEEDED", "message": "m", "details": {}}]),
            "SAND_VM_PLUGIN_ERROR",
            ("claimed_code", "BUDGET_EXCEEDED"),
        ),
        (
            frame(["failure", 0, {"code": "SAND_PERM_DENIED", "message": "m", "details": {}}]),
            "SAND_VM_PLUGIN_ERROR",
            ("claimed_code", "SAND_PERM_DENIED"),
        ),
    ],
    ids=[
        "malformed-ready",
        "second-hardening-report",
        "forged-missing-layer",
        "forged-budget",
        "forged-denial",
    ],
)
async def test_a_forged_startup_gets_the_caller_a_coded_error(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    other: VmSandbox,
    case: tuple[bytes, str, tuple[str, str]],
) -> None:
    startup, code, detail = case
    with pytest.raises(SuaveplanError) as info:
        await asyncio.wait_for(_escaped(tmp_path, monkeypatch, STARTUP.format(frame=startup)), HANG)
    assert info.value.code == code
    assert info.value.details[detail[0]] == detail[1]
    assert await other.call("f") == 2


async def test_many_hostile_workers_in_a_row_leave_the_host_serving(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, other: VmSandbox
) -> None:
    # Every sandbox ends its own way; the host's fds and the fork server are not used up.
    before = psutil.Process().num_fds()
    for i in range(12):
        sb = await _escaped(tmp_path, monkeypatch, RAW)
        async with sb:
            bad = [b"\xff\xff\xff\xff", frame(["nope"]), frame(["result", 99, 1])][i % 3]
            with pytest.raises(SuaveplanError):
                await asyncio.wait_for(sb.call("send", [bad]), HANG)
    assert await other.call("f") == 2
    assert psutil.Process().num_fds() <= before + 4
