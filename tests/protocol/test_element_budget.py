"""`FrameDecoder(max_elements=...)`: what a frame decodes to is bounded, not only its bytes.

Each msgpack byte can be a Python object (`0x90` is an empty list: 56 bytes plus its slot),
so a frame within the byte limit could decode to some 70 times its size. With an element
limit the decoder refuses such a frame as soon as the count passes it, and decodes every
frame within it exactly as an unlimited decoder does.
"""

from __future__ import annotations

import tracemalloc

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from suaveplan_sandbox.protocol import (
    NEED_DATA,
    FrameDecoder,
    HostReply,
    Message,
    ProtocolError,
    Result,
    encode,
)

SMALL_BODY = 64 * 1024


def _frame(body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + body


def _nested_empty_lists(size: int) -> bytes:
    """`["result", 1, [[[] * 100] * n]]` filling about `size` bytes: no array is long."""
    inner = b"\xdc\x00\x64" + b"\x90" * 100
    count = size // len(inner)
    return b"\x93\xa6result\x01\xdd" + count.to_bytes(4, "big") + inner * count


def _decode(decoder: FrameDecoder, frame: bytes) -> Message:
    decoder.receive_data(frame)
    msg = decoder.next_message()
    assert msg is not NEED_DATA
    assert isinstance(msg, Message)
    return msg


def _peak(decoder: FrameDecoder, frame: bytes) -> tuple[int, object]:
    """Bytes allocated at the peak while decoding `frame`, and what came out."""
    decoder.receive_data(frame)
    tracemalloc.start()
    try:
        try:
            out: object = decoder.next_message()
        except ProtocolError as exc:
            out = exc
        return tracemalloc.get_traced_memory()[1], out
    finally:
        tracemalloc.stop()


def test_a_frame_of_empty_lists_is_refused_before_it_is_built() -> None:
    frame = _frame(_nested_empty_lists(1024 * 1024))
    unlimited, value = _peak(FrameDecoder(), frame)
    assert isinstance(value, Result)  # without a limit: a million lists
    assert unlimited > 40 * len(frame)
    limited, refused = _peak(FrameDecoder(max_elements=SMALL_BODY), frame)
    assert isinstance(refused, ProtocolError)
    assert refused.details["reason"] == "too-many-elements"
    assert limited < 4 * len(frame)


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        (b"\xdd", "undecodable"),  # one array announcing more items than the limit
        (b"\xdf", "undecodable"),  # one map announcing more entries than the limit allows
    ],
)
def test_one_container_announcing_more_than_the_limit_is_refused_at_its_header(
    header: bytes, reason: str
) -> None:
    count = 200_000
    body = b"\x93\xa6result\x01" + header + count.to_bytes(4, "big") + b"\xc0" * (2 * count)
    decoder = FrameDecoder(max_elements=SMALL_BODY)
    decoder.receive_data(_frame(body))
    with pytest.raises(ProtocolError) as info:
        decoder.next_message()
    assert info.value.details["reason"] == reason
    assert "exceeds max_" in str(info.value.cause)


def test_large_bytes_and_strings_are_one_element_each() -> None:
    decoder = FrameDecoder(max_elements=SMALL_BODY)
    msg = HostReply(id=1, value=[b"x" * 4_000_000, "y" * 4_000_000])
    assert _decode(decoder, encode(msg)) == msg


def test_the_limit_is_at_least_what_a_small_body_can_hold() -> None:
    # A body of up to 64 KiB is decoded uncounted: it holds at most that many elements.
    with pytest.raises(ValueError, match="max_elements"):
        FrameDecoder(max_elements=SMALL_BODY - 1)
    FrameDecoder(max_elements=SMALL_BODY)


def _elements(value: object) -> int:
    """The decoder's count: an array is one plus its items, a map one plus keys and values
    (an item that is itself a container also counts its own)."""
    if isinstance(value, list):
        return 1 + len(value) + sum(_elements(v) for v in value)
    if isinstance(value, dict):
        return 1 + 2 * len(value) + sum(_elements(v) for v in value.values())
    return 0


@st.composite
def large_values(draw: st.DrawFn) -> object:
    """A value whose frame is over 64 KiB (the counted path), with a drawn shape."""
    rows = draw(st.integers(min_value=1, max_value=3000))
    width = draw(st.integers(min_value=0, max_value=40))
    leaf = draw(st.sampled_from([None, 7, 1.5, "ab", b"", True]))
    as_map = draw(st.booleans())
    row: object = {f"c{i}": leaf for i in range(width)} if as_map else [leaf] * width
    blob = b"z" * draw(st.integers(min_value=SMALL_BODY, max_value=2 * SMALL_BODY))
    return {
        "rows": [row] * rows,
        "blob": blob,
        "tail": draw(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=5)),
    }


@settings(max_examples=40, deadline=None)
@given(large_values(), st.integers(min_value=0, max_value=300_000))
def test_within_the_limit_nothing_changes_and_past_it_the_frame_is_refused(
    value: object, limit_over_small: int
) -> None:
    limit = SMALL_BODY + limit_over_small
    frame = encode(HostReply(id=3, value=value))
    assert len(frame) > SMALL_BODY + 4
    count = _elements(["hostreply", 3, value])
    limited = FrameDecoder(max_elements=limit)
    limited.receive_data(frame)
    if count <= limit:
        assert limited.next_message() == HostReply(id=3, value=value)
        return
    with pytest.raises(ProtocolError) as info:
        limited.next_message()
    assert info.value.code == "SAND_WIRE_ERROR"
    assert info.value.details["reason"] in {"too-many-elements", "undecodable"}
    with pytest.raises(ProtocolError):  # terminal
        limited.next_message()


def test_an_unlimited_decoder_reads_the_same_frames_as_before() -> None:
    value: list[list[object]] = [[]] * 300_000
    frame = encode(HostReply(id=1, value=value))
    assert _decode(FrameDecoder(), frame) == HostReply(id=1, value=value)
    with pytest.raises(ProtocolError):
        _decode(FrameDecoder(max_elements=SMALL_BODY), frame)


def test_the_limit_is_exact_for_maps_nested_in_lists_and_lists_in_maps() -> None:
    message = ["hostreply", 1, [{"k": [None, [], {}]}] * 30_000 + [b"p" * SMALL_BODY]]
    body = msgpack.packb(message)
    count = _elements(message)
    assert len(body) > SMALL_BODY
    assert count == 1 + 3 + 1 + 30_001 + 30_000 * (1 + 2 + 1 + 3 + 1 + 1)
    refused = FrameDecoder(max_elements=count - 1)
    refused.receive_data(_frame(body))
    with pytest.raises(ProtocolError) as info:
        refused.next_message()
    assert info.value.details["reason"] == "too-many-elements"
    msg = _decode(FrameDecoder(max_elements=count), _frame(body))
    assert isinstance(msg, HostReply)
