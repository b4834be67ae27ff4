"""Frame codec: round trips, chunking, and hostile bytes that only ever raise the coded error."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from suaveplan_sandbox.errors import SuaveplanError
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
    encode_fields,
)
from suaveplan_sandbox.protocol._messages import FIELD_NAMES

plain = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
ids = st.integers(min_value=0, max_value=2**63 - 1)
names = st.text(min_size=1, max_size=30)
maps = st.dictionaries(st.text(max_size=8), plain, max_size=4)

messages: st.SearchStrategy[Message] = st.one_of(
    st.builds(Call, id=ids, name=names, args=st.lists(plain, max_size=4), kwargs=maps),
    st.builds(Result, id=ids, value=plain),
    st.builds(Failure, id=ids, error=maps),
    st.builds(HostCall, id=ids, capability=names, operation=names, args=maps),
    st.builds(HostReply, id=ids, value=plain),
    st.builds(HostFailure, id=ids, error=maps),
    st.builds(Log, level=st.sampled_from(["debug", "info", "warning", "error"]), text=st.text()),
    st.builds(Hardened, hardening=maps),
    st.builds(Ready, subscriptions=st.lists(names, max_size=3)),
    st.builds(Event, id=ids, topic=names, subscription=names, payload=plain),
    st.builds(Load, digest=names, bundle=maps),
)


def drain(decoder: FrameDecoder) -> list[Message]:
    out: list[Message] = []
    while (msg := decoder.next_message()) is not NEED_DATA:
        assert isinstance(msg, Message)
        out.append(msg)
    return out


@given(messages)
def test_every_message_round_trips(msg: Message) -> None:
    decoder = FrameDecoder()
    decoder.receive_data(encode(msg))
    assert drain(decoder) == [msg]


@given(st.lists(messages, max_size=6), st.lists(st.integers(1, 64), min_size=1))
def test_split_and_merged_chunks_decode_to_the_same_messages(
    msgs: list[Message], cuts: list[int]
) -> None:
    stream = b"".join(encode(m) for m in msgs)
    decoder = FrameDecoder()
    out: list[Message] = []
    pos = 0
    i = 0
    while pos < len(stream):
        step = cuts[i % len(cuts)]
        decoder.receive_data(stream[pos : pos + step])
        pos += step
        i += 1
        out.extend(drain(decoder))
    assert out == msgs


@given(st.binary(max_size=512))
def test_arbitrary_bytes_raise_only_the_coded_wire_error(data: bytes) -> None:
    decoder = FrameDecoder(max_frame_bytes=256)
    try:
        decoder.receive_data(data)
        drain(decoder)
    except SuaveplanError as exc:
        assert isinstance(exc, ProtocolError)
        assert exc.code == "SAND_WIRE_ERROR"


@given(st.binary(max_size=200))
def test_arbitrary_framed_bodies_raise_only_the_coded_wire_error(body: bytes) -> None:
    decoder = FrameDecoder()
    decoder.receive_data(len(body).to_bytes(4, "big") + body)
    try:
        drain(decoder)
    except SuaveplanError as exc:
        assert exc.code == "SAND_WIRE_ERROR"


def frame(obj: object) -> bytes:
    body: bytes = msgpack.packb(obj, use_bin_type=True)
    return len(body).to_bytes(4, "big") + body


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (frame(["nope", 1]), "unknown-message-type"),
        (frame({"type": "call"}), "not-a-message"),
        (frame(["result", 1]), "wrong-field-count"),
        (frame(["result", -1, None]), "invalid-field"),
        (frame(["call", 1, "", [], {}]), "invalid-field"),
        (frame(["call", 1, "f", [], {1: 2}]), "undecodable"),
        (frame(["log", "shout", "x"]), "invalid-field"),
        (frame(["result", 1, msgpack.ExtType(1, b"x")]), "undecodable"),
        (b"\x00\x00\x00\x02\xc1\xc1", "undecodable"),
        (b"\x7f\xff\xff\xff", "frame-too-large"),
    ],
)
def test_malformed_frames_are_rejected_with_a_reason(raw: bytes, reason: str) -> None:
    decoder = FrameDecoder(max_frame_bytes=1024)
    decoder.receive_data(raw)
    with pytest.raises(ProtocolError) as info:
        decoder.next_message()
    assert info.value.details["reason"] == reason


def test_decoder_stays_broken_after_a_bad_frame() -> None:
    decoder = FrameDecoder(max_frame_bytes=8)
    decoder.receive_data(b"\x00\x00\x01\x00")
    with pytest.raises(ProtocolError):
        decoder.next_message()
    with pytest.raises(ProtocolError):
        decoder.receive_data(encode(Result(id=1, value=None)))


def test_oversized_message_is_refused_when_encoding() -> None:
    with pytest.raises(ProtocolError) as info:
        encode(Result(id=1, value="x" * 100), max_frame_bytes=50)
    assert info.value.details["reason"] == "frame-too-large"


def test_unencodable_value_is_refused_when_encoding() -> None:
    with pytest.raises(ProtocolError) as info:
        encode(Result(id=1, value=object()))
    assert info.value.details["reason"] == "unencodable"


def test_messages_validate_on_construction() -> None:
    with pytest.raises(ValueError):
        Call(id=True, name="f", args=[], kwargs={})
    with pytest.raises(ValueError):
        HostCall(id=1, capability="", operation="read", args={})


def test_partial_frame_needs_data() -> None:
    decoder = FrameDecoder()
    data = encode(Result(id=7, value=[1, 2]))
    decoder.receive_data(data[:-1])
    assert decoder.next_message() is NEED_DATA
    decoder.receive_data(data[-1:])
    assert decoder.next_message() == Result(id=7, value=[1, 2])


@pytest.mark.parametrize("size", [10, 64 * 1024 - 16, 64 * 1024 + 16, 200_000])
def test_bytes_after_the_message_inside_a_body_are_undecodable(size: int) -> None:
    # Small bodies go through the decoder's streaming unpacker, large ones through unpackb:
    # both must refuse a body holding more than one object.
    one: bytes = msgpack.packb(["hostreply", 1, b"x" * size], use_bin_type=True)
    body = one + msgpack.packb(None)
    decoder = FrameDecoder()
    decoder.receive_data(len(body).to_bytes(4, "big") + body)
    with pytest.raises(ProtocolError) as info:
        decoder.next_message()
    assert info.value.details["reason"] == "undecodable"


def test_a_body_that_stops_inside_its_message_is_undecodable() -> None:
    body: bytes = msgpack.packb(["hostreply", 1, b"xyz"], use_bin_type=True)[:-1]
    decoder = FrameDecoder()
    decoder.receive_data(len(body).to_bytes(4, "big") + body)
    with pytest.raises(ProtocolError) as info:
        decoder.next_message()
    assert info.value.details["reason"] == "undecodable"


def test_small_and_large_frames_interleave_over_a_long_stream() -> None:
    msgs = [HostReply(id=i, value=b"y" * (100_000 if i % 7 == 0 else i)) for i in range(1, 300)]
    decoder = FrameDecoder()
    out: list[Message] = []
    for msg in msgs:
        decoder.receive_data(encode(msg))
        out.extend(drain(decoder))
    assert out == msgs


# `encode_fields` is `encode(cls(...))` without the message object: the same bytes for what
# the constructor accepts, the same refusal for what it refuses.
@given(messages)
def test_encode_fields_gives_the_same_bytes_as_encoding_the_message(msg: Message) -> None:
    fields = [getattr(msg, name) for name in FIELD_NAMES[type(msg)]]
    assert encode_fields(type(msg), *fields) == encode(msg)


@pytest.mark.parametrize(
    ("cls", "fields"),
    [
        (Call, (True, "f", [], {})),
        (Call, (1, "", [], {})),
        (Call, (1, "f" * 257, [], {})),
        (Call, (1, "f", (), {})),
        (Call, (1, "f", [], {1: 2})),
        (Result, (-1, None)),
        (Result, (2**63, None)),
        (HostCall, (1, "fs", "", {})),
    ],
)
def test_encode_fields_refuses_what_the_constructor_refuses(
    cls: type[Message], fields: tuple[object, ...]
) -> None:
    with pytest.raises(ValueError) as by_constructor:
        cls(**dict(zip(FIELD_NAMES[cls], fields, strict=True)))
    with pytest.raises(ValueError) as by_fields:
        encode_fields(cls, *fields)
    assert str(by_fields.value) == str(by_constructor.value)


def test_encode_fields_with_a_wrong_field_count_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        encode_fields(Result, 1)
    with pytest.raises(TypeError):
        encode_fields(Result, 1, None, None)


def test_encode_fields_applies_the_limits_of_encode() -> None:
    with pytest.raises(ProtocolError) as info:
        encode_fields(Result, 1, "x" * 100, max_frame_bytes=50)
    assert info.value.details["reason"] == "frame-too-large"
    with pytest.raises(ProtocolError) as info:
        encode_fields(Result, 1, object())
    assert info.value.details["reason"] == "unencodable"


def test_encode_fields_refuses_a_class_outside_the_protocol() -> None:
    with pytest.raises(ProtocolError) as info:
        encode_fields(Message)
    assert info.value.details["reason"] == "unknown-message-type"
