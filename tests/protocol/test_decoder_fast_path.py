"""The decoder's fast path (field rules checked directly, no keyword constructor) accepts
exactly what the constructors accept: attacker-side frames for the hot message types."""

from __future__ import annotations

import msgpack
import pytest

from suaveplan_sandbox.protocol import (
    MESSAGE_TYPES,
    FrameDecoder,
    Message,
    ProtocolError,
    encode,
)
from suaveplan_sandbox.protocol._codec import _LISTERS
from suaveplan_sandbox.protocol._messages import CHECKS, FIELD_NAMES


def _frame(obj: object) -> bytes:
    body: bytes = msgpack.packb(obj, use_bin_type=True)
    return len(body).to_bytes(4, "big") + body


def _reason(raw: bytes, limit: int = 1024) -> str:
    decoder = FrameDecoder(max_frame_bytes=limit)
    decoder.receive_data(raw)
    with pytest.raises(ProtocolError) as info:
        decoder.next_message()
    return str(info.value.details["reason"])


@pytest.mark.parametrize(
    "fields",
    [
        ["call", True, "f", [], {}],  # bool is not an id
        ["call", 1.0, "f", [], {}],
        ["call", 2**63, "f", [], {}],
        ["call", 1, "f" * 257, [], {}],
        ["call", 1, b"f", [], {}],
        ["call", 1, "f", {}, {}],
        ["call", 1, "f", [], {b"k": 1}],
        ["result", False, None],
        ["failure", 1, {b"code": "x"}],
        ["failure", 1, ["code"]],
        ["hostcall", 1, "", "read_bytes", {}],
        ["hostcall", 1, "fs", "read_bytes", {b"path": "x"}],
        ["hostcall", 1, "fs", 7, {}],
        ["hostreply", -1, None],
        ["hostfailure", 1, None],
        ["event", 1, "t", "", None],
        ["log", ["info"], "x"],  # unhashable level
    ],
)
def test_wrong_field_types_are_invalid_fields(fields: list[object]) -> None:
    assert _reason(_frame(fields)) == "invalid-field"


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        (["call", 1, "f", [], {}, "extra"], "wrong-field-count"),
        (["result", 1, None, None], "wrong-field-count"),
        (["hostreply", 1], "wrong-field-count"),
        (["Result", 1, None], "unknown-message-type"),
        (["", 1, None], "unknown-message-type"),
        ([1, 1, None], "not-a-message"),
        ([], "not-a-message"),
    ],
)
def test_extra_missing_and_unknown_fields_are_refused(fields: list[object], reason: str) -> None:
    assert _reason(_frame(fields)) == reason


def test_an_oversized_hot_frame_is_refused_before_it_is_parsed() -> None:
    assert _reason(_frame(["hostreply", 1, b"x" * 2000]), limit=1024) == "frame-too-large"


@pytest.mark.parametrize("cls", list(MESSAGE_TYPES.values()))
def test_listers_and_checks_follow_the_field_table(cls: type[Message]) -> None:
    names = FIELD_NAMES[cls]
    sample = {
        "id": 3,
        "name": "n",
        "args": [] if cls.TYPE == "call" else {},
        "kwargs": {},
        "value": 1,
        "error": {"code": "X"},
        "capability": "fs",
        "operation": "read_bytes",
        "level": "info",
        "text": "t",
        "topic": "a",
        "subscription": "a",
        "payload": None,
        "digest": "d",
        "bundle": {},
        "hardening": {},
        "subscriptions": [],
    }
    msg = cls(**{n: sample[n] for n in names})
    assert _LISTERS[cls](msg) == [cls.TYPE, *(getattr(msg, n) for n in names)]
    CHECKS[cls](*(getattr(msg, n) for n in names))  # the constructor's rules accept it too
    decoder = FrameDecoder()
    decoder.receive_data(encode(msg))
    assert decoder.next_message() == msg


def test_a_decoded_message_is_still_frozen() -> None:
    decoder = FrameDecoder()
    decoder.receive_data(_frame(["result", 1, None]))
    msg = decoder.next_message()
    with pytest.raises(AttributeError):
        msg.id = 2  # type: ignore[union-attr]
