"""The `suaveplan` host import module (ABI: docs/wasm-abi.md, include/suaveplan.h).

Every import decodes its arguments from guest memory with bounds checks (out of range →
`FAULT`, never a host exception), forwards one request to `Gateway.dispatch` (checker first,
adapter only on Allow) and answers with a WASI errno. No import raises into wasmtime (a
Python exception in a host function would become a trap carrying host detail) except
`BUDGET_EXCEEDED`, raised when the call's wallClockMs runs out while the import waits on an
async adapter: it ends the guest, and `WasmSandbox` receives it as itself.

What a guest hands the host is held to what a VM guest can send over its msgpack wire, so
nothing downstream (the checker, adapters, the event bus, a VM subscriber's codec) meets a
value only a WASM guest can make: text is strict UTF-8 (`INVAL` otherwise), and JSON is
decoded by `_json` alone — strict JSON (no `NaN`/`Infinity`, no float that overflows), no
lone UTF-16 surrogate from a `\\u` escape, integers within [-2**63, 2**64 - 1], nesting
at most `MAX_JSON_DEPTH` deep; anything else is `INVAL` before the gateway is asked.
What the host writes back is strict UTF-8 too: an adapter's answer that cannot be written
so (a BLOB or a non-finite REAL in a row, a secret value with a lone surrogate) is `IO`, and
nothing is written. Over-long input (`MAX_INPUT`) is `INVAL`; `FAULT` means only a
pointer/length outside guest memory.
"""

from __future__ import annotations

import base64
import json
import math
import re
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

import wasmtime

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.wasm._errno import Errno
from suaveplan_sandbox.wasm._memory import GuestMemory

if TYPE_CHECKING:
    from suaveplan_sandbox.wasm._sandbox import WasmSandbox

MODULE: Final = "suaveplan"
MAX_INPUT: Final = 1 << 20
# Sockets one sandbox may hold open at once: each is a host descriptor (and a connection).
# Past it `sock_connect` answers MFILE without asking the gateway.
MAX_SOCKETS: Final = 64
# `sock_connect` ports outside this range are INVAL before the gateway.
MIN_PORT: Final = 1
MAX_PORT: Final = 65535
# A socket send/recv blocks the guest thread at most this long, and never past the call's
# wallClockMs deadline (then the call ends with BUDGET_EXCEEDED wallClockMs).
_SOCK_TIMEOUT_S: Final = 30.0
_I32 = wasmtime.ValType.i32()
_NOSIGNAL: Final = getattr(socket, "MSG_NOSIGNAL", 0)
# The integers a guest's JSON may hold: msgpack's, the VM wire's (int64 and uint64).
MIN_JSON_INT: Final = -(2**63)
MAX_JSON_INT: Final = 2**64 - 1
# A `\u` escape of a UTF-16 surrogate: only where one appears can a lone one be decoded.
# How deep a guest's JSON may nest arrays and objects. The decoder's own bound depends on the
# Python version (about 1,000 on 3.11, C-stack-based and far deeper on 3.13), so one bound
# of our own, below both and above what anything downstream takes (an event payload nests
# at most 256 deep), judges every guest alike, before the gateway is asked.
MAX_JSON_DEPTH: Final = 512
_SURROGATE_ESCAPE: Final = re.compile(r"\\u[dD][89abcdefABCDEF]")


class _Fault(Exception):
    """A pointer/length lies outside guest memory: `FAULT`."""


class _Invalid(Exception):
    """The guest's argument is malformed (not UTF-8, not strict JSON, a value outside the
    wire's): `INVAL`."""


class _Unwritable(Exception):
    """The adapter's answer has a value the guest's JSON cannot carry: `IO`."""


def _view(caller: wasmtime.Caller, sb: WasmSandbox) -> GuestMemory:
    # The running guest's `memory` export, found before the call (the same extern
    # `caller.get("memory")` returns, without a lookup per import); looked up here when the
    # import runs during instantiation (a start function).
    mem = sb._guest_memory
    if mem is None:
        found = caller.get("memory")
        if not isinstance(found, wasmtime.Memory):
            raise _Fault
        mem = found
    return GuestMemory(mem, caller)


def _read(m: GuestMemory, ptr: int, length: int) -> bytes:
    """Copy an input: `FAULT` outside guest memory, else `INVAL` over `MAX_INPUT` bytes."""
    if not m.contains(ptr, length):
        raise _Fault
    if length > MAX_INPUT:
        raise _Invalid
    data = m.read(ptr, length)
    if data is None:  # pragma: no cover — `contains` said it lies inside
        raise _Fault
    return data


def _text(m: GuestMemory, ptr: int, length: int) -> str:
    try:
        return _read(m, ptr, length).decode("utf-8")
    except UnicodeDecodeError:
        raise _Invalid from None


