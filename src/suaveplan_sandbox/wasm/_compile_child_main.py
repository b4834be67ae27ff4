"""The compile child's loop: compile one module per request under that request's rlimits.

Runs in a process of its own (`_compile_child.CompileServer` starts it with the host's own
interpreter, `-I -S`, an empty environment and no stdio), with only this module,
`_compile_wire`, `_engine_config`, the VM workers' `arm_lifeline` (`vm._hardening._apply`)
and wasmtime loaded — never a package's `__init__`. It first arms its lifeline (the read end
of a pipe only the host can write to: when the host ends, however it ends, SIGIO ends this
process, even inside Cranelift; see `_compile_child`), builds its engine from
`engine_config()`, announces `SETTINGS_TAG` (READY), then for each
COMPILE request: lowers its soft RLIMIT_AS to the address space it uses now plus the
request's memory bytes and its soft RLIMIT_CPU to the CPU time it used so far plus the
request's seconds (rounded up: the kernel counts whole seconds), compiles and serializes,
lifts both soft limits again and replies. Hard limits stay where they were so the next
request can set its own. An allocation that fails inside wasmtime aborts the child (Rust's
default); one that fails in Python exits with `EXIT_OUT_OF_MEMORY`; the CPU limit ends it with
SIGXCPU. The host sees the end of the socket either way. No core files (RLIMIT_CORE 0).

wasmtime refusing the bytes is an answer, not a failure: REFUSED with wasmtime's reason when
the bytes do not validate, FAILED when valid bytes could not be compiled (a limit inside
wasmtime). EOF on the socket (the host closed it or exited) ends the child.
"""

from __future__ import annotations

import hashlib
import math
import os
import resource
import socket

import wasmtime

from suaveplan_sandbox.wasm._compile_wire import (
    COMPILE,
    HEADER,
    MAX_PAYLOAD,
    encode_compiled_head,
    encode_ready,
    encode_refused,
    parse_compile,
    parse_header,
)
from suaveplan_sandbox.wasm._engine_config import SETTINGS_TAG, engine_config

EXIT_OUT_OF_MEMORY = 3
_COMPILE_KINDS = frozenset({COMPILE})


def _recv_exact(sock: socket.socket, n: int) -> bytearray | None:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            return None
        got += k
    return buf


def _address_space() -> int:
    """The bytes of address space this process maps now (0 where /proc cannot say)."""
    try:
        with open("/proc/self/status", "rb") as fh:  # noqa: PTH123 — no pathlib in the child
            for line in fh:
                if line.startswith(b"VmSize:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _soft(limit: int, soft: int) -> tuple[int, int]:
    _, hard = resource.getrlimit(limit)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    return soft, hard


def _arm(memory_bytes: int, cpu_seconds: int) -> None:
    resource.setrlimit(
        resource.RLIMIT_AS, _soft(resource.RLIMIT_AS, _address_space() + memory_bytes)
    )
    usage = resource.getrusage(resource.RUSAGE_SELF)
    used = usage.ru_utime + usage.ru_stime
    resource.setrlimit(
        resource.RLIMIT_CPU, _soft(resource.RLIMIT_CPU, math.ceil(used + cpu_seconds))
    )


def _disarm() -> None:
    for limit in (resource.RLIMIT_AS, resource.RLIMIT_CPU):
        _, hard = resource.getrlimit(limit)
        resource.setrlimit(limit, (hard, hard))


def _compile(engine: wasmtime.Engine, source: bytes) -> list[bytes | bytearray]:
    """The reply's parts: COMPILED head and artefact, or REFUSED / FAILED (limits lifted)."""
    try:
        artefact = wasmtime.Module(engine, source).serialize()
    except wasmtime.WasmtimeError as exc:
        failure = exc
    else:
        return [encode_compiled_head(hashlib.sha256(source).digest(), len(artefact)), artefact]
    finally:
        _disarm()
    # Invalid bytes (the host validated the guest's, so a broken rewrite) are REFUSED, with
    # the validator's reason; valid bytes wasmtime would not compile are FAILED.
    try:
        wasmtime.Module.validate(engine, source)
    except wasmtime.WasmtimeError as invalid:
        return [encode_refused(str(invalid), valid=False)]
    return [encode_refused(str(failure), valid=True)]


def main(fd: int, lifeline: int | None = None) -> None:
    """Serve the host on socket `fd`; die with the host holding the write end of `lifeline`."""
    if lifeline is not None:
        # Imported here, not at the top: the host imports this module too (for its
        # constants), and needs none of the VM's hardening module for that.
        from suaveplan_sandbox.vm._hardening._apply import arm_lifeline

        # Before anything slow (the engine): a host already gone ends this process here.
        arm_lifeline(lifeline)
    sock = socket.socket(fileno=fd)
    # A compile ended by a limit must not write a core file the size of its address space.
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    engine = wasmtime.Engine(engine_config())
    sock.sendall(encode_ready(settings=SETTINGS_TAG, wasmtime=wasmtime.__file__ or ""))
    while True:
        head = _recv_exact(sock, HEADER.size)
        if head is None:
            return
        _, length = parse_header(bytes(head), expect=_COMPILE_KINDS, max_payload=MAX_PAYLOAD)
        payload = _recv_exact(sock, length)
        if payload is None:
            return
        request = parse_compile(payload)
        del payload
        try:
            _arm(request.memory_bytes, request.cpu_seconds)
            parts = _compile(engine, request.source)
        except MemoryError:
            os._exit(EXIT_OUT_OF_MEMORY)
        del request
        for part in parts:
            sock.sendall(part)
