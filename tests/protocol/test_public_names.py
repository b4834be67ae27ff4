"""The protocol package's public names are pinned."""

from suaveplan_sandbox import protocol


def test_protocol_exports_are_pinned() -> None:
    assert set(protocol.__all__) == {
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
    }