def _json_int(text: str) -> int:
    # At most 20 digits and a sign: never a long conversion, whatever the guest sent.
    if len(text) > 21:
        raise _Invalid
    value = int(text)
    if not MIN_JSON_INT <= value <= MAX_JSON_INT:
        raise _Invalid
    return value


def _json_float(text: str) -> float:
    value = float(text)
    if value in (math.inf, -math.inf):  # `1e999`: not a number any peer can read back
        raise _Invalid
    return value


def _json_constant(_name: str) -> object:
    raise _Invalid  # NaN, Infinity, -Infinity: not JSON


def _too_deep(text: str, value: object) -> bool:
    """Whether `value` (decoded from `text`) nests arrays and objects past `MAX_JSON_DEPTH`.
    Fewer brackets than that in the text cannot nest that deep: the walk is skipped."""
    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH:
        return False
    level: list[tuple[object, int]] = [(value, 1)]
    while level:
        item, depth = level.pop()
        if type(item) is list:
            children: list[object] = item
        elif type(item) is dict:
            children = list(item.values())
        else:
            continue
        if depth > MAX_JSON_DEPTH:
            return True
        level.extend((child, depth + 1) for child in children)
    return False


def _json(m: GuestMemory, ptr: int, length: int) -> object:
    """The guest's JSON document at (ptr, length), held to the values the VM wire carries."""
    text = _text(m, ptr, length)
    try:
        value = json.loads(
            text,
            parse_int=_json_int,
            parse_float=_json_float,
            parse_constant=_json_constant,
        )
        if _too_deep(text, value):
            raise _Invalid
        if _SURROGATE_ESCAPE.search(text) is not None:
            # Escaped pairs were joined into one code point; a lone one fails to encode.
            json.dumps(value, ensure_ascii=False, check_circular=False).encode("utf-8")
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeEncodeError included
        raise _Invalid from None
    return value


def _dump(value: object) -> bytes:
    """`value` as compact, strict UTF-8 JSON for the guest; `_Unwritable` if it is not JSON."""
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        return text.encode("utf-8")
    except (TypeError, ValueError, RecursionError):
        raise _Unwritable from None


