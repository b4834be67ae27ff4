"""The `suaveplan` host import module (ABI: docs/wasm-abi.md, include/suaveplan.h).

Every import decodes its arguments from guest memory with bounds checks (out of range →
`FAULT`, never a host exception), forwards one request to `Gateway.dispatch` (checker first,
adapter only on Allow) and answers with a WASI errno. No import raises into wasmtime: a
Python exception in a host function would become a trap carrying host detail.
"""

from __future__ import annotations

import base64
import json
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

import wasmtime

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.wasm import _memory
from suaveplan_sandbox.wasm._errno import Errno

if TYPE_CHECKING:
    from suaveplan_sandbox.wasm._sandbox import WasmSandbox

MODULE: Final = "suaveplan"
MAX_INPUT: Final = 1 << 20
_SOCK_TIMEOUT_S: Final = 30.0
_I32 = wasmtime.ValType.i32()


class _Fault(Exception):
    pass


def _memory_of(caller: wasmtime.Caller) -> wasmtime.Memory:
    mem = caller.get("memory")
    if not isinstance(mem, wasmtime.Memory):
        raise _Fault
    return mem


def _read(caller: wasmtime.Caller, ptr: int, length: int) -> bytes:
    if length > MAX_INPUT:
        raise _Fault
    data = _memory.read(_memory_of(caller), caller, ptr, length)
    if data is None:
        raise _Fault
    return data


def _text(caller: wasmtime.Caller, ptr: int, length: int) -> str:
    try:
        return _read(caller, ptr, length).decode("utf-8")
    except UnicodeDecodeError:
        raise _Fault from None


def _out(caller: wasmtime.Caller, data: bytes, buf: int, cap: int, len_out: int) -> int:
    """Write `data` into (buf, cap), its length at len_out; NOBUFS (length set) if short."""
    mem = _memory_of(caller)
    if _memory.read(mem, caller, buf, 0) is None or buf + cap > mem.data_len(caller):
        return Errno.FAULT  # the declared buffer must lie wholly inside guest memory
    if not _memory.write_u32(mem, caller, len_out, len(data)):
        return Errno.FAULT
    if len(data) > cap:
        return Errno.NOBUFS
    if not _memory.write(mem, caller, buf, data):
        return Errno.FAULT
    return Errno.SUCCESS


def _errno(exc: SuaveplanError) -> int:
    if exc.code == "SAND_PERM_DENIED":
        return Errno.ACCES
    if exc.code == "SAND_CANCELLED":
        return Errno.CANCELED
    if exc.code == "SAND_ADAPTER_MISSING":
        return Errno.NOSYS
    return Errno.IO


def _guarded(fn: Callable[..., int]) -> Callable[..., int]:
    def host(*args: object) -> int:
        try:
            return int(fn(*args))
        except _Fault:
            return Errno.FAULT
        except SuaveplanError as exc:
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
        host = _text(c, host_ptr, host_len)
        if not _memory.write_u32(_memory_of(c), c, fd_out, 0):
            return Errno.FAULT
        sock = current()._dispatch("fetch", "connect", {"host": host, "port": port})
        if not isinstance(sock, socket.socket):
            return Errno.IO
        sock.settimeout(_SOCK_TIMEOUT_S)
        fd = current()._next_fd
        current()._next_fd += 1
        current()._sockets[fd] = sock
        _memory.write_u32(_memory_of(c), c, fd_out, fd)
        return Errno.SUCCESS

    def sock_send(c: wasmtime.Caller, fd: int, buf: int, length: int, sent_out: int) -> int:
        sock = current()._sockets.get(fd)
        if sock is None:
            return Errno.BADF
        data = _read(c, buf, length)
        if not _memory.write_u32(_memory_of(c), c, sent_out, 0):
            return Errno.FAULT
        sent = sock.send(data)
        _memory.write_u32(_memory_of(c), c, sent_out, sent)
        return Errno.SUCCESS

    def sock_recv(c: wasmtime.Caller, fd: int, buf: int, cap: int, len_out: int) -> int:
        sock = current()._sockets.get(fd)
        if sock is None:
            return Errno.BADF
        mem = _memory_of(c)
        if _memory.read(mem, c, buf, cap) is None or not _memory.write_u32(mem, c, len_out, 0):
            return Errno.FAULT
        data = sock.recv(min(cap, MAX_INPUT))
        return _out(c, data, buf, cap, len_out)

    def sock_close(c: wasmtime.Caller, fd: int) -> int:
        sock = current()._sockets.pop(fd, None)
        if sock is None:
            return Errno.BADF
        sock.close()
        return Errno.SUCCESS

    def secrets_get(  # noqa: PLR0917 — the ABI is positional
        c: wasmtime.Caller, name_ptr: int, name_len: int, buf: int, cap: int, len_out: int
    ) -> int:
        name = _text(c, name_ptr, name_len)
        value = current()._dispatch("secrets", "get", {"name": name})
        if not isinstance(value, str):
            return Errno.IO
        return _out(c, value.encode("utf-8"), buf, cap, len_out)

    def events_publish(c: wasmtime.Caller, t_ptr: int, t_len: int, p_ptr: int, p_len: int) -> int:
        topic = _text(c, t_ptr, t_len)
        payload = json.loads(_text(c, p_ptr, p_len)) if p_len else None
        current()._dispatch("events", "publish", {"topic": topic, "payload": payload})
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
        sql = _text(c, sql_ptr, sql_len)
        params = json.loads(_text(c, params_ptr, params_len)) if params_len else []
        if not isinstance(params, list):
            return Errno.INVAL
        result = current()._dispatch("db", "query", {"sql": sql, "params": params})
        return _out(c, json.dumps(result, separators=(",", ":")).encode(), buf, cap, len_out)

    def fetch(  # noqa: PLR0917 — the ABI is positional
        c: wasmtime.Caller, req_ptr: int, req_len: int, buf: int, cap: int, len_out: int
    ) -> int:
        req = json.loads(_text(c, req_ptr, req_len))
        if not isinstance(req, dict):
            return Errno.INVAL
        args: dict[str, object] = {
            "url": req.get("url"),
            "method": req.get("method", "GET"),
            "headers": req.get("headers", []),
            "body": base64.b64decode(req["body_base64"]) if "body_base64" in req else b"",
        }
        result = current()._dispatch("fetch", "request", args)
        if not isinstance(result, dict):
            return Errno.IO
        body = result.get("body", b"")
        encoded = {
            "status": result.get("status"),
            "headers": result.get("headers", []),
            "body_base64": base64.b64encode(body if isinstance(body, bytes) else b"").decode(),
        }
        return _out(c, json.dumps(encoded, separators=(",", ":")).encode(), buf, cap, len_out)

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
