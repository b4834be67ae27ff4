"""The cross-process event message: the hop depth travels with the payload, and whatever a
stranger publishes on the channel is read as a well-formed event or refused with ValueError."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from suaveplan_sandbox.adapters._event_envelope import LEGACY_DEPTH, read_event, write_event
from suaveplan_sandbox.adapters._events import MAX_EVENT_DEPTH, decode_payload
from suaveplan_sandbox.errors import SuaveplanError

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
HEADER = b"suaveplan-event/1 depth="


@given(depth=st.integers(0, MAX_EVENT_DEPTH), payload=JSON)
def test_an_event_reads_back_as_its_depth_and_payload(depth: int, payload: object) -> None:
    assert read_event(write_event(depth, payload).encode()) == (depth, payload)


def test_a_depth_outside_the_range_is_written_as_the_nearest_bound() -> None:
    assert read_event(write_event(-5, 1)) == (0, 1)
    assert read_event(write_event(10**30, 1)) == (MAX_EVENT_DEPTH, 1)


def test_a_payload_that_is_not_strict_json_is_refused_at_write() -> None:
    with pytest.raises(SuaveplanError) as info:
        write_event(0, b"raw bytes")
    assert info.value.code == "SAND_INVALID_ARGUMENT"


def test_a_message_in_the_earlier_format_is_read_as_the_last_hop() -> None:
    # The earlier format was the bare payload: no depth, so the most it may cause is nothing.
    assert LEGACY_DEPTH == MAX_EVENT_DEPTH - 1
    assert read_event(b'{"id":1}') == (LEGACY_DEPTH, {"id": 1})
    assert read_event("[1,2]") == (LEGACY_DEPTH, [1, 2])


def test_a_subscriber_on_the_earlier_format_refuses_a_new_message_instead_of_misreading_it() -> (
    None
):
    # Such a subscriber parsed the whole message as the payload: a header line is not JSON.
    with pytest.raises(ValueError):
        decode_payload(write_event(0, {"id": 1}))


def test_a_depth_past_the_limit_is_read_as_the_limit() -> None:
    assert read_event(HEADER + b"9\n1") == (MAX_EVENT_DEPTH, 1)
    assert read_event(HEADER + b"999999999999999999\n1") == (MAX_EVENT_DEPTH, 1)


@pytest.mark.parametrize(
    "data",
    [
        HEADER + b"-1\n1",  # negative
        HEADER + b"+1\n1",  # signed
        HEADER + b"01\n1",  # leading zero
        HEADER + b"\n1",  # empty
        HEADER + b"1 \n1",  # trailing space
        HEADER + b"1.0\n1",  # not an integer
        HEADER + b"0x1\n1",
        HEADER + "\u0661".encode() + b"\n1",  # an Arabic-Indic digit: str.isdigit() would take it
        HEADER + b"1" * 19 + b"\n1",  # huge: more digits than a depth has
        HEADER + b"1",  # no end of header
        HEADER + b"1\n",  # no payload
        HEADER + b"1\nnot json",
        HEADER + b"1\nNaN",
        HEADER + b"1\n" + b"[" * 100_000 + b"]" * 100_000,  # deeper than the stack
        b"suaveplan-event/2 depth=0\n1",  # a version this reader does not know
        b"\x80not json",
        b"cos\nsystem\n(S'id'\ntR.",  # a pickle is just bytes
        b"[" * 100_000,
        b"",
        "\ud800",  # a str with a lone surrogate
        None,
        42,
        [b"1"],
    ],
)
def test_a_malformed_message_is_a_value_error(data: object) -> None:
    with pytest.raises(ValueError):
        read_event(data)


@given(st.binary(max_size=64) | st.binary(max_size=40).map(lambda b: HEADER + b))
def test_any_bytes_read_as_an_event_in_range_or_raise_value_error(data: bytes) -> None:
    try:
        depth, _payload = read_event(data)
    except ValueError:
        return
    assert 0 <= depth <= MAX_EVENT_DEPTH
