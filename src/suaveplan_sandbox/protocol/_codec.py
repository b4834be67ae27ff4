"""Frame codec: 4-byte big-endian length prefix + one msgpack array `[tag, *fields]`.

Sans-IO in the style of h11: feed bytes with `receive_data`, pull messages with
`next_message()` until it returns `NEED_DATA`; `encode(msg)` gives the bytes to send.
Anything malformed, oversized or unknown raises `ProtocolError` (code `SAND_WIRE_ERROR`) and
the decoder stays broken: the peer is not trusted to resynchronise.
"""

from __future__ import annotations

import enum
import struct
import threading
from collections.abc import Callable
from operator import attrgetter
from typing import Any, Final

import msgpack

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.protocol._messages import FIELD_NAMES, MESSAGE_TYPES, Message

DEFAULT_MAX_FRAME_BYTES: Final = 16 * 1024 * 1024
_PREFIX: Final = 4
_LENGTH: Final = struct.Struct(">I")
# A Packer per thread: building one per frame is most of a small frame's encoding cost, and a
# Packer is not thread-safe (hosts run blocking facades on their own threads).
_packers = threading.local()


def _getter(names: tuple[str, ...]) -> Callable[[Message], tuple[object, ...]]:
    if len(names) == 1:
        (name,) = names
        return lambda msg: (getattr(msg, name),)
    return attrgetter(*names)


_GETTERS: Final = {cls: _getter(names) for cls, names in FIELD_NAMES.items()}


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


def encode(msg: Message, *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> bytes:
    """The frame bytes for `msg`; raises `ProtocolError` if it cannot be encoded or is too big."""
    getter = _GETTERS.get(type(msg))
    if getter is None:
        raise ProtocolError("unknown-message-type")
    payload = [msg.TYPE, *getter(msg)]
    packer: msgpack.Packer | None = getattr(_packers, "packer", None)
    if packer is None:
        packer = _packers.packer = msgpack.Packer(use_bin_type=True)
    try:
        # On error the Packer discards what it had written, so it stays reusable.
        body: bytes = packer.pack(payload)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ProtocolError("unencodable", exc) from exc
    if len(body) > max_frame_bytes:
        raise ProtocolError("frame-too-large")
    return _LENGTH.pack(len(body)) + body


def _no_ext(code: int, data: bytes) -> object:
    raise ValueError("ext types are not allowed")


@enum.unique
class _State(enum.Enum):
    OK = "ok"
    BROKEN = "broken"


class FrameDecoder:
    """Incremental decoder for frames from an untrusted peer."""

    __slots__ = ("_buf", "_max", "_state", "_unpack_options")

    def __init__(self, *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        if max_frame_bytes <= 0:
            raise ValueError("max_frame_bytes must be positive")
        self._max = max_frame_bytes
        limit = max_frame_bytes
        self._unpack_options: dict[str, object] = {
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
        self._buf = bytearray()
        self._state = _State.OK

    def receive_data(self, data: bytes) -> None:
        """Append received bytes."""
        if self._state is _State.BROKEN:
            raise ProtocolError("decoder-broken")
        self._buf += data

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def next_message(self) -> Message | _NeedData:
        """The next complete message, or `NEED_DATA`."""
        if self._state is _State.BROKEN:
            raise ProtocolError("decoder-broken")
        buf = self._buf
        if len(buf) < _PREFIX:
            return NEED_DATA
        (size,) = _LENGTH.unpack_from(buf)
        if size > self._max:
            self._state = _State.BROKEN
            raise ProtocolError("frame-too-large")
        end = _PREFIX + size
        if len(buf) < end:
            return NEED_DATA
        body = bytes(buf[_PREFIX:end])
        del buf[:end]
        try:
            return self._parse(body)
        except ProtocolError:
            self._state = _State.BROKEN
            raise

    def _parse(self, body: bytes) -> Message:
        try:
            raw = msgpack.unpackb(body, **self._unpack_options)
        except Exception as exc:  # msgpack raises many types; all mean "malformed"
            raise ProtocolError("undecodable", exc) from exc
        if type(raw) is not list or not raw or type(raw[0]) is not str:
            raise ProtocolError("not-a-message")
        spec = _DECODERS.get(raw[0])
        if spec is None:
            raise ProtocolError("unknown-message-type")
        count, build = spec
        if len(raw) != count:
            raise ProtocolError("wrong-field-count")
        try:
            return build(raw)
        except (TypeError, ValueError) as exc:
            raise ProtocolError("invalid-field", exc) from exc


def _builder(cls: type[Message], names: tuple[str, ...]) -> Callable[[list[Any]], Message]:
    """`[tag, *fields]` (length already checked) -> `cls(**fields)`, through the class's own
    constructor and validation. Unrolled per field count: building the keyword dict as a
    literal costs a third of `dict(zip(...))` on the hot messages (1-4 fields)."""
    if len(names) == 1:
        (a,) = names
        return lambda r: cls(**{a: r[1]})
    if len(names) == 2:
        a, b = names
        return lambda r: cls(**{a: r[1], b: r[2]})
    if len(names) == 3:
        a, b, c = names
        return lambda r: cls(**{a: r[1], b: r[2], c: r[3]})
    if len(names) == 4:
        a, b, c, d = names
        return lambda r: cls(**{a: r[1], b: r[2], c: r[3], d: r[4]})
    return lambda r: cls(**dict(zip(names, r[1:], strict=True)))


_DECODERS: Final = {
    tag: (len(FIELD_NAMES[cls]) + 1, _builder(cls, FIELD_NAMES[cls]))
    for tag, cls in MESSAGE_TYPES.items()
}
