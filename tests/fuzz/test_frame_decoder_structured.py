"""Structure-aware fuzzing of the sans-IO frame decoder (hypothesis).

The byte-level atheris target (`fuzz/frame_decoder.py`) mutates bytes; here the inputs are
built the way a hostile worker would build them: real message tags with fields of the wrong
type or range (NaN and bool ids, ids past 2**63, bytes for str, names one past the limit,
control characters), maps with bytes keys, ext types and timestamps, deep nesting, length
prefixes that lie, and the result split at random points. For every input:

* the decoder yields only messages its constructors accept (built again from their fields,
  they compare equal) or raises `ProtocolError` coded `SAND_WIRE_ERROR`, never anything else;
* once it raised, it stays broken;
* how the bytes were split changes nothing;
* after a drain it holds less than one frame, and an element limit is never exceeded.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from suaveplan_sandbox.errors import SuaveplanError, error_from_wire
from suaveplan_sandbox.protocol import (
    MESSAGE_TYPES,
    NEED_DATA,
    Failure,
    FrameDecoder,
    HostFailure,
    Message,
    ProtocolError,
)

LIMIT = 4096
ELEMENTS = 64 * 1024

hostile_ids = st.sampled_from(
    [0, 1, 2**63 - 1, 2**63, 2**64 - 1, -1, -(2**63), True, False, 1.0, math.nan, math.inf]
) | st.integers(min_value=-(2**63), max_value=2**64 - 1)
hostile_strs = st.sampled_from(
    ["", "x" * 256, "x" * 257, "fs", "read_bytes", "info", "\x1b[31m", "a\nb", "\u202e", "..\\"]
) | st.text(max_size=12)
scalars = (
    st.none()
    | st.booleans()
    | hostile_ids
    | st.floats()
    | hostile_strs
    | st.binary(max_size=8)
    | st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=4))
    | st.builds(msgpack.Timestamp, st.integers(0, 2**32 - 1), st.integers(0, 999_999_999))
)
plain = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=4) | st.binary(max_size=4), inner, max_size=4)
    ),
    max_leaves=10,
)


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    """One msgpack body shaped like a message, usually a little wrong."""
    shape = draw(st.sampled_from(["message", "message", "message", "other", "deep"]))
    if shape == "deep":
        depth = draw(st.integers(min_value=1, max_value=3000))
        return b"\x91" * depth + b"\xc0"
    if shape == "other":
        obj: Any = draw(plain)
    else:
        tag = draw(st.sampled_from([*MESSAGE_TYPES, "nope", ""]))
        cls = MESSAGE_TYPES.get(tag)
        names = [f.name for f in dataclasses.fields(cls)] if cls else []
        fields: list[object] = []
        for name in names:
            if name == "id":
                fields.append(draw(hostile_ids))
            elif name in {"name", "capability", "operation", "topic", "subscription", "digest"}:
                fields.append(draw(hostile_strs | st.binary(max_size=4)))
            elif name == "level":
                fields.append(draw(st.sampled_from(["debug", "info", "shout", b"info"])))
            else:
                fields.append(draw(plain))
        extra = draw(st.integers(min_value=-1, max_value=1))
        fields = fields[: max(0, len(fields) + extra)] if extra < 0 else fields + [None] * extra
        obj = [tag, *fields]
    try:
        return msgpack.packb(obj, use_bin_type=True)  # type: ignore[no-any-return]
    except (TypeError, ValueError, OverflowError):
        return b"\xc1"  # never valid msgpack


@st.composite
def streams(draw: st.DrawFn) -> bytes:
    out = bytearray()
    for body in draw(st.lists(bodies(), min_size=1, max_size=4)):
        size = len(body)
        lie = draw(st.sampled_from(["true", "true", "true", "zero", "short", "long", "max"]))
        if lie == "zero":
            size = 0
        elif lie == "short":
            size = max(0, size - draw(st.integers(1, 8)))
        elif lie == "long":
            size += draw(st.integers(1, 8))
        elif lie == "max":
            size = draw(st.sampled_from([LIMIT, LIMIT + 1, 2**31, 2**32 - 1]))
        out += size.to_bytes(4, "big") + body
    if draw(st.booleans()):
        cut = draw(st.integers(min_value=0, max_value=len(out)))
        out = out[:cut]  # EOF mid-frame
    return bytes(out)


def _elements(value: object) -> int:
    if isinstance(value, list):
        return 1 + len(value) + sum(_elements(v) for v in value)
    if isinstance(value, dict):
        return 1 + 2 * len(value) + sum(_elements(v) for v in value.values())
    return 0


_NAMES = {"name", "capability", "operation", "topic", "subscription", "digest"}
_MAPS = {"kwargs", "error", "bundle", "hardening"}


def _spec(name: str, value: object, cls: type[Message]) -> None:
    """The wire rules, written out independently of the codec's own checks."""
    if name == "id":
        assert type(value) is int
        assert 0 <= value < 2**63
    elif name in _NAMES:
        assert type(value) is str
        assert 0 < len(value) <= 256
    elif name in _MAPS or (name == "args" and cls.TYPE == "hostcall"):
        assert type(value) is dict
        assert all(type(k) is str for k in value)
    elif name == "args":
        assert type(value) is list
    elif name == "level":
        assert value in {"debug", "info", "warning", "error"}
    elif name == "text":
        assert type(value) is str
        assert len(value) <= 64 * 1024
    elif name == "subscriptions":
        assert type(value) is list
        for topic in value:
            _spec("topic", topic, cls)


