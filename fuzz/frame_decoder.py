"""Fuzz target: the sans-IO frame decoder (`protocol.FrameDecoder`).

Input layout: byte 0 seeds the chunk boundaries, byte 1 picks the frame size limit, the rest
is what a hostile worker writes on its socket. Properties checked for every input:

* feeding the bytes in arbitrary chunks yields messages or `ProtocolError` with the
  registered code `SAND_WIRE_ERROR`, never another exception;
* after an error the decoder is terminal (every further call raises `SAND_WIRE_ERROR`);
* the outcome does not depend on the chunk boundaries (no desync: the same bytes in one
  piece give the same messages and the same error);
* every decoded message re-encodes and decodes to itself, and an error map in a `Failure`
  or `HostFailure` rebuilds into a coded error without raising;
* the decoder never holds more than one frame's worth of bytes after it has been drained.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from typing import Final

import atheris

with atheris.instrument_imports(include=["suaveplan_sandbox", "msgpack"]):
    from suaveplan_sandbox.errors import SuaveplanError, error_from_wire
    from suaveplan_sandbox.protocol import (
        NEED_DATA,
        Call,
        Event,
        Failure,
        FrameDecoder,
        Hardened,
        HostCall,
        HostFailure,
        HostReply,
        Load,
        Log,
        Message,
        ProtocolError,
        Ready,
        Result,
        encode,
    )
    from suaveplan_sandbox.protocol._messages import FIELD_NAMES

from fuzz._target import Finding, require_coded, run_target, vector_cases

LIMITS: Final = (64, 256, 1024, 4096, 65536)
_PREFIX: Final = 4

Outcome = tuple[list[bytes], str | None]


def _drain(decoder: FrameDecoder, limit: int, out: list[bytes]) -> str | None:
    """Pull messages until NEED_DATA; the error reason if the stream broke."""
    while True:
        try:
            msg = decoder.next_message()
        except ProtocolError as exc:
            require_coded(exc, "SAND_WIRE_ERROR")
            return str(exc.details.get("reason"))
        if msg is NEED_DATA:
            if decoder.buffered >= _PREFIX + limit:
                raise Finding(f"decoder holds {decoder.buffered} bytes with limit {limit}")
            return None
        if not isinstance(msg, Message):
            raise Finding(f"decoder returned {type(msg).__name__}")
        out.append(_check_message(msg, limit))


def _check_message(msg: Message, limit: int) -> bytes:
    frame = encode(msg, max_frame_bytes=limit)
    again = FrameDecoder(max_frame_bytes=limit)
    again.receive_data(frame)
    back = again.next_message()
    if back is NEED_DATA or encode(back, max_frame_bytes=limit) != frame:
        raise Finding("a decoded message does not survive a re-encode")
    if isinstance(msg, Failure | HostFailure):
        rebuilt = error_from_wire(msg.error)
        if not isinstance(rebuilt, SuaveplanError):
            raise Finding("error_from_wire returned a non-error")
    return frame


def _assert_terminal(decoder: FrameDecoder) -> None:
    for poke in (lambda: decoder.receive_data(b"\x00"), decoder.next_message):
        try:
            poke()
        except ProtocolError as exc:
            require_coded(exc, "SAND_WIRE_ERROR")
        else:
            raise Finding("a broken decoder accepted more input")


def _decode(stream: bytes, limit: int, chunks: Iterator[bytes]) -> Outcome:
    decoder = FrameDecoder(max_frame_bytes=limit)
    out: list[bytes] = []
    for chunk in chunks:
        decoder.receive_data(chunk)
        reason = _drain(decoder, limit, out)
        if reason is not None:
            _assert_terminal(decoder)
            return out, reason
    return out, None


def _random_chunks(stream: bytes, seed: int) -> Iterator[bytes]:
    rng = random.Random(seed)  # noqa: S311 — chunk boundaries, not secrets
    pos = 0
    while pos < len(stream):
        step = rng.choice((1, 2, 3, 4, 5, 7, 16, 64, 1000))
        yield stream[pos : pos + step]
        pos += step


def test_one_input(data: bytes) -> None:
    if len(data) < 2:
        return
    limit = LIMITS[data[1] % len(LIMITS)]
    stream = data[2:]
    chunked = _decode(stream, limit, _random_chunks(stream, data[0]))
    whole = _decode(stream, limit, iter((stream,)))
    if chunked != whole:
        raise Finding(f"chunking changed the outcome: {chunked[1]!r} vs {whole[1]!r}")


def _sample_messages() -> Iterator[Message]:
    yield Load(digest="d" * 64, bundle={"entry": "plugin.py", "files": {"plugin.py": "x = 1"}})
    yield Hardened(hardening={"landlock": True, "seccomp": "strict"})
    yield Ready(subscriptions=["payment.*"])
    yield Call(id=1, name="run", args=[1, "a", None, 1.5, b"\x00"], kwargs={"k": [True]})
    yield Result(id=1, value={"ok": [1, 2, {"n": None}]})
    wire = SuaveplanError("SAND_PERM_DENIED", "denied", {"capability": "fs"}).to_wire()
    yield Failure(id=2, error=dict(wire))
    yield HostFailure(id=3, error={"code": "NOPE", "message": "m", "cause": {"code": 1}})
    yield HostReply(id=3, value="v")
    yield Log(level="info", text="hello")
    # Fields by name from the codec's own table, so the seeds follow message changes.
    defaults = {"id": 8, "topic": "invoice.created", "subscription": "invoice.*", "payload": 7}
    yield Event(**{n: defaults[n] for n in FIELD_NAMES[Event]})  # type: ignore[arg-type]
    for case in vector_cases("paths")[:40]:
        yield HostCall(id=4, capability="fs", operation="read", args={"path": case["input"]})
    for case in vector_cases("urls")[:40]:
        yield HostCall(id=5, capability="fetch", operation="get", args={"url": case["input"]})
    for case in vector_cases("sql")[:40]:
        yield HostCall(id=6, capability="db", operation="query", args={"sql": case["sql"]})


def seeds() -> Iterator[bytes]:
    frames = [encode(m) for m in _sample_messages()]
    for i, frame in enumerate(frames):
        yield bytes([i % 256, 4]) + frame
    yield bytes([7, 3]) + b"".join(frames[:9])
    yield bytes([1, 0]) + frames[3] + b"\xff\xff\xff\xff"
    yield bytes([2, 2]) + frames[2][:-1]


if __name__ == "__main__":
    run_target(test_one_input, seeds)
    sys.exit(0)
