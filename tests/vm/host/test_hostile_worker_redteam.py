"""A worker that escaped the interpreter, red-teaming the host: what it sends must cost the
host bounded loop time and no resources it keeps.

These play the hostile worker with the helpers of `test_hostile_worker_frames` (a plugin run
without the in-interpreter layer that writes raw frames to its IPC socket). Each case ends in
a coded error or a bounded answer, and the host serves a fresh sandbox afterwards.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

import psutil
import pytest
from test_hostile_worker_frames import HANG, RAW_PRELUDE, _coded_end, _escaped, _next_id, frame
from test_hostile_worker_frames import other as other_fixture

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.errors._error import MAX_WIRE_ERROR_TEXT
from suaveplan_sandbox.errors._redact import REDACTED
from suaveplan_sandbox.vm import VmSandbox
from suaveplan_sandbox.vm import _sandbox as vm_sandbox_module
from suaveplan_sandbox.vm._worker_loop import AdaptivePoll

# A second, honest sandbox on the same loop: it must keep answering.
other = other_fixture
T = TypeVar("T")

HOSTILE = (
    RAW_PRELUDE
    + r"""
import socket

import msgpack


def _frame(obj):
    body = msgpack.packb(obj, use_bin_type=True)
    return len(body).to_bytes(4, "big") + body


def ambush(my_id, unit, count, seconds):
    # Answer this call itself, wait for the host's next one and flood it with frames from
    # the moment it arrives, faster than the host decodes them: the host's socket is never
    # empty. Then answer that call too.
    fd = _fd()
    _write(fd, _frame(["result", my_id, "armed"]))
    os.read(fd, 1 << 20)
    blob = unit * count
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        _write(fd, blob)
    _write(fd, _frame(["result", my_id + 1, "flooded"]))
    time.sleep(3600)


def fail_big(call_id, text, keys, items):
    # An error whose every field is within its own cut (4 KiB strings, 64 items a level),
    # 16 MiB in all.
    details = {f"k{i}": [text] * items for i in range(keys)}
    error = {"code": "SAND_FS_NOT_FOUND", "message": text, "details": details}
    _write(_fd(), _frame(["failure", call_id, error]))
    time.sleep(3600)


def pass_fds(rounds):
    # Log lines carrying SCM_RIGHTS copies of a new pipe's ends (a socket of its own the
    # kernel refuses: ETOOMANYREFS).
    fd = _fd()
    sock = socket.socket(fileno=os.dup(fd))
    r, w = os.pipe()
    line = _frame(["log", "debug", "fd"])
    for _ in range(rounds):
        socket.send_fds(sock, [line], [r, w])
    return rounds
"""
)


async def _max_gap(work: Awaitable[T]) -> tuple[T, float]:
    """`work`'s outcome, and the longest the loop went without running a second task."""
    gaps: list[float] = [0.0]
    done = False

    async def ticker() -> None:
        last = time.monotonic()
        while not done:
            await asyncio.sleep(0)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    tick = asyncio.ensure_future(ticker())
    await asyncio.sleep(0)
    try:
        outcome = await work
    finally:
        done = True
        await tick
    return outcome, max(gaps)


async def test_a_worker_keeping_its_socket_full_cannot_hold_the_loop_past_its_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, other: VmSandbox
) -> None:
    # The inline wait's polling read looks at the clock only when nothing came, so a worker
    # whose frames never stopped held the loop (and the wall-clock timer) until it chose to
    # answer: 3 s here, any time at all in general. Every window is widened, as in
    # test_inline_wait, so that only the wait's own MAX_HOLD_MS bound can end it.
    monkeypatch.setattr(vm_sandbox_module, "INLINE_WAIT_US", 10_000_000)
    sb = await _escaped(tmp_path, monkeypatch, HOSTILE, {"wallClockMs": 300})
    sb._poll = AdaptivePoll(10.0)
    async with sb:
        armed = sb.call("ambush", _next_id(sb), frame(["log", "debug", "x"]), 4096, 3.0)
        assert await asyncio.wait_for(armed, HANG) == "armed"
        err, gap = await _max_gap(_coded_end(sb, sb.call("next"), other))
    assert err.code == "BUDGET_EXCEEDED"
    assert err.details["budget"] == "wallClockMs"
    assert gap < 1.0, gap  # a chunk of frames at a time, never the whole flood


async def test_a_huge_failure_costs_the_redactor_a_bounded_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, other: VmSandbox
) -> None:
    # With a credential to keep out of diagnostics, every character of a worker's error is
    # scrubbed on the loop; a text that keeps matching most of a 64-character value made a
    # 16 MiB error cost seconds. The error the caller gets is cut to MAX_WIRE_ERROR_TEXT.
    credential = ("ab" * 32)[:-1] + "Z"
    sb = await _escaped(tmp_path, monkeypatch, HOSTILE, redact=[credential])
    async with sb:
        text = "ab" * 2000 + credential

        async def failed() -> SuaveplanError:
            with pytest.raises(SuaveplanError) as info:
                await asyncio.wait_for(sb.call("fail_big", _next_id(sb), text, 63, 63), HANG)
            return info.value

        err, gap = await _max_gap(failed())
        assert err.code == "SAND_FS_NOT_FOUND"
        assert err.message.endswith(REDACTED)
        wire = repr(err.to_wire())
        assert credential not in wire
        assert len(wire) < 2 * MAX_WIRE_ERROR_TEXT
        assert sb.state == "idle"  # the plugin's own error: the worker stays
    assert gap < 1.0, gap  # seconds before the cut (5 s on a 2-core machine)
    assert await other.call("f") == 2


async def test_fds_a_worker_passes_over_its_socket_are_not_kept_by_the_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, other: VmSandbox
) -> None:
    # The host reads with recv, never recvmsg: the kernel closes any SCM_RIGHTS fds instead
    # of installing them in the host.
    before = psutil.Process().num_fds()
    sb = await _escaped(tmp_path, monkeypatch, HOSTILE)
    async with sb:
        assert await asyncio.wait_for(sb.call("pass_fds", 10), HANG) == 10
        assert psutil.Process().num_fds() <= before + 8
    assert psutil.Process().num_fds() <= before + 4
    assert await other.call("f") == 2
