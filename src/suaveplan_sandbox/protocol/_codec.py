"""Frame codec: 4-byte big-endian length prefix + one msgpack array `[tag, *fields]`.

Sans-IO in the style of h11: feed bytes with `receive_data`, pull messages with
`next_message()` until it returns `NEED_DATA`; `encode(msg)` gives the bytes to send.
Anything malformed, oversized or unknown raises `ProtocolError` (code `SAND_WIRE_ERROR`) and
the decoder stays broken: the peer is not trusted to resynchronise.

What a frame decodes to is bounded as well as its bytes. Every msgpack byte can be an object:
`0x90` is an empty array, which Python holds as a 56-byte list plus an 8-byte slot, so a
16 MiB frame of them was 1.2 GB of host memory and seconds of one loop's time. A decoder
given `max_elements` counts the items of every array and map of a large body as they are
built (a `list_hook`/`object_hook`, on the large-body path only: a body of at most 64 KiB
has at most that many items) and refuses the frame (`too-many-elements`) as soon as the
count passes it, so a frame costs about 70 bytes per element at most, plus its strings.
"""

from __future__ import annotations

import enum
import struct
import threading
from collections.abc import Callable
from typing import Any, Final

import msgpack

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.protocol._messages import (
    CHECKS,
    FIELD_NAMES,
    MESSAGE_TYPES,
    Call,
    Event,
    Failure,
    Hardened,
    HostCall,
    HostFailure,
    HostReply,
    Load,
    Log,
    Message,
    Ready,
    Result,
)

DEFAULT_MAX_FRAME_BYTES: Final = 16 * 1024 * 1024
_PREFIX: Final = 4
_LENGTH: Final = struct.Struct(">I")
# `msg` -> `[tag, *fields]`, the list msgpack packs, in `FIELD_NAMES` order (a test holds
# them to it). Spelled out per class: a literal list costs half of any attrgetter form.
_LISTERS: Final[dict[type[Message], Callable[[Any], list[object]]]] = {
    Load: lambda m: ["load", m.digest, m.bundle],
    Hardened: lambda m: ["hardened", m.hardening],
    Ready: lambda m: ["ready", m.subscriptions],
    Call: lambda m: ["call", m.id, m.name, m.args, m.kwargs],
    Result: lambda m: ["result", m.id, m.value],
    Failure: lambda m: ["failure", m.id, m.error],
    HostCall: lambda m: ["hostcall", m.id, m.capability, m.operation, m.args],
    HostReply: lambda m: ["hostreply", m.id, m.value],
    HostFailure: lambda m: ["hostfailure", m.id, m.error],
    Log: lambda m: ["log", m.level, m.text],
    Event: lambda m: ["event", m.id, m.topic, m.subscription, m.payload],
}


class _NeedData(enum.Enum):
    NEED_DATA = "NEED_DATA"

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA: Final = _NeedData.NEED_DATA


class ProtocolError(SuaveplanError):
    """A frame broke the protocol; always code `SAND_WIRE_ERROR`."""

    def __init__(self, reason: str, cause: BaseException | None = None) -> None:
        super().__init__(
            "SAND_WIRE_ERROR", "malformed frame on the worker channel", {"reason": reason}, cause
        )


class _Packers(threading.local):
    """A Packer per thread: building one per frame is most of a small frame's encoding cost,
    and a Packer is not thread-safe (hosts run blocking facades on their own threads)."""

    def __init__(self) -> None:
        self.packer = msgpack.Packer(use_bin_type=True)


_packers = _Packers()


def _frame(payload: list[object], max_frame_bytes: int) -> bytes:
    try:
        # On error the Packer discards what it had written, so it stays reusable.
        body: bytes = _packers.packer.pack(payload)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ProtocolError("unencodable", exc) from exc
    if len(body) > max_frame_bytes:
        raise ProtocolError("frame-too-large")
    return _LENGTH.pack(len(body)) + body


