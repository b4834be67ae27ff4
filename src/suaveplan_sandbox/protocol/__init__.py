"""Sans-IO wire protocol between the host and its worker processes."""

from suaveplan_sandbox.protocol._codec import (
    DEFAULT_MAX_FRAME_BYTES,
    NEED_DATA,
    FrameDecoder,
    ProtocolError,
    encode,
    encode_fields,
)
from suaveplan_sandbox.protocol._messages import (
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

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "MESSAGE_TYPES",
    "NEED_DATA",
    "Call",
    "Event",
    "Failure",
    "FrameDecoder",
    "Hardened",
    "HostCall",
    "HostFailure",
    "HostReply",
    "Load",
    "Log",
    "Message",
    "ProtocolError",
    "Ready",
    "Result",
    "encode",
    "encode_fields",
]
