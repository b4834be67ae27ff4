"""The WASI preview 1 calls through which a guest could hold host resources past its budgets.

Theory of operation. wasmtime's WASI preview 1 is linked as it is, except four functions the
shared linker shadows with Python (`define`):

- `poll_oneoff`. wasmtime blocks the guest thread in host code for as long as the guest
  asks, up to 2**64 ns (`std::thread::sleep` for one relative clock, a poll otherwise).
  Neither the epoch deadline (it fires in guest code only), nor `dispose()`, nor the
  interpreter's exit reaches it: `call`/`run` answer at wallClockMs + `STUCK_GRACE_S`, but
  the thread (a non-daemon executor thread, so the host process cannot exit) and the store
  (guest memory, open files) stay for as long as the guest asked. A poll whose
  subscriptions are all clocks — the only kind that waits: wasmtime reports stdin,
  stdout/stderr and file subscriptions ready at once — is answered here instead: the guest
  thread waits on the sandbox's wake event until the earliest due time, never past the
  call's wallClockMs deadline (then the import raises BUDGET_EXCEEDED wallClockMs, which
  ends the guest as for an async adapter) and no longer than until the sandbox is disposed
  or ended (then it raises SAND_CANCELLED: the guest traps). The wait is taken in slices
  of at most `_WAIT_SLICE_S`: a due time 2**64 ns away is no number the platform's timed
  wait takes (it raised OverflowError, which ended the guest at once). Any other poll is
  wasmtime's.
- `path_open`, `fd_close`, `fd_renumber`. Every file or directory a guest opens is a host
  descriptor and wasmtime sets no limit, so a guest with any fs grant could take every
  descriptor of the host process (EMFILE for the host's own sockets and files) for as long
  as its instance lives. The guard counts the descriptors `path_open` handed out in each
  store, forgets those `fd_close` / `fd_renumber` closed, and answers `MFILE` past
  `MAX_OPEN_FILES` without opening anything. wasmtime opens the file *before* it writes
  the new descriptor's number to the guest's `fd_out`, and traps if it cannot: the file
  then stays open in the store, uncounted (one more per call). So `fd_out` is checked
  first — `INVAL` if misaligned, `FAULT` if outside guest memory, nothing opened — and the
  write that follows a successful open cannot fail (the guest cannot run, so cannot change
  its memory, while the host function runs).

All four end a guest that is still running after `dispose()` or its end (`SAND_CANCELLED`,
so it traps): the epoch tick ends guest code then (`_cpu.DisposeWatcher`), but not where
wasmtime cannot run the callback, and its store keeps the preopened directories until it
ends, so a looping guest used to go on opening the host's files.

wasmtime's own functions are reached through a helper instance in the guest's store, made
at its first shadowed call: WASI host functions read and write the memory the *calling*
instance exports as `memory`, so Python cannot call them itself; the helper imports the
guest's memory, exports it, and calls the WASI import from a one-instruction wasm body.
Being in the same store, it shares the guest's WASI context (descriptor table, clocks).
"""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Final, final

import wasmtime

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.wasm._errno import Errno
from suaveplan_sandbox.wasm._memory import GuestMemory

if TYPE_CHECKING:
    from suaveplan_sandbox.wasm._sandbox import WasmSandbox

WASI: Final = "wasi_snapshot_preview1"
# Descriptors `path_open` may hold open at once in one guest instance (store); preopens and
# stdio are not counted. Past it `path_open` answers MFILE.
MAX_OPEN_FILES: Final = 64
# The most subscriptions one `poll_oneoff` may name (wasmtime allows millions; reading them
# here costs host memory and time per call). More is NOMEM, wasmtime's own refusal.
MAX_POLL_SUBSCRIPTIONS: Final = 4096
# The longest single timed wait a clock poll makes; it loops until the due time.
_WAIT_SLICE_S: Final = 60.0
_SHADOWED: Final = ("poll_oneoff", "path_open", "fd_close", "fd_renumber")
_I32: Final = wasmtime.ValType.i32()
_I64: Final = wasmtime.ValType.i64()
_TYPES: Final = {
    "poll_oneoff": wasmtime.FuncType([_I32] * 4, [_I32]),
    "path_open": wasmtime.FuncType([_I32] * 5 + [_I64, _I64] + [_I32] * 2, [_I32]),
    "fd_close": wasmtime.FuncType([_I32], [_I32]),
    "fd_renumber": wasmtime.FuncType([_I32, _I32], [_I32]),
}
HELPER_WAT: Final = f"""
(module
  (import "{WASI}" "poll_oneoff" (func $poll (param i32 i32 i32 i32) (result i32)))
  (import "{WASI}" "path_open"
    (func $open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "{WASI}" "fd_close" (func $close (param i32) (result i32)))
  (import "{WASI}" "fd_renumber" (func $renumber (param i32 i32) (result i32)))
  (import "guest" "memory" (memory 0))
  (export "memory" (memory 0))
  (func (export "poll_oneoff") (param i32 i32 i32 i32) (result i32)
    (call $poll (local.get 0) (local.get 1) (local.get 2) (local.get 3)))
  (func (export "path_open") (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)
    (call $open (local.get 0) (local.get 1) (local.get 2) (local.get 3) (local.get 4)
      (local.get 5) (local.get 6) (local.get 7) (local.get 8)))
  (func (export "fd_close") (param i32) (result i32) (call $close (local.get 0)))
  (func (export "fd_renumber") (param i32 i32) (result i32)
    (call $renumber (local.get 0) (local.get 1))))
"""

