"""Frames between the host and its compile child: sans-IO, length-prefixed, no pickle, no eval.

A frame is a 5-byte header — a kind byte and the payload's length (u32, big-endian) — then
the payload. The child speaks first, then answers one request at a time:

| kind         | sent by | payload                                                          |
|--------------|---------|------------------------------------------------------------------|
| `H` READY    | child   | JSON `{"settings": SETTINGS_TAG, "wasmtime": <package path>}`    |
| `C` COMPILE  | host    | memory bytes (u64), CPU seconds (u32), then the module's bytes   |
| `O` COMPILED | child   | sha256 of the bytes it compiled (32 bytes), then the artefact     |
| `R` REFUSED  | child   | wasmtime's reason for an invalid module, UTF-8                   |
| `F` FAILED   | child   | wasmtime's reason for not compiling a *valid* module, UTF-8      |

A reader checks a header against the kinds it expects and a payload bound *before* reading
the payload (`parse_header`), so a forged length never makes the host allocate; a reply is
checked against its request (`parse_reply`: the digest must be the request's). Anything else
is `MalformedFrame`. This module imports only the standard library (the child loads it).
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from typing import Final, final

HEADER: Final = struct.Struct(">BI")
_PARAMS: Final = struct.Struct(">QI")
READY: Final = ord("H")
COMPILE: Final = ord("C")
COMPILED: Final = ord("O")
REFUSED: Final = ord("R")
FAILED: Final = ord("F")
REPLIES: Final = frozenset({COMPILED, REFUSED, FAILED})
# The largest payload a frame can name (its length field is a u32).
MAX_PAYLOAD: Final = 2**32 - 1
# READY, REFUSED and FAILED carry short text: a longer one is malformed (senders truncate).
MAX_TEXT_BYTES: Final = 4096
DIGEST_BYTES: Final = 32
MAX_MEMORY_BYTES: Final = 2**64 - 1
MAX_CPU_SECONDS: Final = 2**32 - 1


class MalformedFrame(Exception):
    """Bytes that are not the frame the reader expected; `why` names what was wrong."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Ready:
    settings: str
    wasmtime: str


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class CompileRequest:
    memory_bytes: int
    cpu_seconds: int
    source: bytes


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Compiled:
    artefact: bytes


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Refused:
    """wasmtime refused the bytes (`valid=False`), or could not compile valid ones."""

    message: str
    valid: bool


def header(kind: int, length: int) -> bytes:
    if not 0 <= length <= MAX_PAYLOAD:
        raise ValueError("a frame payload must fit a u32 length")
    return HEADER.pack(kind, length)


def parse_header(data: bytes, *, expect: frozenset[int], max_payload: int) -> tuple[int, int]:
    """`(kind, length)` of a header, if the kind is expected and the length within bound."""
    if len(data) != HEADER.size:
        raise MalformedFrame("short-header")
    kind, length = HEADER.unpack(data)
    if kind not in expect:
        raise MalformedFrame("unexpected-kind")
    if length > max_payload:
        raise MalformedFrame("too-large")
    return kind, length


def _text(payload: bytes | bytearray) -> str:
    if len(payload) > MAX_TEXT_BYTES:
        raise MalformedFrame("too-large")
    try:
        return bytes(payload).decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedFrame("not-utf8") from None


def _truncated(text: str) -> bytes:
    return text.encode("utf-8", "replace")[:MAX_TEXT_BYTES].decode("utf-8", "ignore").encode()


def encode_ready(*, settings: str, wasmtime: str) -> bytes:
    payload = json.dumps({"settings": settings, "wasmtime": wasmtime}).encode()
    if len(payload) > MAX_TEXT_BYTES:
        raise ValueError("the READY payload is too long")
    return header(READY, len(payload)) + payload


def parse_ready(payload: bytes | bytearray) -> Ready:
    try:
        obj = json.loads(_text(payload))
    except ValueError:
        raise MalformedFrame("not-json") from None
    if not isinstance(obj, dict) or set(obj) != {"settings", "wasmtime"}:
        raise MalformedFrame("bad-ready")
    settings, wasmtime = obj["settings"], obj["wasmtime"]
    if not isinstance(settings, str) or not isinstance(wasmtime, str):
        raise MalformedFrame("bad-ready")
    return Ready(settings=settings, wasmtime=wasmtime)


def encode_compile_head(source_len: int, *, memory_bytes: int, cpu_seconds: int) -> bytes:
    """The header and parameters of a COMPILE frame; the module's bytes follow them."""
    if not 0 <= memory_bytes <= MAX_MEMORY_BYTES or not 0 <= cpu_seconds <= MAX_CPU_SECONDS:
        raise ValueError("a compile limit is out of the frame's range")
    return header(COMPILE, _PARAMS.size + source_len) + _PARAMS.pack(memory_bytes, cpu_seconds)


def parse_compile(payload: bytes | bytearray) -> CompileRequest:
    if len(payload) < _PARAMS.size:
        raise MalformedFrame("short-payload")
    memory_bytes, cpu_seconds = _PARAMS.unpack_from(payload)
    source = bytes(memoryview(payload)[_PARAMS.size :])
    return CompileRequest(memory_bytes=memory_bytes, cpu_seconds=cpu_seconds, source=source)


def encode_compiled_head(digest: bytes, artefact_len: int) -> bytes:
    """The header and digest of a COMPILED frame; the artefact follows them."""
    if len(digest) != DIGEST_BYTES:
        raise ValueError("a digest is 32 bytes")
    return header(COMPILED, DIGEST_BYTES + artefact_len) + digest


def encode_refused(message: str, *, valid: bool) -> bytes:
    payload = _truncated(message)
    return header(FAILED if valid else REFUSED, len(payload)) + payload


def parse_reply(kind: int, payload: bytes | bytearray, *, source: bytes) -> Compiled | Refused:
    """The child's reply to compiling `source`; `MalformedFrame` if it cannot be that."""
    if kind == COMPILED:
        if len(payload) <= DIGEST_BYTES:
            raise MalformedFrame("short-payload")
        view = memoryview(payload)
        if view[:DIGEST_BYTES] != hashlib.sha256(source).digest():
            raise MalformedFrame("wrong-digest")
        return Compiled(artefact=bytes(view[DIGEST_BYTES:]))
    if kind in (REFUSED, FAILED):
        return Refused(message=_text(payload), valid=kind == FAILED)
    raise MalformedFrame("unexpected-kind")
