"""The host/guest codec pair as a state machine: random traffic, random chunking, hostile frames.

Two directions (host → guest and guest → host), each a byte pipe into the other side's
`FrameDecoder`. The model is a queue of the messages each side has sent and not yet received.
Rules send messages, deliver any number of pending bytes (so frames are split anywhere),
and inject garbage, truncated or oversized frames. Invariants: every message that comes out
is exactly the next one the model expects (no desync ever yields a wrong message), a hostile
frame ends its direction with the coded `SAND_WIRE_ERROR` and a terminal decoder, and a
drained decoder holds less than one frame.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from typing import Any, Final

import msgpack
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from suaveplan_sandbox.errors import is_registered
from suaveplan_sandbox.protocol import (
    MESSAGE_TYPES,
    NEED_DATA,
    FrameDecoder,
    Message,
    ProtocolError,
    encode,
)
from suaveplan_sandbox.protocol._messages import LOG_LEVELS

LIMIT: Final = 2048
_PREFIX: Final = 4
HOST_SENDS: Final = ("load", "call", "hostreply", "hostfailure", "event")
GUEST_SENDS: Final = ("ready", "result", "failure", "hostcall", "log")

plain = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=12)
    | st.binary(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
_BY_ANNOTATION: Final[dict[str, st.SearchStrategy[Any]]] = {
    "int": st.integers(min_value=0, max_value=2**63 - 1),
    "str": st.text(min_size=1, max_size=24),
    "object": plain,
    "list[object]": st.lists(plain, max_size=3),
    "list[str]": st.lists(st.text(min_size=1, max_size=12), max_size=3),
    "dict[str, object]": st.dictionaries(st.text(max_size=6), plain, max_size=3),
}


def message_strategy(tag: str) -> st.SearchStrategy[Message]:
    """Valid messages of one type, built from its field annotations (follows message changes)."""
    cls = MESSAGE_TYPES[tag]
    fields = {
        f.name: st.sampled_from(sorted(LOG_LEVELS))
        if (tag, f.name) == ("log", "level")
        else _BY_ANNOTATION[str(f.type)]
        for f in dataclasses.fields(cls)
    }
    return st.fixed_dictionaries(fields).map(lambda kw: cls(**kw))


def garbage_frame(kind: str, noise: bytes) -> tuple[bytes, str]:
    """A length-prefixed body that is certainly not a valid message, and the reason expected."""
    body, reason = {
        "not-msgpack": (b"\xc1" + noise, "undecodable"),  # 0xc1 is never valid msgpack
        "trailing-bytes": (msgpack.packb(["log", "info", "x"]) + b"\x00" + noise, "undecodable"),
        "a-map": (msgpack.packb({"log": noise}), "not-a-message"),
        "unknown-tag": (msgpack.packb(["nope", noise]), "unknown-message-type"),
        "wrong-count": (msgpack.packb(["result", 1]), "wrong-field-count"),
        "negative-id": (msgpack.packb(["result", -1, None]), "invalid-field"),
        "ext-type": (msgpack.packb(["result", 1, msgpack.ExtType(1, noise)]), "undecodable"),
    }[kind]
    return len(body).to_bytes(_PREFIX, "big") + body, reason


class _Direction:
    """One byte pipe: what is on the wire, what the receiver should decode, how it must end."""

    def __init__(self) -> None:
        self.decoder = FrameDecoder(max_frame_bytes=LIMIT)
        self.wire = bytearray()
        self.expected: deque[Message] = deque()
        # Bytes still on the wire before a hostile frame, and the reason it must raise.
        self.hostile_at: int | None = None
        self.hostile_reason: str | None = None
        self.truncated = False
        self.broken = False

    @property
    def open(self) -> bool:
        return self.hostile_at is None and not self.truncated


class WireProtocol(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.to_guest = _Direction()
        self.to_host = _Direction()
        self.delivered = 0

    def _pipe(self, to_guest: bool) -> _Direction:
        return self.to_guest if to_guest else self.to_host

    def _send(self, pipe: _Direction, msg: Message) -> None:
        try:
            frame = encode(msg, max_frame_bytes=LIMIT)
        except ProtocolError as exc:
            # The sender refuses an oversized message itself; nothing reaches the wire.
            assert exc.code == "SAND_WIRE_ERROR"
            assert exc.details["reason"] == "frame-too-large"
            assert len(encode(msg)) > LIMIT + _PREFIX
            return
        pipe.wire += frame
        pipe.expected.append(msg)

    @precondition(lambda self: self.to_guest.open)
    @rule(data=st.data(), tag=st.sampled_from(HOST_SENDS))
    def host_sends(self, data: st.DataObject, tag: str) -> None:
        self._send(self.to_guest, data.draw(message_strategy(tag)))

    @precondition(lambda self: self.to_host.open)
    @rule(data=st.data(), tag=st.sampled_from(GUEST_SENDS))
    def guest_sends(self, data: st.DataObject, tag: str) -> None:
        self._send(self.to_host, data.draw(message_strategy(tag)))

    @rule(to_guest=st.booleans(), size=st.integers(min_value=1, max_value=600))
    def deliver(self, to_guest: bool, size: int) -> None:
        pipe = self._pipe(to_guest)
        if pipe.broken:
            # A broken decoder stays broken: it neither takes bytes nor yields messages.
            for poke in (lambda: pipe.decoder.receive_data(b"x"), pipe.decoder.next_message):
                try:
                    poke()
                except ProtocolError as exc:
                    assert exc.code == "SAND_WIRE_ERROR"
                else:
                    raise AssertionError("a broken decoder accepted more")
            return
        chunk = bytes(pipe.wire[:size])
        del pipe.wire[:size]
        if pipe.hostile_at is not None:
            pipe.hostile_at -= len(chunk)
        pipe.decoder.receive_data(chunk)
        self.delivered += len(chunk)
        while True:
            try:
                msg = pipe.decoder.next_message()
            except ProtocolError as exc:
                assert exc.code == "SAND_WIRE_ERROR" and is_registered(exc.code)
                assert pipe.hostile_at is not None and pipe.hostile_at < 0, "error on good bytes"
                assert not pipe.expected, "a good message was lost before the hostile frame"
                assert exc.details["reason"] == pipe.hostile_reason
                pipe.broken = True
                return
            if msg is NEED_DATA:
                break
            assert pipe.expected, f"decoded {msg!r} that nobody sent"
            assert msg == pipe.expected.popleft()

    @precondition(lambda self: self.to_guest.open or self.to_host.open)
    @rule(
        to_guest=st.booleans(),
        kind=st.sampled_from(
            [
                "not-msgpack",
                "trailing-bytes",
                "a-map",
                "unknown-tag",
                "wrong-count",
                "negative-id",
                "ext-type",
            ]
        ),
        noise=st.binary(max_size=16),
    )
    def inject_garbage(self, to_guest: bool, kind: str, noise: bytes) -> None:
        pipe = self._pipe(to_guest)
        if not pipe.open:
            return
        frame, reason = garbage_frame(kind, noise)
        # The hostile frame completes once every byte before it and all of it are delivered.
        pipe.hostile_at = len(pipe.wire) + len(frame) - 1
        pipe.hostile_reason = reason
        pipe.wire += frame

    @precondition(lambda self: self.to_guest.open or self.to_host.open)
    @rule(to_guest=st.booleans(), size=st.integers(min_value=LIMIT + 1, max_value=2**32 - 1))
    def inject_oversized(self, to_guest: bool, size: int) -> None:
        pipe = self._pipe(to_guest)
        if not pipe.open:
            return
        # The decoder refuses as soon as the length prefix is in, before any body arrives.
        pipe.hostile_at = len(pipe.wire) + _PREFIX - 1
        pipe.hostile_reason = "frame-too-large"
        pipe.wire += size.to_bytes(_PREFIX, "big") + b"\x00" * 8

    @precondition(lambda self: self.to_guest.open or self.to_host.open)
    @rule(data=st.data(), to_guest=st.booleans())
    def send_truncated_and_close(self, data: st.DataObject, to_guest: bool) -> None:
        pipe = self._pipe(to_guest)
        if not pipe.open:
            return
        tag = data.draw(st.sampled_from(HOST_SENDS if to_guest else GUEST_SENDS))
        frame = encode(data.draw(message_strategy(tag)))
        cut = data.draw(st.integers(min_value=1, max_value=len(frame) - 1))
        pipe.wire += frame[:cut]
        pipe.truncated = True

    @invariant()
    def drained_decoders_hold_less_than_a_frame(self) -> None:
        for pipe in (self.to_guest, self.to_host):
            if not pipe.broken:
                assert pipe.decoder.buffered < _PREFIX + LIMIT

    def teardown(self) -> None:
        # Deliver everything left: the model must end exactly where the bytes say it ends.
        for to_guest in (True, False):
            pipe = self._pipe(to_guest)
            while pipe.wire and not pipe.broken:
                self.deliver(to_guest, 600)
            if pipe.broken:
                continue
            assert pipe.hostile_at is None, "a hostile frame went unnoticed"
            assert not pipe.expected, "sent messages never arrived"
            # A truncated last frame is held (the owner sees EOF mid-frame), never yielded.
            assert (pipe.decoder.buffered > 0) == pipe.truncated


WireProtocol.TestCase.settings = settings(
    max_examples=25,
    stateful_step_count=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
test_wire_protocol_state_machine = WireProtocol.TestCase