# WASI p1 `subscription` (48 bytes, align 8): userdata, tag, then for a clock: id, timeout,
# precision, flags. `event` (32 bytes, align 8): userdata, error, type, nbytes, flags.
_SUBSCRIPTION: Final = struct.Struct("<QB7xI4xQQH6x")
_EVENT: Final = struct.Struct("<QHB5xQH6x")
_TAG_CLOCK: Final = 0
_CLOCK_REALTIME: Final = 0
_CLOCK_MONOTONIC: Final = 1
_ABSTIME: Final = 1


class _NoMemory(Exception):
    pass


def _guest_memory(sb: WasmSandbox, caller: wasmtime.Caller) -> GuestMemory:
    memory = sb._guest_memory or caller.get("memory")
    if not isinstance(memory, wasmtime.Memory):
        raise _NoMemory
    return GuestMemory(memory, caller)


@final
class StoreGuard:
    """One store's WASI bookkeeping: its monotonic clock's origin, the descriptors its guest
    opened, and the helper that reaches wasmtime's own functions (made at first use).

    `clock_origin_ns` is `time.monotonic_ns()` just after the store's WASI context was
    built (wasmtime's monotonic clock counts from then): an absolute monotonic timeout is
    met at `clock_origin_ns + timeout` or a little later, never earlier.
    """

    __slots__ = ("_helper", "clock_origin_ns", "opened")

    def __init__(self, clock_origin_ns: int) -> None:
        self.clock_origin_ns = clock_origin_ns
        self.opened: set[int] = set()
        self._helper: dict[str, wasmtime.Func] | None = None

    def helper(
        self, caller: wasmtime.Caller, wasi_linker: wasmtime.Linker, module: wasmtime.Module
    ) -> dict[str, wasmtime.Func]:
        if self._helper is None:
            memory = caller.get("memory")
            if not isinstance(memory, wasmtime.Memory):
                raise _NoMemory
            imports = [wasi_linker.get(caller, WASI, name) for name in _SHADOWED]
            exports = wasmtime.Instance(caller, module, [*imports, memory]).exports(caller)
            funcs = {name: exports[name] for name in _SHADOWED}
            self._helper = {k: f for k, f in funcs.items() if isinstance(f, wasmtime.Func)}
        return self._helper


_lock = threading.Lock()
_helpers: dict[int, tuple[wasmtime.Linker, wasmtime.Module]] = {}


def _wasi_only(eng: wasmtime.Engine) -> tuple[wasmtime.Linker, wasmtime.Module]:
    """A linker with wasmtime's WASI alone (the originals) and the compiled helper."""
    with _lock:
        found = _helpers.get(id(eng))
        if found is None:
            linker = wasmtime.Linker(eng)
            linker.define_wasi()
            found = _helpers[id(eng)] = (linker, wasmtime.Module(eng, HELPER_WAT))
        return found


def _wait_for_clocks(sb: WasmSandbox, due_ns: int) -> None:
    """Block until monotonic `due_ns`, the call's deadline (raises its breach), or the end of
    the sandbox (raises SAND_CANCELLED)."""
    while True:
        now = time.monotonic_ns()
        if now >= due_ns:
            return
        wait_s = min((due_ns - now) / 1e9, _WAIT_SLICE_S)
        deadline = sb._call_deadline
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise sb._wall_breach()
            wait_s = min(wait_s, left)
        if sb._wake.wait(wait_s) or sb._disposed or sb._ended is not None:
            raise SuaveplanError("SAND_CANCELLED", "the sandbox was disposed or ended")


def _clock_poll(
    sb: WasmSandbox,
    guard: StoreGuard,
    m: GuestMemory,
    subs: list[tuple[int, int, int, int, int, int]],
    *,
    out: int,
    nevents: int,
) -> int:
    """Answer a poll of clocks only: wait for the first, report every one then due."""
    now = time.monotonic_ns()
    wall_now = time.time_ns()
    due: list[int] = []
    for _userdata, _tag, clock, timeout, _precision, flags in subs:
        absolute = flags & _ABSTIME
        if clock == _CLOCK_MONOTONIC:
            due.append(guard.clock_origin_ns + timeout if absolute else now + timeout)
        elif clock == _CLOCK_REALTIME:
            due.append(now + max(0, timeout - wall_now) if absolute else now + timeout)
        else:
            return Errno.INVAL  # as wasmtime: only these two clocks can be waited on
    if out % 8 or nevents % 4:
        return Errno.INVAL
    if not m.contains(out, _EVENT.size * len(subs)) or not m.contains(nevents, 4):
        return Errno.FAULT
    _wait_for_clocks(sb, min(due))
    reached = time.monotonic_ns()
    count = 0
    for (userdata, *_), when in zip(subs, due, strict=True):
        if when <= reached:
            m.write(out + count * _EVENT.size, _EVENT.pack(userdata, 0, _TAG_CLOCK, 0, 0))
            count += 1
    m.write_u32(nevents, count)
    return Errno.SUCCESS