def _check(msg: object) -> Message:
    assert isinstance(msg, Message)
    cls = type(msg)
    values = {f.name: getattr(msg, f.name) for f in dataclasses.fields(cls)}
    for name, value in values.items():
        _spec(name, value, cls)
    assert cls(**values) == msg  # and exactly what the constructor accepts
    fields = [msg.TYPE, *values.values()]
    assert _elements(fields) <= ELEMENTS
    if isinstance(msg, Failure | HostFailure):
        assert isinstance(error_from_wire(msg.error), SuaveplanError)
    return msg


def _run(stream: bytes, cuts: list[int]) -> tuple[list[Message], str | None]:
    decoder = FrameDecoder(max_frame_bytes=LIMIT, max_elements=ELEMENTS)
    out: list[Message] = []
    pos = 0
    chunks = []
    for cut in cuts:
        chunks.append(stream[pos : pos + cut])
        pos += cut
    chunks.append(stream[pos:])
    for chunk in chunks:
        try:
            decoder.receive_data(chunk)
            while (msg := decoder.next_message()) is not NEED_DATA:
                out.append(_check(msg))
        except ProtocolError as exc:
            assert exc.code == "SAND_WIRE_ERROR"
            for poke in (lambda: decoder.receive_data(b"\0"), decoder.next_message):
                try:
                    poke()
                except ProtocolError as again:
                    assert again.details["reason"] == "decoder-broken"
                else:
                    raise AssertionError("a broken decoder accepted more") from None
            return out, str(exc.details["reason"])
        assert decoder.buffered < 4 + LIMIT
    return out, None


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(streams(), st.lists(st.integers(min_value=0, max_value=7), max_size=40))
def test_hostile_structures_only_ever_decode_or_raise_the_coded_error(
    stream: bytes, cuts: list[int]
) -> None:
    whole = _run(stream, [])
    split = _run(stream, cuts)
    byte_by_byte = _run(stream, [1] * len(stream))
    assert split == whole
    assert byte_by_byte == whole


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_mutated_valid_frames_never_escape_the_coded_error(data: st.DataObject) -> None:
    msg_body = data.draw(bodies())
    frame = bytearray(len(msg_body).to_bytes(4, "big") + msg_body)
    for _ in range(data.draw(st.integers(min_value=1, max_value=4))):
        at = data.draw(st.integers(min_value=0, max_value=len(frame) - 1))
        op = data.draw(st.sampled_from(["flip", "insert", "delete"]))
        byte = data.draw(st.integers(0, 255))
        if op == "flip":
            frame[at] = byte
        elif op == "insert":
            frame.insert(at, byte)
        elif len(frame) > 1:
            del frame[at]
    _run(bytes(frame), [])