def encode(msg: Message, *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> bytes:
    """The frame bytes for `msg`; raises `ProtocolError` if it cannot be encoded or is too big."""
    lister = _LISTERS.get(type(msg))
    if lister is None:
        raise ProtocolError("unknown-message-type")
    return _frame(lister(msg), max_frame_bytes)


def encode_fields(
    cls: type[Message], *fields: object, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
) -> bytes:
    """`encode(cls(...))` for the fields given positionally in wire order, without building
    the message: the same bytes, after the same field rules (`CHECKS[cls]`, so a field the
    constructor refuses raises its `ValueError`/`TypeError` here too). For the hot paths,
    where the message object would be built only to be encoded."""
    spec = _FIELD_ENCODERS.get(cls)
    if spec is None:
        raise ProtocolError("unknown-message-type")
    tag, count, check = spec
    if len(fields) != count:
        raise TypeError(f"{cls.__name__} takes {count} fields, got {len(fields)}")
    check(*fields)
    return _frame([tag, *fields], max_frame_bytes)


def _no_ext(code: int, data: bytes) -> object:
    raise ValueError("ext types are not allowed")


# Bodies up to this size go through the decoder's own streaming Unpacker, whose buffer is
# never asked to hold more; larger ones through `unpackb`, so no decoder keeps a big buffer.
_SMALL_BODY: Final = 64 * 1024


class FrameDecoder:
    """Incremental decoder for frames from an untrusted peer."""

    __slots__ = (
        "_broken",
        "_buf",
        "_fed",
        "_large_options",
        "_max",
        "_max_elements",
        "_unpack_options",
        "_unpacker",
    )

    def __init__(
        self, *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, max_elements: int | None = None
    ) -> None:
        """`max_elements`: at most this many elements in one frame, counting each array as
        one plus its items and each map as one plus its keys and values (None: no limit but
        the frame's size). Every element takes at least a byte, so only bodies over 64 KiB
        need counting, and the limit must be at least that. Set it where the peer is
        untrusted."""
        if max_frame_bytes <= 0:
            raise ValueError("max_frame_bytes must be positive")
        if max_elements is not None and max_elements < _SMALL_BODY:
            raise ValueError(f"max_elements must be at least {_SMALL_BODY}")
        self._max = max_frame_bytes
        self._max_elements = max_elements
        limit = max_frame_bytes
        self._unpack_options: dict[str, Any] = {
            "raw": False,
            "strict_map_key": True,
            "use_list": True,
            "ext_hook": _no_ext,
            "max_str_len": limit,
            "max_bin_len": limit,
            "max_array_len": limit,
            "max_map_len": limit,
            "max_ext_len": 0,
        }
        # A reused Unpacker costs half of `unpackb`'s per-call option parsing. It is fed one
        # whole body at a time; `_fed` counts what it was fed, so `tell()` shows trailing
        # bytes (`unpackb` would raise ExtraData for them).
        self._unpacker = msgpack.Unpacker(
            **self._unpack_options, read_size=_SMALL_BODY, max_buffer_size=_SMALL_BODY
        )
        self._large_options = self._unpack_options
        if max_elements is not None:
            # No single array or map may announce more than the whole frame may hold.
            self._large_options = {
                **self._unpack_options,
                "max_array_len": min(limit, max_elements),
                "max_map_len": min(limit, max_elements // 2 or 1),
            }
        self._fed = 0
        self._buf = bytearray()
        self._broken = False

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Append received bytes (copied: the caller may reuse its buffer)."""
        if self._broken:
            raise ProtocolError("decoder-broken")
        self._buf += data

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def next_message(self) -> Message | _NeedData:
        """The next complete message, or `NEED_DATA`."""
        if self._broken:
            raise ProtocolError("decoder-broken")
        buf = self._buf
        have = len(buf)
        if have < _PREFIX:
            return NEED_DATA
        (size,) = _LENGTH.unpack_from(buf)
        if size > self._max:
            self._broken = True
            raise ProtocolError("frame-too-large")
        end = _PREFIX + size
        if have < end:
            return NEED_DATA
        # One copy of the body (msgpack reads any buffer); the usual case, one whole frame
        # buffered, then empties the buffer without moving anything.
        body = buf[_PREFIX:end]
        if have == end:
            buf.clear()
        else:
            del buf[:end]
        try:
            if size <= _SMALL_BODY:
                unpacker = self._unpacker
                unpacker.feed(body)
                self._fed += size
                raw = unpacker.unpack()
                if unpacker.tell() != self._fed:
                    raise ValueError("extra data after the message")
            elif self._max_elements is None:
                raw = msgpack.unpackb(body, **self._unpack_options)
            else:
                raw = _unpack_counted(body, self._max_elements, self._large_options)
        except _TooManyElements:
            self._broken = True
            raise ProtocolError("too-many-elements") from None
        except Exception as exc:  # msgpack raises many types; all mean "malformed"
            self._broken = True
            raise ProtocolError("undecodable", exc) from exc
        if type(raw) is not list or not raw or type(raw[0]) is not str:
            self._broken = True
            raise ProtocolError("not-a-message")
        spec = _DECODERS.get(raw[0])
        if spec is None:
            self._broken = True
            raise ProtocolError("unknown-message-type")
        count, build = spec
        if len(raw) != count:
            self._broken = True
            raise ProtocolError("wrong-field-count")
        try:
            return build(raw)
        except (TypeError, ValueError) as exc:
            self._broken = True
            raise ProtocolError("invalid-field", exc) from exc


class _TooManyElements(Exception):
    """Internal: a frame holds more array items and map entries than its decoder allows."""


def _unpack_counted(body: bytearray, budget: int, options: dict[str, Any]) -> object:
    """`unpackb(body)`, refused as soon as its arrays and maps hold more than `budget` items
    (a map entry is two). The hooks see each container when it is complete, inner ones
    first, so the count stops a frame of many small containers early; one large container
    is bounded by `max_array_len`/`max_map_len` before its items are read."""
    left = budget

    def count_list(items: list[Any]) -> list[Any]:
        nonlocal left
        left -= len(items) + 1
        if left < 0:
            raise _TooManyElements
        return items

    def count_map(entries: dict[str, Any]) -> dict[str, Any]:
        nonlocal left
        left -= 2 * len(entries) + 1
        if left < 0:
            raise _TooManyElements
        return entries

    return msgpack.unpackb(body, list_hook=count_list, object_hook=count_map, **options)


def _builder(cls: type[Message], names: tuple[str, ...]) -> Callable[[list[Any]], Message]:
    """`[tag, *fields]` (length already checked) -> a `cls` instance.

    The fields go through the class's own rules (`CHECKS[cls]`, what `__post_init__` runs)
    and are then stored through the slot descriptors, skipping the keyword constructor: the
    same accepted set for a third of the cost on the hot messages. Unrolled per field count.
    """
    check = CHECKS[cls]
    setters = tuple(getattr(cls, name).__set__ for name in names)
    new = object.__new__
    if len(names) == 2:
        sa, sb = setters

        def build2(r: list[Any]) -> Message:
            _, a, b = r
            check(a, b)
            obj = new(cls)
            sa(obj, a)
            sb(obj, b)
            return obj

        return build2
    if len(names) == 4:
        sa, sb, sc, sd = setters

        def build4(r: list[Any]) -> Message:
            _, a, b, c, d = r
            check(a, b, c, d)
            obj = new(cls)
            sa(obj, a)
            sb(obj, b)
            sc(obj, c)
            sd(obj, d)
            return obj

        return build4

    def build(r: list[Any]) -> Message:
        values = r[1:]
        check(*values)
        obj = new(cls)
        for setter, value in zip(setters, values, strict=True):
            setter(obj, value)
        return obj

    return build


_FIELD_ENCODERS: Final = {
    cls: (cls.TYPE, len(FIELD_NAMES[cls]), CHECKS[cls]) for cls in MESSAGE_TYPES.values()
}

_DECODERS: Final = {
    tag: (len(FIELD_NAMES[cls]) + 1, _builder(cls, FIELD_NAMES[cls]))
    for tag, cls in MESSAGE_TYPES.items()
}