def define(linker: wasmtime.Linker, current: Callable[[], WasmSandbox]) -> None:
    """Shadow the four functions on `linker` (which already has wasmtime's WASI)."""
    wasi_linker, helper_module = _wasi_only(linker.engine)

    def running(sb: WasmSandbox) -> StoreGuard:
        # A guest still running after dispose() or its end (before the next epoch tick, or
        # where wasmtime cannot run the callback) still has its store's preopens: its next
        # shadowed call ends it at once.
        if sb._disposed or sb._ended is not None:
            raise SuaveplanError("SAND_CANCELLED", "the sandbox was disposed or ended")
        guard = sb._running_guard
        if guard is None:  # pragma: no cover — set whenever guest code of this sandbox runs
            raise SuaveplanError("SAND_CANCELLED", "no guest of this sandbox is running")
        return guard

    def original(c: wasmtime.Caller, guard: StoreGuard, name: str) -> wasmtime.Func:
        return guard.helper(c, wasi_linker, helper_module)[name]

    def poll_oneoff(c: wasmtime.Caller, in_: int, out: int, n: int, nevents: int) -> int:
        sb = current()
        guard = running(sb)
        count = n & 0xFFFFFFFF
        if count == 0:
            return Errno.INVAL  # as wasmtime: sleeping forever is not a p1 poll
        if count > MAX_POLL_SUBSCRIPTIONS:
            return Errno.NOMEM
        m = _guest_memory(sb, c)
        if in_ % 8:
            return Errno.INVAL
        raw = m.read(in_, _SUBSCRIPTION.size * count)
        if raw is None:
            return Errno.FAULT
        subs: list[tuple[int, int, int, int, int, int]] = list(_SUBSCRIPTION.iter_unpack(raw))
        if any(tag != _TAG_CLOCK for _, tag, *_ in subs):
            # An fd subscription is ready at once in wasmtime: this poll does not wait.
            return int(original(c, guard, "poll_oneoff")(c, in_, out, n, nevents))
        return _clock_poll(sb, guard, m, subs, out=out, nevents=nevents)

    def path_open(  # noqa: PLR0917 — the WASI signature is positional
        c: wasmtime.Caller,
        fd: int,
        dirflags: int,
        path: int,
        path_len: int,
        oflags: int,
        base: int,
        inheriting: int,
        fdflags: int,
        fd_out: int,
    ) -> int:
        sb = current()
        guard = running(sb)
        if len(guard.opened) >= MAX_OPEN_FILES:
            return Errno.MFILE
        # Where the new descriptor's number goes, checked before anything is opened (see the
        # module docstring): a u32, so aligned to 4, wholly inside guest memory.
        if fd_out % 4:
            return Errno.INVAL
        if not _guest_memory(sb, c).contains(fd_out, 4):
            return Errno.FAULT
        args = (fd, dirflags, path, path_len, oflags, base, inheriting, fdflags, fd_out)
        result = int(original(c, guard, "path_open")(c, *args))
        if result == Errno.SUCCESS:  # wasmtime wrote the new descriptor at fd_out
            opened = _guest_memory(sb, c).read(fd_out, 4)
            if opened is not None:
                guard.opened.add(int.from_bytes(opened, "little"))
        return result

    def fd_close(c: wasmtime.Caller, fd: int) -> int:
        guard = running(current())
        result = int(original(c, guard, "fd_close")(c, fd))
        if result == Errno.SUCCESS:
            guard.opened.discard(fd & 0xFFFFFFFF)
        return result

    def fd_renumber(c: wasmtime.Caller, fd: int, to: int) -> int:
        guard = running(current())
        result = int(original(c, guard, "fd_renumber")(c, fd, to))
        if result == Errno.SUCCESS:
            moved, replaced = fd & 0xFFFFFFFF, to & 0xFFFFFFFF
            guard.opened.discard(replaced)  # closed by the renumber
            if moved in guard.opened:
                guard.opened.discard(moved)
                guard.opened.add(replaced)
        return result

    table: dict[str, Callable[..., int]] = {
        "poll_oneoff": poll_oneoff,
        "path_open": path_open,
        "fd_close": fd_close,
        "fd_renumber": fd_renumber,
    }
    linker.allow_shadowing = True
    try:
        for name, fn in table.items():
            linker.define_func(WASI, name, _TYPES[name], _host(fn), access_caller=True)
    finally:
        linker.allow_shadowing = False


def _host(fn: Callable[..., int]) -> Callable[..., int]:
    """`fn` as a host function: a missing memory is FAULT; our own coded errors and traps
    (a wallClockMs breach, SAND_CANCELLED, wasmtime's own trap in the original) end the
    guest as they would from any import."""

    def host(*args: object) -> int:
        try:
            return fn(*args)
        except _NoMemory:
            return Errno.FAULT

    return host
