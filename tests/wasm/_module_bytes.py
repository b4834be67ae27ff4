"""Module bytes built by hand for the WASM tests: LEB128, sections, salted copies, and the
answer module; and the start of a stand-in compile child's program."""

from __future__ import annotations

import uuid

import wasmtime

ANSWER_WAT = '(module (func (export "answer") (result i32) (i32.const {n})))'


def leb(value: int) -> bytes:
    """`value` as unsigned LEB128."""
    out = bytearray()
    while True:
        b, value = value & 0x7F, value >> 7
        out.append(b | (0x80 if value else 0))
        if not value:
            return bytes(out)


def section(sid: int, payload: bytes) -> bytes:
    """A section: its id, its size, its payload."""
    return bytes([sid]) + leb(len(payload)) + payload


def salted(wasm: bytes, pad: int = 0) -> bytes:
    """`wasm` plus a custom section no other test has (and `pad` more bytes in it): bytes
    no module cache has seen."""
    name = uuid.uuid4().hex.encode()
    return wasm + section(0, leb(len(name)) + name + b"\0" * pad)


def answer(n: int, pad: int = 0) -> bytes:
    """A fresh (salted) module whose `answer` export returns `n`."""
    return salted(bytes(wasmtime.wat2wasm(ANSWER_WAT.format(n=n))), pad)


# A stand-in compile child's first lines: says READY (`READY_PAYLOAD` is replaced with the
# payload's repr) and defines `exact(n)`, which reads n bytes or exits at EOF.
STAND_IN_CHILD_PRELUDE = r"""
import hashlib, socket, struct, sys
sock = socket.socket(fileno=int(sys.argv[1]))
ready = READY_PAYLOAD
sock.sendall(struct.pack(">BI", ord("H"), len(ready)) + ready)
def exact(n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            sys.exit(0)
        buf += chunk
    return buf
"""