def _utf8(value: str) -> bytes:
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate (an environment variable's, say)
        raise _Unwritable from None


def _out(m: GuestMemory, data: bytes, buf: int, cap: int, len_out: int) -> int:
    """Write `data` into (buf, cap), its length at len_out; NOBUFS (length set) if short."""
    if not m.contains(buf, cap):
        return Errno.FAULT  # the declared buffer must lie wholly inside guest memory
    if not m.write_u32(len_out, len(data)):
        return Errno.FAULT
    if len(data) > cap:
        return Errno.NOBUFS
    if not m.write(buf, data):
        return Errno.FAULT
    return Errno.SUCCESS


def _errno(exc: SuaveplanError) -> int:
    if exc.code == "SAND_PERM_DENIED":
        return Errno.ACCES
    if exc.code == "SAND_CANCELLED":
        return Errno.CANCELED
    if exc.code == "SAND_ADAPTER_MISSING":
        return Errno.NOSYS
    if exc.code == "SAND_INVALID_ARGUMENT":  # the adapter refused the guest's argument
        return Errno.INVAL
    return Errno.IO


def _guarded(fn: Callable[..., int]) -> Callable[..., int]:
    def host(*args: object) -> int:
        try:
            return int(fn(*args))
        except _Fault:
            return Errno.FAULT
        except _Invalid:
            return Errno.INVAL
        except _Unwritable:
            return Errno.IO
        except SuaveplanError as exc:
            if exc.code == "BUDGET_EXCEEDED":
                raise  # wallClockMs ran out while the import waited: this ends the guest
            return _errno(exc)
        except (ValueError, TypeError):
            return Errno.INVAL
        except OSError:
            return Errno.IO
        except Exception:
            return Errno.IO

    return host


def define(linker: wasmtime.Linker, current: Callable[[], WasmSandbox]) -> None:
    """Define every `suaveplan.*` import on `linker`; `current()` is the calling sandbox.

    The linker is shared by every sandbox in the process (defining imports per store costs
    more than instantiating), so each import looks its sandbox up at call time.
    """

    def sock_connect(
        c: wasmtime.Caller, host_ptr: int, host_len: int, port: int, fd_out: int
    ) -> int:
        sb = current()
        m = _view(c, sb)
        host = _text(m, host_ptr, host_len)
        if not m.write_u32(fd_out, 0):
            return Errno.FAULT
        # The port arrives as a signed i32: a negative or too-large one is not a port, and is
        # never shown to the checker, the audit log or an adapter.
        if not MIN_PORT <= port <= MAX_PORT:
            return Errno.INVAL
        if len(sb._sockets) >= MAX_SOCKETS:
            return Errno.MFILE
        sock = sb._dispatch("fetch", "connect", {"host": host, "port": port})
        if not isinstance(sock, socket.socket):
            return Errno.IO
        fd = sb._next_fd
        sb._next_fd += 1
        sb._sockets[fd] = sock
        m.write_u32(fd_out, fd)
        return Errno.SUCCESS

    def sock_send(c: wasmtime.Caller, fd: int, buf: int, length: int, sent_out: int) -> int:
        sb = current()
        sock = sb._sockets.get(fd)
        if sock is None:
            return Errno.BADF
        m = _view(c, sb)
        data = _read(m, buf, length)
        if not m.write_u32(sent_out, 0):
            return Errno.FAULT
        sock.settimeout(sb._socket_timeout(_SOCK_TIMEOUT_S))
        try:
            # MSG_NOSIGNAL: a remote that closed costs an EPIPE (an errno for the guest),
            # never a SIGPIPE, whose default action ends a host that restored it.
            sent = sock.send(data, _NOSIGNAL)
        except TimeoutError:
            return sb._socket_timed_out()
        m.write_u32(sent_out, sent)
        return Errno.SUCCESS

    def sock_recv(c: wasmtime.Caller, fd: int, buf: int, cap: int, len_out: int) -> int:
        sb = current()
        sock = sb._sockets.get(fd)
        if sock is None:
            return Errno.BADF
        m = _view(c, sb)
        if not m.contains(buf, cap) or not m.write_u32(len_out, 0):
            return Errno.FAULT
        sock.settimeout(sb._socket_timeout(_SOCK_TIMEOUT_S))
        try:
            data = sock.recv(min(cap, MAX_INPUT))
        except TimeoutError:
            return sb._socket_timed_out()
        return _out(m, data, buf, cap, len_out)

    def sock_close(c: wasmtime.Caller, fd: int) -> int:
        sock = current()._sockets.pop(fd, None)
        if sock is None:
            return Errno.BADF
        sock.close()
        return Errno.SUCCESS

    def secrets_get(  # noqa: PLR0917 — the ABI is positional
        c: wasmtime.Caller, name_ptr: int, name_len: int, buf: int, cap: int, len_out: int
    ) -> int:
        sb = current()
        m = _view(c, sb)
        name = _text(m, name_ptr, name_len)
        value = sb._dispatch("secrets", "get", {"name": name})
        if not isinstance(value, str):
            return Errno.IO
        return _out(m, _utf8(value), buf, cap, len_out)

    def events_publish(c: wasmtime.Caller, t_ptr: int, t_len: int, p_ptr: int, p_len: int) -> int:
        sb = current()
        m = _view(c, sb)
        topic = _text(m, t_ptr, t_len)
        payload = _json(m, p_ptr, p_len) if p_len else None
        sb._dispatch("events", "publish", {"topic": topic, "payload": payload})
        return Errno.SUCCESS

    def db_query(  # noqa: PLR0917 — the ABI is positional
        c: wasmtime.Caller,
        sql_ptr: int,
        sql_len: int,
        params_ptr: int,
        params_len: int,
        buf: int,
        cap: int,
        len_out: int,
    ) -> int:
        sb = current()
        m = _view(c, sb)
        sql = _text(m, sql_ptr, sql_len)
        params = _json(m, params_ptr, params_len) if params_len else []
        if not isinstance(params, list):
            return Errno.INVAL
        result = sb._dispatch("db", "query", {"sql": sql, "params": params})
        return _out(m, _dump(result), buf, cap, len_out)

    def fetch(  # noqa: PLR0917 — the ABI is positional
        c: wasmtime.Caller, req_ptr: int, req_len: int, buf: int, cap: int, len_out: int
    ) -> int:
        sb = current()
        m = _view(c, sb)
        req = _json(m, req_ptr, req_len)
        if not isinstance(req, dict):
            return Errno.INVAL
        args: dict[str, object] = {
            "url": req.get("url"),
            "method": req.get("method", "GET"),
            "headers": req.get("headers", []),
            "body": base64.b64decode(req["body_base64"]) if "body_base64" in req else b"",
        }
        result = sb._dispatch("fetch", "request", args)
        if not isinstance(result, dict):
            return Errno.IO
        body = result.get("body", b"")
        encoded = {
            "status": result.get("status"),
            "headers": result.get("headers", []),
            "body_base64": base64.b64encode(body if isinstance(body, bytes) else b"").decode(),
        }
        return _out(m, _dump(encoded), buf, cap, len_out)

    table: dict[str, tuple[Callable[..., int], int]] = {
        "sock_connect": (sock_connect, 4),
        "sock_send": (sock_send, 4),
        "sock_recv": (sock_recv, 4),
        "sock_close": (sock_close, 1),
        "secrets_get": (secrets_get, 5),
        "events_publish": (events_publish, 4),
        "db_query": (db_query, 7),
        "fetch": (fetch, 5),
    }
    for name, (fn, arity) in table.items():
        ty = wasmtime.FuncType([_I32] * arity, [_I32])
        linker.define_func(MODULE, name, ty, _guarded(fn), access_caller=True)
