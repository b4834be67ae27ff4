"""The message an event becomes when it crosses processes (`RedisEventBus`).

    suaveplan-event/1 depth=<the publisher's hop depth>\\n<the payload as strict JSON>

It carries the hop depth (`_events.event_depth`) with the payload, so a plugin re-publishing
to its own topic through Redis stops at `MAX_EVENT_DEPTH` as it does in-process. A header line
rather than a JSON wrapper: the format before it was the bare payload, strict JSON, which
never starts with `s`, so the two cannot be mistaken for each other; and a subscriber still
on that format fails to parse a new message and drops it, where a wrapper would reach its
plugin in place of the payload.

Anything read off the channel is untrusted: any client of the server can publish there.
`read_event` accepts exactly this grammar and raises `ValueError` for everything else (never
another exception, whatever the bytes): the depth is `0` or a decimal without sign or leading
zeros of at most 18 digits. A depth past `MAX_EVENT_DEPTH` is read as `MAX_EVENT_DEPTH`: its
delivery is past the limit, so a VM subscriber drops it (`event-depth`), as in-process. A
message in the earlier format (no header) has no depth: it is read as `LEGACY_DEPTH`, the
last hop, so it is still delivered but nothing a plugin publishes while handling it is.
"""

from __future__ import annotations

import re
from typing import Final

from suaveplan_sandbox.adapters._events import MAX_EVENT_DEPTH, decode_payload, encode_payload
from suaveplan_sandbox.errors import WireValue

_HEADER: Final = "suaveplan-event/1 depth="
_HEADER_BYTES: Final = _HEADER.encode()
_MAX_DEPTH_DIGITS: Final = 18
_DEPTH: Final = re.compile(rb"0|[1-9][0-9]{0,%d}" % (_MAX_DEPTH_DIGITS - 1))
# An event published in the format before hop depths were carried: delivered as the last
# hop (fail closed: a loop through it ends after one more delivery).
LEGACY_DEPTH: Final = MAX_EVENT_DEPTH - 1


def write_event(depth: int, payload: object) -> str:
    """The message for `payload` published at hop `depth`; `SAND_INVALID_ARGUMENT` if the
    payload is not a strict JSON value (`encode_payload`)."""
    return f"{_HEADER}{min(max(depth, 0), MAX_EVENT_DEPTH)}\n{encode_payload(payload)}"


def read_event(data: object) -> tuple[int, WireValue]:
    """`(publisher's hop depth, payload)` of a message; `ValueError` if it is malformed."""
    if isinstance(data, str):
        data = data.encode()  # a lone surrogate raises UnicodeEncodeError, a ValueError
    if not isinstance(data, bytes):
        raise ValueError("an event message is bytes")
    if not data.startswith(_HEADER_BYTES):
        return LEGACY_DEPTH, decode_payload(data)
    start = len(_HEADER_BYTES)
    end = data.find(b"\n", start, start + _MAX_DEPTH_DIGITS + 1)
    if end < 0 or _DEPTH.fullmatch(data, start, end) is None:
        raise ValueError("malformed event header")
    return min(int(data[start:end]), MAX_EVENT_DEPTH), decode_payload(data[end + 1 :])
