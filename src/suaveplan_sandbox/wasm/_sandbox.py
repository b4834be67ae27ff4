"""`create_wasm_sandbox`: a WASI preview 1 module under wasmtime with policy-derived preopens.

Theory of operation. Lifecycle table:

| state    | call/run                                         | dispose            |
|----------|--------------------------------------------------|--------------------|
| ready    | runs guest in worker → ready; a trap → ready     | → disposed         |
| running  | serialised behind a lock                         | cancels host calls |
|          | a budget breach or unexpected failure → ended    |                    |
| ended    | SAND_WASM_ENDED (cause: the breach)              | → disposed         |
| disposed | SAND_WASM_DISPOSED                               | no-op              |

A budget breach ends the guest (DESIGN: "the host ends the guest"): the store, instance and
sockets are dropped at once, and every later call or run is `SAND_WASM_ENDED`; `dispose()`
then closes the gateway as usual. A trap (guest bug) leaves the instance serving. Arguments
are checked against the export's parameter types before the guest runs
(`SAND_INVALID_ARGUMENT`), and no wasmtime exception leaves `call`/`run` untranslated.

`wallClockMs` is judged at the epoch ticks while guest code runs (by the epoch callback
that also ends a disposed sandbox's guest at the first tick after `dispose()`, `_cpu`; a
plain epoch deadline where wasmtime cannot run the callback), and a timeout on the wait while
the guest is blocked in a host import that awaits an async adapter: at the call's deadline
the adapter task is cancelled and the host import ends the guest with `BUDGET_EXCEEDED`.
Socket I/O times out at the deadline too. A synchronous adapter cannot be interrupted: a
call still held in host code `STUCK_GRACE_S` past its deadline is answered `BUDGET_EXCEEDED`
by `call`/`run` themselves (`_await_guest`, `_abandon`), and the stuck thread, when the
adapter returns, finds the sandbox ended and unwinds without running more guest code.

The guest runs in a per-sandbox worker thread so host imports can block: each `suaveplan.*`
import calls `gateway.dispatch_sync(...)` on the guest thread — the same admission, audit
and metrics as `dispatch`, there is no second permission path — and only an async adapter
is awaited on the event loop (`run_coroutine_threadsafe`). `dispose()` closes the
gateway (in-flight adapter calls are cancelled and later imports get `CANCELED`), drops the
store, instance and sockets, and closes the preopen descriptors by dropping the store; guest
code still running ends at the next epoch tick (`_cpu`), its call `SAND_WASM_DISPOSED`.

A module's start function is guest code like any export: it runs on the guest thread under
the call's budgets (create awaits it there; a run arms its budgets before instantiating), so
it can neither hold the event loop nor outlive wallClockMs, and its trap is a trap
(`SAND_WASM_TRAP`, `details.stage="start"`), not a failure to instantiate. A new module is read and
compiled off the loop too (`max_module_bytes` bounds the file, `compile_limits` the compile,
which runs in the compile child). `run` keeps at most
`max_output_bytes` of stdout and of stderr (`_output`), and the WASI calls that could hold
host resources past a budget — sleeping in `poll_oneoff`, descriptors from `path_open` —
are the host's own (`_wasi_guard`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import os
import socket
import tempfile
import threading
import time
import traceback
import weakref
from collections import deque
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Final, Generic, NoReturn, TypeVar, final

import wasmtime

from suaveplan_sandbox._create_arguments import (
    bad_argument,
    check_common_create_arguments,
    check_path_argument,
)
from suaveplan_sandbox.adapters._beneath import open_directory, openat2_available
from suaveplan_sandbox.adapters._openat2 import (
    KERNEL_FILESYSTEM_TYPES,
    KERNEL_FILESYSTEMS,
    filesystem_type,
)
from suaveplan_sandbox.adapters._protocols import Adapters, AuditRecord, AuditSink
from suaveplan_sandbox.errors import SuaveplanError, WireValue
from suaveplan_sandbox.gateway import Gateway
from suaveplan_sandbox.metrics import BUDGET_EXCEEDED, InMemoryMetrics, MetricsSink
from suaveplan_sandbox.permissions import (
    BudgetTracker,
    Deny,
    DenyReason,
    PermissionChecker,
    PermissionPolicy,
)
from suaveplan_sandbox.permissions._clock import Clock
from suaveplan_sandbox.wasm import _engine, _mounts
from suaveplan_sandbox.wasm._compile_bounds import DEFAULT_COMPILE_LIMITS, CompileLimits
from suaveplan_sandbox.wasm._cpu import (
    CallWatch,
    CpuWatcher,
    DisposeWatcher,
    WallWatch,
    epoch_hook_available,
)
from suaveplan_sandbox.wasm._errno import Errno
from suaveplan_sandbox.wasm._instrument import REFUSALS_EXPORT, REFUSED_PAGES_EXPORT, Instrumented
from suaveplan_sandbox.wasm._output import DEFAULT_MAX_OUTPUT_BYTES, OutputCapture
from suaveplan_sandbox.wasm._wasi_guard import StoreGuard

_NO_DEADLINE: Final = 1 << 62
_PAGE: Final = 65536
# Under memoryMb: how many tables a store may create, and wasmtime's size of one element.
MAX_TABLES: Final = 4
_TABLE_ELEMENT_BYTES: Final = 8
_I32: Final = wasmtime.ValType.i32()
# How long past its wallClockMs deadline a guest call may stay in host code (a synchronous
# adapter that does not return, a blocking WASI read) before `call`/`run` answer
# BUDGET_EXCEEDED and leave the stuck guest thread behind (`_await_guest`). Guest code is
# interrupted within one tick of the deadline, so only a thread held in host code gets here.
STUCK_GRACE_S: Final = 0.25
# The most recent denials a handle keeps (`WasmSandbox.denials`); `denials_total` counts all.
MAX_DENIALS: Final = 256
# Integer arguments: either the signed or the unsigned reading of the type's bits is accepted
# (the guest sees the same bits); anything wider is refused, never wrapped.
_INT_RANGES: Final = {"i32": (-(2**31), 2**32 - 1), "i64": (-(2**63), 2**64 - 1)}


def byte_limit(value: object, *, argument: str, minimum: int) -> int:
    """`value` as a size limit: an `int` (not `bool`) >= `minimum`, else SAND_INVALID_ARGUMENT."""
    if type(value) is not int or value < minimum:
        raise SuaveplanError(
            "SAND_INVALID_ARGUMENT",
            f"{argument} must be an int >= {minimum}",
            {"argument": argument},
        )
    return value


def _invalid_argument(export: str, message: str, **details: WireValue) -> SuaveplanError:
    return SuaveplanError("SAND_INVALID_ARGUMENT", message, {"export": export, **details})


def param_kinds(params: Sequence[wasmtime.ValType]) -> tuple[str, ...]:
    """An export's parameter types as names (`i32`, `f64`, …; comparing ValTypes is FFI)."""
    return tuple(str(ty) for ty in params)


def coerce_arguments(
    export: str, params: Sequence[str], args: Sequence[object]
) -> list[int | float]:
    """`args` checked against an export's parameter types, as wasmtime should receive them.

    i32/i64 take an `int` (not `bool`) in the signed or unsigned range of the type, passed
    on as the signed value with the same bits; f32/f64 take an `int` or `float` (not `bool`).
    Wrong arity or any other parameter type (v128, references) is `SAND_INVALID_ARGUMENT`.
    """
    if len(args) != len(params):
        raise _invalid_argument(
            export, "wrong number of arguments", expected=len(params), got=len(args)
        )
    out: list[int | float] = []
    for index, (kind, value) in enumerate(zip(params, args, strict=True)):
        bounds = _INT_RANGES.get(kind)
        if bounds is not None:
            lo, hi = bounds
            if type(value) is not int:
                raise _invalid_argument(
                    export, "an integer argument is required", index=index, param=kind
                )
            if not lo <= value <= hi:
                raise _invalid_argument(
                    export, "an integer argument is out of range", index=index, param=kind
                )
            bits = 32 if kind == "i32" else 64
            out.append(value - (1 << bits) if value >= 1 << (bits - 1) else value)
        elif kind in {"f32", "f64"}:
            if type(value) not in (int, float):
                raise _invalid_argument(
                    export, "a number argument is required", index=index, param=kind
                )
            try:
                out.append(float(value))  # type: ignore[arg-type]
            except OverflowError:
                raise _invalid_argument(
                    export, "a number argument is out of range", index=index, param=kind
                ) from None
        else:
            raise _invalid_argument(
                export,
                "the export takes a parameter type the host cannot pass",
                index=index,
                param=kind,
            )
    return out


def _drop_frames(error: BaseException) -> BaseException:
    """Clear the locals of finished frames in `error`'s tracebacks (and its causes').

    Those frames (the guest thread's) hold the store, instance and handle; an error a
    caller keeps must not keep a disposed sandbox's memory and descriptors alive. The
    traceback's file/line information stays.
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if current.__traceback__ is not None:
            traceback.clear_frames(current.__traceback__)
        current = current.__cause__ or current.__context__
    return error


_T = TypeVar("_T")


@final
class _OneShot(Generic[_T]):
    """A callable for the guest thread that lets go of its target once called.

    The executor's work item outlives the call: its thread drops it only after the caller's
    future already has the result or error, so a bound method held there would keep the
    handle alive, for a moment, after `dispose()` (and past the caller's own clean-up).
    """

    __slots__ = ("_fn",)

    def __init__(self, fn: Callable[..., _T]) -> None:
        self._fn: Callable[..., _T] | None = fn

    def __call__(self, *args: Any) -> _T:
        fn, self._fn = self._fn, None
        assert fn is not None, "a one-shot call ran twice"
        return fn(*args)


@final
class _CallStart:
    """When the guest call behind one `call`/`run` began: set on the guest thread once armed.

    `deadline` is the call's wallClockMs deadline (monotonic), or None without one. Only the
    call and its waiter hold it (not the handle).
    """

    __slots__ = ("deadline", "started")

    def __init__(self) -> None:
        self.started = False
        self.deadline: float | None = None


def _refuse_dropped(owner: weakref.ref[WasmSandbox]) -> NoReturn:
    """The coded error for a queued call the sandbox dropped without running it."""
    sb = owner()
    if sb is not None:
        sb._check_alive()  # SAND_WASM_DISPOSED, or SAND_WASM_ENDED with the breach
        del sb
    raise SuaveplanError("SAND_WASM_DISPOSED", "the sandbox was disposed")


async def _await_guest(
    work: concurrent.futures.Future[_T],
    start: _CallStart,
    owner: weakref.ref[WasmSandbox],
    *,
    wall_ms: float | None,
) -> _T:
    """The guest call's outcome; or BUDGET_EXCEEDED once it is held in host code too long.

    Without wallClockMs there is nothing to hold the call to: wait for it. With it, a call
    still unfinished `STUCK_GRACE_S` after its deadline is stuck in host code (guest code
    would have been interrupted): the sandbox is ended without it (`WasmSandbox._abandon`)
    and the caller gets the breach now. The thread stays behind until the host code returns;
    it then finds the sandbox ended and unwinds without running more guest code. A call
    still queued behind another when the sandbox ends or is disposed is refused with the
    sandbox's coded error, never a bare CancelledError (that would read as the caller's own
    task being cancelled); a caller that cancels its own call still sees its cancellation.
    """
    fut = asyncio.wrap_future(work)
    if wall_ms is None:
        try:
            await asyncio.wait((fut,))
        except asyncio.CancelledError:
            fut.cancel()  # as `await fut` would: the caller gave up on the outcome
            raise
        if work.cancelled():  # a queued call dropped by dispose()
            _refuse_dropped(owner)
        return await fut
    while True:
        if start.started:
            assert start.deadline is not None
            timeout = max(0.0, start.deadline + STUCK_GRACE_S - time.monotonic())
        else:  # queued behind another call of this sandbox: look again in a budget's time
            timeout = wall_ms / 1000.0 + STUCK_GRACE_S
        try:
            done, _ = await asyncio.wait((fut,), timeout=timeout)
        except asyncio.CancelledError:
            fut.cancel()  # as `await fut` would: the caller gave up on the outcome
            raise
        if done or work.done():
            if work.cancelled():  # a queued call dropped by dispose()
                _refuse_dropped(owner)
            return await fut
        sb = owner()
        if sb is None:  # pragma: no cover — the caller's own frame holds no handle
            raise SuaveplanError("SAND_WASM_DISPOSED", "the sandbox was disposed")
        if not start.started:
            if sb.state == "ready":
                del sb
                continue
            if work.cancel():  # still queued: it never runs
                sb._check_alive()  # SAND_WASM_ENDED (with the breach) or SAND_WASM_DISPOSED
            del sb
            continue
        assert start.deadline is not None
        if time.monotonic() < start.deadline + STUCK_GRACE_S:
            del sb
            continue
        fut.cancel()  # its outcome, whenever the thread gets there, is nobody's
        error = sb._abandon()
        del sb
        raise error


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class PreopenSpec:
    """One WASI preopen: host directory, guest path, writable."""

    host: Path
    guest: str
    writable: bool


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class RunResult:
    """A WASI command's exit code and output.

    `stdout` and `stderr` each hold at most the sandbox's `max_output_bytes`; a stream the
    guest wrote more to is cut there and marked `stdout_truncated` / `stderr_truncated`
    (its writes past the limit failed with `EIO`; see `_output`).
    """

    exit_code: int
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool = False
    stderr_truncated: bool = False


def memory_limits(memory_mb: int) -> dict[str, int]:
    """wasmtime store limits that hold the guest to `memory_mb` MiB of memory and as much again
    of tables.

    wasmtime's `memory_size` and `table_elements` bound *each* memory and table, and a store
    may by default create 10,000 of each: without a count, a multi-memory module could take
    `memory_mb` per memory and a `(table 50000000 funcref)` 400 MB, both under a 16 MiB
    budget. So one linear memory (a module declaring more fails to instantiate), at most
    `MAX_TABLES` tables, and elements (8 bytes each, wasmtime's figure) that together fit in
    `memory_mb`.
    """
    size = memory_mb * 1024 * 1024
    return {
        "memory_size": size,
        "memories": 1,
        "tables": MAX_TABLES,
        "table_elements": max(1, size // _TABLE_ELEMENT_BYTES // MAX_TABLES),
    }


def _rule_directory(rule: str) -> tuple[str | None, bool]:
    """(root-relative directory or None, writable) for one fs rule — fallback derivation."""
    writable = rule.startswith("rw:")
    text = rule[3:] if writable else rule
    while text.startswith("./"):
        text = text[2:]
    parts = [p for p in text.split("/") if p not in ("", ".")]
    if parts and parts[-1] == "*":
        parts = parts[:-1]
        if not any("*" in p for p in parts):
            return "/".join(parts) or ".", writable
        return None, writable
    return None, writable


def preopens_for(policy: PermissionPolicy) -> list[tuple[str, str | None, bool]]:
    """(rule, directory-or-None, writable) for every fs rule of the policy."""
    fs = policy.fs
    getter = getattr(fs, "preopens", None)
    if callable(getter):
        return [(str(p.rule), p.directory, bool(p.writable)) for p in getter()]
    out = []
    for rule in policy.fs_rules:
        directory, writable = _rule_directory(rule)
        out.append((rule, directory, writable))
    return out


def resolve_preopens(policy: PermissionPolicy, checker: PermissionChecker) -> list[PreopenSpec]:
    """Preopens from the policy; a rule that is not a directory preopen refuses creation.

    The refusal counts `plugin.permission_denied_total{capability="fs",
    reason="path-not-in-allowlist"}`: the rule grants something a preopen cannot express
    without widening, so the request for that preopen is outside what can be allowed.
    """
    rules = preopens_for(policy)
    if not rules:
        return []  # nothing to resolve: skips the root's realpath on every create
    root = policy.root.resolve()
    specs: list[PreopenSpec] = []
    for rule, directory, writable in rules:
        host = (root / directory).resolve() if directory is not None else None
        # The directory itself, reached without a symlink: one inside the root may have been
        # planted by a guest holding a writable preopen above it (`rw:data/*` plus
        # `data/link/*`, `link -> ../private`), and following it would preopen what no
        # rule grants.
        if host is None or not host.is_dir() or host != root / str(directory):
            checker.deny("fs", DenyReason.PATH_NOT_IN_ALLOWLIST)
            raise SuaveplanError(
                "SAND_WASM_PREOPEN_DENIED",
                "an fs rule cannot be expressed as a WASI preopen without widening it",
                {"capability": "fs", "rule": rule},
            )
        guest = "/" if directory in (".", "") else "/" + str(directory)
        specs.append(PreopenSpec(host=host, guest=guest, writable=writable))
    return specs


_FD_PATHS: Final = Path("/proc/self/fd")
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def open_preopens(preopens: Sequence[PreopenSpec]) -> list[int]:
    """A descriptor for each preopen's directory, opened without following any symlink.

    A store's WASI context opens its preopens by path at every instantiation (each `run`),
    after the guest may have replaced a vetted directory with a symlink (or removed it): the
    contexts open these descriptors instead (`preopen_path`), so every run gets the
    directories vetted at create. Refused (`SAND_WASM_PREOPEN_DENIED`) if one is no longer
    a directory reached without a symlink.
    """
    fds: list[int] = []
    if not preopens:
        return fds
    try:
        # Every component from `/` down, the host's own included, is a directory reached
        # without a link (`resolve_preopens` vetted the resolved path): `_beneath`'s walk,
        # shared with `BeneathRootFs`, in one `openat2` where the kernel has it.
        use_openat2 = openat2_available()
        top = os.open("/", _DIR_FLAGS)
        try:
            for spec in preopens:
                fds.append(open_directory(top, spec.host.parts[1:], use_openat2=use_openat2))
        finally:
            os.close(top)
    except OSError as exc:
        for fd in fds:
            os.close(fd)
        raise SuaveplanError(
            "SAND_WASM_PREOPEN_DENIED",
            "a preopen directory could not be opened without following a symlink",
            {"capability": "fs"},
        ) from exc
    try:
        refuse_kernel_filesystems(preopens, fds)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return fds


_KERNEL_NAMES: Final = {magic: name for name, magic in KERNEL_FILESYSTEM_TYPES.items()}


def refuse_kernel_filesystems(preopens: Sequence[PreopenSpec], fds: Sequence[int]) -> None:
    """Refuse a preopen on a kernel filesystem, or holding a mount of one.

    wasmtime resolves the guest's paths beneath the descriptor itself, crossing mount points,
    so what the fs adapter refuses per request (`KERNEL_FILESYSTEMS`: procfs, sysfs, ...)
    must be kept out of the preopen as a whole: its directory's own filesystem (fstatfs on
    the held descriptor), then every mount at or beneath its real path in
    `/proc/self/mountinfo`, read once for all of them (`_mounts`). Refused with
    `SAND_WASM_PREOPEN_DENIED`, `details.reason="kernel-filesystem"`; a mount table that
    cannot be read or parsed fails closed (`"mounts-unreadable"`). The host's mounts, not a
    plugin's request: no metric.
    """
    for spec, fd in zip(preopens, fds, strict=True):
        magic = filesystem_type(fd)
        if magic in KERNEL_FILESYSTEMS:
            _refuse_kernel_filesystem(spec, _KERNEL_NAMES[magic])
    data = _mounts.read_mountinfo()
    try:
        if data is None:
            raise ValueError("unreadable")
        mounts = _mounts.kernel_mounts(data)
    except ValueError:
        raise SuaveplanError(
            "SAND_WASM_PREOPEN_DENIED",
            "the mount table (/proc/self/mountinfo) could not be read to vet the preopens",
            {"capability": "fs", "reason": "mounts-unreadable"},
        ) from None
    for spec in preopens:
        found = _mounts.kernel_mount_beneath(PurePosixPath(spec.host), mounts)
        if found is not None:
            _refuse_kernel_filesystem(spec, found[1])


def _refuse_kernel_filesystem(spec: PreopenSpec, fstype: str) -> NoReturn:
    raise SuaveplanError(
        "SAND_WASM_PREOPEN_DENIED",
        "a preopen directory is on, or holds a mount of, a kernel filesystem",
        {
            "capability": "fs",
            "reason": "kernel-filesystem",
            "guest_path": spec.guest,
            "filesystem": fstype,
        },
    )


@final
class _HeldDirs:
    """A sandbox's preopen descriptors; `close()` is idempotent and also runs if the handle
    is collected undisposed. The lock keeps `close()` from running while a WASI context is
    being given them (a closed number may be reused by any open in the process)."""

    __slots__ = ("fds", "lock")

    def __init__(self, fds: list[int]) -> None:
        self.lock = threading.Lock()
        self.fds: list[int] | None = fds

    def close(self) -> None:
        with self.lock:
            fds, self.fds = self.fds, None
        for fd in fds or ():
            os.close(fd)


def preopen_path(fd: int, spec: PreopenSpec) -> str:
    """The path a WASI context opens for a preopen: its held descriptor where /proc has one
    (the directory itself, whatever its path names now), else the path vetted at create."""
    return f"{_FD_PATHS}/{fd}" if _FD_PATHS.is_dir() else str(spec.host)


def refuse_unquoted_preopens(preopens: Sequence[PreopenSpec], adapters: Adapters | None) -> None:
    """Refuse a writable preopen when the host's fs adapter has a disk quota.

    A guest writes through a `rw:` preopen with WASI's own file calls, which never pass the
    fs adapter, so its `max_root_bytes` (`BeneathRootFs`) could not hold them: the quota
    the host set would be silently weaker than it says. So creation fails instead
    (`SAND_WASM_PREOPEN_DENIED`, `details.reason="quota-unenforceable"`); the host drops the
    quota for this plugin, makes the rule read-only, or puts the root on a filesystem with
    its own quota. Not a permission denial (the manifest may grant the rule): no metric.
    """
    quota = getattr(adapters.fs if adapters is not None else None, "max_root_bytes", None)
    if quota is None:
        return
    for spec in preopens:
        if spec.writable:
            raise SuaveplanError(
                "SAND_WASM_PREOPEN_DENIED",
                "a writable preopen's writes bypass the fs adapter's max_root_bytes quota",
                {"capability": "fs", "reason": "quota-unenforceable", "guest_path": spec.guest},
            )


# The sandbox whose guest is running on this thread (each sandbox runs its guest on its own
# worker thread); the shared linker's host imports find their sandbox here.
_current = threading.local()
_linker_lock = threading.Lock()
_linkers: dict[int, wasmtime.Linker] = {}


def _current_sandbox() -> WasmSandbox:
    sb = getattr(_current, "sb", None)
    if not isinstance(sb, WasmSandbox):
        raise SuaveplanError("SAND_CANCELLED", "no sandbox is running on this thread")
    return sb


def _shared_linker(eng: wasmtime.Engine) -> wasmtime.Linker:
    from suaveplan_sandbox.wasm import _wasi_guard
    from suaveplan_sandbox.wasm._imports import define

    with _linker_lock:
        linker = _linkers.get(id(eng))
        if linker is None:
            linker = wasmtime.Linker(eng)
            linker.define_wasi()
            _wasi_guard.define(linker, _current_sandbox)  # poll_oneoff, path_open, ...
            define(linker, _current_sandbox)
            _linkers[id(eng)] = linker
        return linker


# Module -> its imports resolved once against the shared linker (wasmtime's InstancePre), so
# a create does no import resolution. A module that fails to link is not remembered.
_pres: weakref.WeakKeyDictionary[wasmtime.Module, wasmtime.InstancePre] = (
    weakref.WeakKeyDictionary()
)


def _instance_pre(module: wasmtime.Module) -> wasmtime.InstancePre:
    with _linker_lock:
        pre = _pres.get(module)
    if pre is not None:
        return pre
    try:
        pre = _shared_linker(_engine.engine()).instantiate_pre(module)
    except wasmtime.WasmtimeError as exc:
        raise _engine.translate(exc, during="instantiate") from _engine.guest_cause(exc)
    with _linker_lock:
        return _pres.setdefault(module, pre)


@final
class WasmSandbox:
    """A handle on one instantiated module. Use `async with` or call `dispose()`."""

    def __init__(
        self,
        *,
        module: wasmtime.Module,
        imports_wasi: bool = True,
        policy: PermissionPolicy,
        gateway: Gateway,
        preopens: Sequence[PreopenSpec],
        metrics: MetricsSink,
        loop: asyncio.AbstractEventLoop,
        denials: deque[SuaveplanError],
        denial_total: Callable[[], int] | None = None,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        start_later: bool = False,
    ) -> None:
        """`start_later`: instantiate in `_start_off_loop` (a module with a start function)."""
        self._max_output = byte_limit(max_output_bytes, argument="max_output_bytes", minimum=0)
        self._module = module
        self._pre = _instance_pre(module)
        grow = _engine.grow_instrumentation(module)
        # Whether the module records refused grows (`_instrument`): the memoryMb verdict is
        # then exact, judged against memory 0's declared maximum (pages); inferred otherwise.
        self._grow_recorded = isinstance(grow, Instrumented)
        self._grow_max = grow.declared_max_pages if isinstance(grow, Instrumented) else None
        # The running instance's refusal counter (a global the rewrite exports), read at
        # the first call.
        self._refusals: wasmtime.Global | None = None
        self._imports_wasi = imports_wasi
        self._policy = policy
        self._gateway = gateway
        self._preopens = tuple(preopens)
        self._metrics = metrics
        self._loop = loop
        self._denials = denials
        self._denial_total = denial_total or (lambda: len(denials))
        self._lock = threading.Lock()
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._sockets: dict[int, socket.socket] = {}
        self._next_fd = 3
        self._disposed = False
        # The breach that ended the guest (state `ended`), if any.
        self._ended: SuaveplanError | None = None
        # monotonic deadline of the call in progress (wallClockMs), for host-import waits.
        self._call_deadline: float | None = None
        # The breach a host import raised during the call in progress (see `_on_loop`).
        self._import_breach: SuaveplanError | None = None
        # Whether the call in progress already counted its breach (`_budget`): the guest
        # thread and `_abandon` may both judge one call; the metric counts it once.
        self._breach_counted = False
        self._breach_lock = threading.Lock()
        self._store: wasmtime.Store | None = None
        self._instance: wasmtime.Instance | None = None
        # The long-lived instance's exports, read on the first call (not at create).
        self._exports: Mapping[str, object] | None = None
        # Parameter types per export, read at its first call (a type query costs FFI calls).
        self._params: dict[str, tuple[str, ...]] = {}
        # The running guest's exported `memory`, for host imports (saves a lookup per import).
        # Only set while a guest of this store runs: it must never meet another store.
        self._guest_memory: wasmtime.Memory | None = None
        # Set once the sandbox is disposed (or ended): wakes a guest sleeping in
        # `poll_oneoff`, and ends one running guest code at the next epoch tick.
        self._wake = threading.Event()
        # cpuPercent: thread CPU time sampled by an epoch callback on the guest thread.
        self._cpu = CpuWatcher(self._wake) if policy.budgets.cpu_percent is not None else None
        # No cpuPercent: the epoch tick that ends the guest once the sandbox is disposed, and
        # judges wallClockMs when set (`DisposeWatcher`). None where wasmtime cannot run it:
        # wallClockMs is then a plain epoch deadline, and a guest runs until that budget
        # ends it, or without one until it returns (docs/security.md, Known gaps).
        self._ends_on_dispose = (
            DisposeWatcher(self._wake) if self._cpu is None and epoch_hook_available() else None
        )
        # The WASI bookkeeping of the long-lived store, and of the store whose guest code
        # runs now (`_wasi_guard`; set while it runs).
        self._guard: StoreGuard | None = None
        self._running_guard: StoreGuard | None = None
        # The preopen directories, held from create to dispose (`open_preopens`).
        self._dirs = _HeldDirs(open_preopens(self._preopens) if imports_wasi else [])
        weakref.finalize(self, self._dirs.close)
        if not start_later:
            try:
                self._store, self._instance, _, self._guard = self._instantiate(
                    argv=(), stdin=None, out=None, err=None, began=None
                )
            except BaseException:
                self._dirs.close()
                raise

    # -- public ----------------------------------------------------------------------------

    @property
    def denials(self) -> tuple[SuaveplanError, ...]:
        """The most recent denials (at most `MAX_DENIALS`), oldest first."""
        return tuple(self._denials)

    @property
    def denials_total(self) -> int:
        """Every denial this handle saw, including those `denials` no longer holds."""
        return self._denial_total()

    @property
    def state(self) -> str:
        """`ready`, `ended` (a budget breach ended the guest) or `disposed`."""
        if self._disposed:
            return "disposed"
        return "ended" if self._ended is not None else "ready"

    @property
    def preopens(self) -> tuple[PreopenSpec, ...]:
        return self._preopens

    @property
    def disposed(self) -> bool:
        return self._disposed

    async def call(self, export: str, *args: int | float) -> Any:
        # This frame is in the traceback of every error raised here, and the guest thread's
        # frames are in its cause's: neither may keep the handle (and its store) alive.
        start = _CallStart()
        try:
            self._check_alive()
            work = self._worker().submit(_OneShot(self._call_sync), export, args, start)
            owner, wall = weakref.ref(self), self._policy.budgets.wall_clock_ms
        except SuaveplanError as exc:
            del self
            _drop_frames(exc)
            raise
        del self
        try:
            return await _await_guest(work, start, owner, wall_ms=wall)
        except SuaveplanError as exc:
            _drop_frames(exc)
            raise

    async def run(self, *, argv: Sequence[str] = (), stdin: bytes = b"") -> RunResult:
        """Run the module's `_start` with `argv` (a sequence of `str`) and `stdin` (`bytes`,
        `bytearray` or `memoryview`); any other argument is `SAND_INVALID_ARGUMENT` naming
        it, refused before the guest runs."""
        start = _CallStart()
        try:  # see `call`
            # A str is a sequence of strs (each letter an argument); C stops an argument at
            # NUL and wasmtime encodes it as UTF-8: refuse each here, not as a host TypeError.
            if isinstance(argv, str | bytes | bytearray | memoryview) or not isinstance(
                argv, Sequence
            ):
                raise bad_argument("argv", "argv must be a sequence of str (not a str)", argv)
            args = tuple(argv)
            for i, arg in enumerate(args):
                if not isinstance(arg, str):
                    raise bad_argument("argv", f"argv[{i}] must be a str", arg)
                if "\x00" in arg:
                    raise bad_argument("argv", f"argv[{i}] holds a NUL character", arg)
                try:
                    arg.encode()
                except UnicodeEncodeError:  # a lone surrogate
                    raise bad_argument("argv", f"argv[{i}] is not valid UTF-8", arg) from None
            if not isinstance(stdin, bytes | bytearray | memoryview):
                raise bad_argument("stdin", "stdin must be bytes, bytearray or memoryview", stdin)
            try:
                data = bytes(stdin)  # a snapshot: the caller may reuse its buffer meanwhile
            except ValueError:  # a released memoryview
                raise bad_argument("stdin", "stdin is a released memoryview", stdin) from None
            self._check_alive()
            work = self._worker().submit(_OneShot(self._run_sync), args, data, start)
            owner, wall = weakref.ref(self), self._policy.budgets.wall_clock_ms
        except SuaveplanError as exc:
            del self
            _drop_frames(exc)
            raise
        del self
        try:
            return await _await_guest(work, start, owner, wall_ms=wall)
        except SuaveplanError as exc:
            _drop_frames(exc)
            raise

    async def dispose(self) -> None:
        if self._disposed:
            return
        self._disposed = True
        await self._gateway.close()
        self._release()

    def dispose_nowait(self) -> None:
        if self._disposed:
            return
        self._disposed = True
        self._gateway.close_nowait()
        self._release()

    async def __aenter__(self) -> WasmSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.dispose()

    # -- internals -------------------------------------------------------------------------

    def _worker(self) -> concurrent.futures.ThreadPoolExecutor:
        # Created on first use: most of a create's cost would otherwise be this pool.
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="suaveplan-wasm"
            )
        return self._executor

    def _release(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        self._drop_guest()
        # Stores already made hold their own descriptors; only later contexts need these.
        self._dirs.close()

    def _drop_guest(self) -> None:
        # No lock: a running guest holds it, and it may be waiting on this very loop for a
        # host call that gateway.close() just cancelled. The running call keeps its own
        # references to store and instance until it unwinds; later calls see `disposed`.
        self._store = None
        self._instance = None
        self._exports = None
        self._refusals = None
        self._guard = None
        self._wake.set()
        sockets, self._sockets = self._sockets, {}
        for sock in sockets.values():
            sock.close()

    def _check_alive(self) -> None:
        if self._disposed:
            raise SuaveplanError("SAND_WASM_DISPOSED", "the sandbox was disposed")
        if self._ended is not None:
            raise SuaveplanError(
                "SAND_WASM_ENDED",
                "the guest was ended (see the cause); dispose the sandbox",
                dict(self._ended.details),
                cause=self._ended,
            )

    def _end(self, error: SuaveplanError) -> SuaveplanError:
        """Move to `ended` (on the guest thread, holding the lock) and return `error`."""
        if self._ended is None:
            _drop_frames(error)
            self._ended = error
        self._drop_guest()
        return error

    def _abandon(self) -> SuaveplanError:
        """End the guest while its thread is held in host code past the call's deadline.

        Runs on the event loop, without the lock (the stuck thread holds it). The store,
        instance and sockets are dropped as by any breach; the thread keeps its own
        references until the host code returns, then `_dispatch` (or the next epoch check)
        finds the sandbox ended and it unwinds without running more guest code.
        """
        error = self._budget("wallClockMs", self._policy.budgets.wall_clock_ms)
        return self._end(error)

    def _instantiate(
        self,
        *,
        argv: Sequence[str],
        stdin: str | None,
        out: Callable[[bytes], int | None] | None,
        err: Callable[[bytes], int | None] | None,
        began: _CallStart | None,
    ) -> tuple[wasmtime.Store, wasmtime.Instance, CallWatch | WallWatch | None, StoreGuard]:
        """A new store and instance; raises the translated error.

        With `began` (a call's start, on the guest thread) the call's budgets are armed
        before the module's start function runs: it is guest code like any other, and the
        caller's `_disarm` ends them. Without it (create of a module without a start
        function, on the event loop) no guest code runs here.
        """
        store = wasmtime.Store(_engine.engine())
        if self._imports_wasi:
            # Nothing is inherited: argv/env/stdio are only what the host passes (a fresh
            # WasiConfig has no argv, env, stdio or preopens). A module that imports no WASI
            # gets no WASI context at all.
            wasi = wasmtime.WasiConfig()
            if argv:
                wasi.argv = list(argv)
            if stdin is not None:
                wasi.stdin_file = stdin
            if out is not None:
                wasi.stdout_custom = out
            if err is not None:
                wasi.stderr_custom = err
            with self._dirs.lock:
                fds = self._dirs.fds
                if fds is None:
                    raise SuaveplanError("SAND_WASM_DISPOSED", "the sandbox was disposed")
                try:
                    for p, fd in zip(self._preopens, fds, strict=True):
                        wasi.preopen_dir(preopen_path(fd, p), p.guest, p.writable)
                except wasmtime.WasmtimeError as exc:
                    raise _engine.translate(exc, during="preopen") from _engine.guest_cause(exc)
            store.set_wasi(wasi)
        # Just after the WASI context (and its monotonic clock) was made: see StoreGuard.
        guard = StoreGuard(time.monotonic_ns())
        limit = self._policy.budgets.memory_mb
        if limit is not None:
            store.set_limits(**memory_limits(limit))
        store.set_epoch_deadline(_NO_DEADLINE)
        if self._cpu is not None:
            self._cpu.install(store)
        elif self._ends_on_dispose is not None:
            self._ends_on_dispose.install(store)
            store.set_epoch_deadline(1)
        watch = None
        if began is not None:
            watch = self._arm_deadline(store)
            self._running_guard = guard
            began.deadline, began.started = self._call_deadline, True
        previous = getattr(_current, "sb", None)
        _current.sb = self
        try:
            instance = self._pre.instantiate(store)
        except SuaveplanError as exc:
            # Only BUDGET_EXCEEDED leaves a host import (wallClockMs while it waited).
            raise self._import_failure(exc) from None
        except (wasmtime.WasmtimeError, wasmtime.Trap) as exc:
            # A trap with wasm frames is the start function's: guest code ran and trapped,
            # a trap like a call's (`SAND_WASM_TRAP`, `details.stage="start"`). One without
            # (a data or element segment out of bounds) or any other error: the module did
            # not instantiate, before any guest code ran.
            ran = isinstance(exc, wasmtime.Trap) and bool(exc.frames)
            during = "start" if ran else "instantiate"
            raise self._guest_failure(
                exc, store, {}, None, 0, watch=watch, during=during
            ) from _engine.guest_cause(exc)
        finally:
            _current.sb = previous
        return store, instance, watch, guard

    async def _start_off_loop(self) -> None:
        """Instantiate a module with a start function on the guest thread, under the budgets.

        Its start function is guest code: on the event loop it would hold the loop for as
        long as it runs (forever, for a loop without `wallClockMs`). Here it runs like a
        call: interrupted at wallClockMs, judged by cpuPercent, abandoned when held in host
        code past the deadline (`_await_guest`), and an async adapter can be awaited.
        """
        start = _CallStart()
        work = self._worker().submit(_OneShot(self._start_sync), start)
        owner, wall = weakref.ref(self), self._policy.budgets.wall_clock_ms
        await _await_guest(work, start, owner, wall_ms=wall)

    def _start_sync(self, began: _CallStart) -> None:
        with self._lock:
            self._check_alive()
            try:
                store, instance, _, guard = self._instantiate(
                    argv=(), stdin=None, out=None, err=None, began=began
                )
            except SuaveplanError as exc:
                if exc.code == "BUDGET_EXCEEDED":
                    self._end(exc)
                raise
            finally:
                self._disarm()
            # Abandoned or disposed while the start function ran: nothing may keep its store.
            self._check_alive()
            self._store, self._instance, self._guard = store, instance, guard

    def _arm_deadline(self, store: wasmtime.Store) -> CallWatch | WallWatch | None:
        wall = self._policy.budgets.wall_clock_ms
        self._import_breach = None
        self._breach_counted = False
        if self._cpu is not None:
            # The callback judges CPU and wall clock on every tick; see `_cpu`.
            tracker = BudgetTracker(
                self._policy.budgets, plugin=self._gateway.plugin, metrics=self._metrics
            )
            watch = CallWatch(tracker, wall)
            self._call_deadline = watch.wall_deadline
            self._cpu.watch = watch
            store.set_epoch_deadline(1)
            return watch
        self._call_deadline = None if wall is None else time.monotonic() + wall / 1000.0
        if self._ends_on_dispose is not None:
            # The callback ends the guest at the first tick after dispose() or, under
            # wallClockMs, at or past the deadline (never before it); see `_cpu`.
            deadline = self._call_deadline
            wall_watch = None if deadline is None else WallWatch(deadline)
            self._ends_on_dispose.watch = wall_watch
            store.set_epoch_deadline(1)
            return wall_watch
        if wall is None:
            store.set_epoch_deadline(_NO_DEADLINE)
        else:
            # The ticker's phase is arbitrary: the first tick after arming may come at once, so
            # n ticks can be as little as (n - 1) ticks of time. One tick more makes the trap
            # come no sooner than the budget (ticks are at least TICK_S apart) and at most one
            # tick after it.
            store.set_epoch_deadline(math.ceil(wall / 1000.0 / _engine.TICK_S) + 1)
        return None

    def _disarm(self) -> None:
        self._call_deadline = None
        self._running_guard = None
        if self._cpu is not None:
            self._cpu.watch = None
        if self._ends_on_dispose is not None:
            self._ends_on_dispose.watch = None

    def _call_sync(self, export: str, args: tuple[int | float, ...], began: _CallStart) -> Any:
        with self._lock:
            self._check_alive()
            store, instance = self._store, self._instance
            assert store is not None and instance is not None
            exports = self._exports
            if exports is None:
                exports = self._exports = instance.exports(store)
            func = exports.get(export)
            if not isinstance(func, wasmtime.Func):
                raise SuaveplanError(
                    "SAND_WASM_NO_SUCH_EXPORT", "no such exported function", {"export": export}
                )
            params = self._params.get(export)
            if params is None:
                try:
                    params = self._params[export] = param_kinds(func.type(store).params)
                except wasmtime.WasmtimeError as exc:
                    raise _engine.translate(exc, during="call") from _engine.guest_cause(exc)
            values = coerce_arguments(export, params, args)
            memory = exports.get("memory")
            mem = memory if isinstance(memory, wasmtime.Memory) else None
            if not self._grow_recorded:
                mark = mem.data_len(store) if mem is not None else 0
            else:
                refusals = self._refusals
                if refusals is None:
                    found = exports.get(REFUSALS_EXPORT)
                    assert isinstance(found, wasmtime.Global)
                    refusals = self._refusals = found
                mark = refusals.value(store)
            watch = self._arm_deadline(store)
            self._running_guard = self._guard
            began.deadline, began.started = self._call_deadline, True
            _current.sb = self
            self._guest_memory = mem
            try:
                return func(store, *values)
            except SuaveplanError as exc:
                # Only BUDGET_EXCEEDED leaves a host import (wallClockMs while it waited).
                raise self._end(self._import_failure(exc)) from None
            except (wasmtime.WasmtimeError, wasmtime.Trap) as exc:
                error = self._guest_failure(exc, store, exports, mem, mark, watch=watch)
                if error.code == "BUDGET_EXCEEDED":
                    raise self._end(error) from _engine.guest_cause(exc)
                raise error from _engine.guest_cause(exc)
            except Exception as exc:  # upstream surprise: translated, and terminal
                raise self._end(_engine.translate(exc, during="call")) from exc
            finally:
                _current.sb = None
                self._guest_memory = None
                self._disarm()
                del store, instance, exports, func

    def _run_sync(self, argv: tuple[str, ...], stdin: bytes, began: _CallStart) -> RunResult:
        # Bounded captures: a guest writing without end costs the host `max_output_bytes`
        # per stream, and its writes past that fail (`_output`).
        out, err = OutputCapture(self._max_output), OutputCapture(self._max_output)
        with self._lock, tempfile.NamedTemporaryFile(prefix="suaveplan-stdin-") as fh:
            self._check_alive()
            fh.write(stdin)
            fh.flush()
            # One wallClockMs for the run: the module's start function, then `_start`.
            try:
                store, instance, watch, _ = self._instantiate(
                    argv=argv, stdin=fh.name, out=out, err=err, began=began
                )
            except SuaveplanError as exc:
                self._disarm()
                if exc.code == "BUDGET_EXCEEDED":
                    self._end(exc)
                raise
            exports = instance.exports(store)
            start = exports.get("_start")
            if not isinstance(start, wasmtime.Func):
                self._disarm()
                raise SuaveplanError(
                    "SAND_WASM_NO_SUCH_EXPORT", "no such exported function", {"export": "_start"}
                )
            memory = exports.get("memory")
            mem = memory if isinstance(memory, wasmtime.Memory) else None
            # A fresh instance: its refusal counter starts at 0.
            recorded = self._grow_recorded
            mark = mem.data_len(store) if mem is not None and not recorded else 0
            code = 0
            _current.sb = self
            self._guest_memory = mem
            try:
                start(store)
            except wasmtime.ExitTrap as exc:
                code = exc.code
                if code != 0 and self._refused_by_memory_mb(store, exports, mem, mark):
                    error = self._budget("memoryMb", self._policy.budgets.memory_mb)
                    raise self._end(error) from _engine.guest_cause(exc)
            except SuaveplanError as exc:
                raise self._end(self._import_failure(exc)) from None
            except (wasmtime.WasmtimeError, wasmtime.Trap) as exc:
                error = self._guest_failure(exc, store, exports, mem, mark, watch=watch)
                if error.code == "BUDGET_EXCEEDED":
                    raise self._end(error) from _engine.guest_cause(exc)
                raise error from _engine.guest_cause(exc)
            except Exception as exc:
                raise self._end(_engine.translate(exc, during="run")) from exc
            finally:
                _current.sb = None
                self._guest_memory = None
                self._disarm()
                del store, instance, exports, memory, mem
            stdout, stderr = out.take(), err.take()
            return RunResult(
                exit_code=code,
                stdout=stdout,
                stderr=stderr,
                stdout_truncated=out.truncated,
                stderr_truncated=err.truncated,
            )

    def _import_failure(self, exc: SuaveplanError) -> SuaveplanError:
        # wasmtime-py hands a host function's exception back through one process-wide slot
        # (`_func.LAST_EXCEPTION`), so under concurrent sandboxes the exception that comes
        # out may be another sandbox's: trust only the breach this sandbox recorded.
        if self._import_breach is not None:
            return self._import_breach
        return SuaveplanError("SAND_WASM_TRAP", "the guest trapped", {"stage": "call"}, cause=exc)

    def _guest_failure(
        self,
        exc: BaseException,
        store: wasmtime.Store,
        exports: Mapping[str, object],
        mem: wasmtime.Memory | None,
        mark: int,
        *,
        watch: CallWatch | WallWatch | None = None,
        during: str = "call",
    ) -> SuaveplanError:
        if self._import_breach is not None:
            return self._import_breach  # counted when it was raised
        if self._wake.is_set():  # ended at a tick after dispose (`_cpu`, `_ends_on_dispose`)
            return SuaveplanError("SAND_WASM_DISPOSED", "the sandbox was disposed")
        if watch is not None:
            if watch.error is not None:
                return watch.error  # BudgetTracker already counted it
            if watch.wall_exceeded:
                return self._budget("wallClockMs", self._policy.budgets.wall_clock_ms)
        code = exc.trap_code if isinstance(exc, wasmtime.Trap) else None
        if code == wasmtime.TrapCode.INTERRUPT:
            return self._budget("wallClockMs", self._policy.budgets.wall_clock_ms)
        if self._refused_by_memory_mb(store, exports, mem, mark):
            return self._budget("memoryMb", self._policy.budgets.memory_mb)
        return _engine.translate(exc, during=during)

    def _refused_by_memory_mb(
        self,
        store: wasmtime.Store,
        exports: Mapping[str, object],
        mem: wasmtime.Memory | None,
        mark: int,
    ) -> bool:
        """Whether memoryMb refused a `memory.grow` of the guest that then failed.

        `mark` is the refusal counter (instrumented module) or the exported memory's size
        (otherwise) when the call began.
        """
        if self._policy.budgets.memory_mb is None:
            return False
        if not self._grow_recorded:
            return self._at_memory_limit(store, mem, mark)
        return self._recorded_refusal_exceeds_limit(store, exports, mark)

    def _recorded_refusal_exceeds_limit(
        self, store: wasmtime.Store, exports: Mapping[str, object], mark: int
    ) -> bool:
        """The exact verdict, from what the module's grow hook recorded (see `_instrument`).

        memoryMb refused the last grow refused during this call when the size it asked for
        exceeds the limit while the module's own declared maximum allows it (wasmtime's
        store limiter refuses `desired > memory_size`). A request beyond the module's own
        maximum, or one within the limit that was refused anyway, is the guest's trap.
        """
        limit = self._policy.budgets.memory_mb
        refusals = exports.get(REFUSALS_EXPORT)
        pages = exports.get(REFUSED_PAGES_EXPORT)
        if (
            limit is None
            or not isinstance(refusals, wasmtime.Global)
            or not isinstance(pages, wasmtime.Global)
            or refusals.value(store) == mark
        ):
            return False
        requested = pages.value(store)
        declared = self._grow_max
        if not isinstance(requested, int) or (declared is not None and requested > declared):
            return False
        return requested * _PAGE > limit * 1024 * 1024

    def _at_memory_limit(
        self, store: wasmtime.Store, mem: wasmtime.Memory | None, start_size: int
    ) -> bool:
        """Whether a guest that failed (trap or non-zero exit) was refused growth by memoryMb.

        The fallback for modules `_instrument` left as they are (the others record their
        refusals: `_recorded_refusal_exceeds_limit`). wasmtime-py (checked against 50.0.1)
        exposes neither a resource-limiter callback nor the refused delta (its C API's
        `wasmtime_store_limiter` only sets the limits; a refused `memory.grow` just returns
        -1 to the guest), so the refusal is inferred from
        what the public API shows: the memory's size now, its size when the call began and
        its declared maximum. It was memoryMb when the headroom under the limit is less than
        one page, or less than what the guest grew during this call (a guest growing in
        steps of N pages is refused with up to N-1 pages to spare) — unless the module's own
        declared maximum fits under memoryMb (then memoryMb can refuse nothing).
        """
        limit = self._policy.budgets.memory_mb
        if limit is None or mem is None:
            return False
        limit_bytes = limit * 1024 * 1024
        declared = mem.type(store).limits.max
        if declared is not None and declared * _PAGE <= limit_bytes:
            return False
        size = mem.data_len(store)
        headroom = limit_bytes - size
        return headroom < _PAGE or headroom < size - start_size

    def _budget(self, budget: str, limit: float | None) -> SuaveplanError:
        """A fresh BUDGET_EXCEEDED error; the metric counts the first of each call only."""
        with self._breach_lock:
            counted, self._breach_counted = self._breach_counted, True
        if not counted:
            self._metrics.inc(
                BUDGET_EXCEEDED.name, {"plugin": self._gateway.plugin, "budget": budget}
            )
        return SuaveplanError(
            "BUDGET_EXCEEDED", f"budget exceeded: {budget}", {"budget": budget, "limit": limit}
        )

    # -- host imports ------------------------------------------------------------------------

    def _dispatch(self, capability: str, operation: str, args: dict[str, object]) -> object:
        """Gateway call from the guest thread. Raises SuaveplanError.

        The decision (and a synchronous adapter) runs right here on the guest thread; only an
        async adapter makes the guest wait for the event loop.
        """
        if self._disposed or self._gateway.closed:
            raise SuaveplanError("SAND_CANCELLED", "the sandbox was disposed")
        try:
            result = self._gateway.dispatch_sync(
                capability, operation, args, run_coroutine=self._on_loop
            )
        except SuaveplanError:
            self._raise_if_abandoned(None)
            raise
        self._raise_if_abandoned(result)
        return result

    def _raise_if_abandoned(self, result: object) -> None:
        """After an adapter returned: if the call was abandoned meanwhile, end the guest now.

        `_abandon` answered the caller while the adapter held this thread; the guest must
        not run on, so the import raises BUDGET_EXCEEDED (which ends it) instead of
        returning, and a socket it was given is closed.
        """
        if self._ended is None or self._ended.code != "BUDGET_EXCEEDED":
            return
        if isinstance(result, socket.socket):
            result.close()
        raise self._wall_breach()

    def _wall_breach(self) -> SuaveplanError:
        """wallClockMs ran out while a host import held the guest; the import raises it."""
        error = self._budget("wallClockMs", self._policy.budgets.wall_clock_ms)
        self._import_breach = error
        return error

    def _socket_timeout(self, cap_s: float) -> float:
        """How long a socket send/recv may block: `cap_s`, or less when the call's wallClockMs
        deadline comes first (already past: the breach is raised)."""
        deadline = self._call_deadline
        if deadline is None:
            return cap_s
        left = deadline - time.monotonic()
        if left <= 0:
            raise self._wall_breach()
        return min(cap_s, left)

    def _socket_timed_out(self) -> int:
        """A send/recv timed out: the call's wallClockMs breach if it ran out, else `IO`."""
        deadline = self._call_deadline
        if deadline is not None and time.monotonic() >= deadline:
            raise self._wall_breach()
        return Errno.IO

    def _on_loop(self, coro: Coroutine[Any, Any, object]) -> object:
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            # Guest code never runs on the loop's thread (a start function runs on the guest
            # thread: `_start_off_loop`); were it to, blocking on the loop here would
            # deadlock it. Fail closed.
            coro.close()
            raise SuaveplanError(
                "SAND_ADAPTER_FAILED",
                "an async adapter cannot be awaited while the module is being instantiated",
            )
        try:
            fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        except RuntimeError:  # the loop is closed: the host is gone
            coro.close()
            raise SuaveplanError("SAND_CANCELLED", "the sandbox was disposed") from None
        deadline = self._call_deadline
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        # `wait`, not `fut.result(timeout)`: an adapter's own TimeoutError must stay its own.
        if not concurrent.futures.wait((fut,), timeout=timeout).done:
            # The call's wallClockMs ran out while the guest waited on the adapter: cancel
            # the adapter task and end the guest (the host import re-raises this one code).
            fut.cancel()
            raise self._wall_breach()
        try:
            return fut.result()
        except concurrent.futures.CancelledError:
            raise SuaveplanError("SAND_CANCELLED", "the sandbox was disposed") from None


async def create_wasm_sandbox(
    *,
    wasm_module_path: str | Path,
    policy: PermissionPolicy,
    proxies: Adapters | None = None,
    plugin_name: str | None = None,
    metrics: MetricsSink | None = None,
    clock: Clock | None = None,
    audit: AuditSink | None = None,
    cache_dir: str | Path | None = None,
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    max_module_bytes: int = _engine.DEFAULT_MAX_MODULE_BYTES,
    compile_limits: CompileLimits = DEFAULT_COMPILE_LIMITS,
    redact: Iterable[str] = (),
) -> WasmSandbox:
    """Compile (cached) and instantiate the module under `policy`. See docs/wasm-abi.md.

    `max_output_bytes` bounds what `run` keeps of the guest's stdout, and separately of its
    stderr (`RunResult.stdout_truncated` / `stderr_truncated`); an `int` >= 0.
    `max_module_bytes`: a larger module file is refused before it is read
    (`SAND_WASM_INSTANTIATION_FAILED`, `details.stage="read"`); an `int` >= 1.
    `compile_limits` (a `CompileLimits`): the header bounds a module must be within, cached or
    not (`details.stage="bounds"`), and the memory and CPU its compile may use in the compile
    child (`details.stage="compile"`).
    `redact` (an iterable of str): credentials the host holds itself, kept out of every
    diagnostic (`Gateway`'s `redact=`).
    """
    # Before anything is read or compiled (`_create_arguments`).
    check_path_argument("wasm_module_path", wasm_module_path)
    check_path_argument("cache_dir", cache_dir, optional=True)
    check_common_create_arguments(
        policy=policy,
        proxies=proxies,
        plugin_name=plugin_name,
        metrics=metrics,
        clock=clock,
        audit=audit,
    )
    byte_limit(max_output_bytes, argument="max_output_bytes", minimum=0)
    byte_limit(max_module_bytes, argument="max_module_bytes", minimum=1)
    if type(compile_limits) is not CompileLimits:
        raise SuaveplanError(
            "SAND_INVALID_ARGUMENT",
            "compile_limits must be a CompileLimits",
            {"argument": "compile_limits"},
        )
    sink: MetricsSink = metrics if metrics is not None else InMemoryMetrics()
    checker = PermissionChecker(policy, plugin=plugin_name, metrics=sink)
    module = _engine.cached_module_file(
        wasm_module_path, max_bytes=max_module_bytes, limits=compile_limits
    )
    if module is None:
        # A first load reads, rewrites (pure Python, ~0.4 s per MB) and compiles bytes the
        # plugin's author chose: never on the event loop.
        module = await asyncio.to_thread(
            _engine.load_module_file,
            wasm_module_path,
            cache_dir=Path(cache_dir) if cache_dir is not None else None,
            max_bytes=max_module_bytes,
            limits=compile_limits,
        )
    imports_wasi = _engine.check_imports(module)
    preopens = resolve_preopens(policy, checker)
    refuse_unquoted_preopens(preopens, proxies)
    denials: deque[SuaveplanError] = deque(maxlen=MAX_DENIALS)
    total = [0]

    def on_denial(deny: Deny, cap: str, op: str) -> None:
        total[0] += 1
        if cap == "fetch" and op == "connect":
            denials.append(
                SuaveplanError(
                    "SAND_WASM_OUTBOUND_DENIED",
                    "outbound connect denied",
                    {"capability": "fetch", "reason": deny.reason.value},
                )
            )
            if audit is not None:
                # The gateway's own record says `deny:SAND_PERM_DENIED`; this one names the
                # host-level outcome the guest's connect surfaced as.
                audit.record(
                    AuditRecord(
                        plugin=checker.plugin,
                        capability="fetch",
                        operation="connect",
                        allowed=False,
                        reason=deny.reason.value,
                        rule=None,
                        duration_ms=0.0,
                        outcome="deny:SAND_WASM_OUTBOUND_DENIED",
                    )
                )
        else:
            denials.append(deny.to_error())

    gateway = Gateway(
        checker=checker,
        adapters=proxies or Adapters(),
        audit=audit,
        clock=clock,
        on_denial=on_denial,
        redact=redact,
    )
    # A start function is guest code: it runs on the guest thread under the budgets, never
    # on the event loop (`WasmSandbox._start_off_loop`).
    start_later = _engine.has_start(module)
    sb = WasmSandbox(
        module=module,
        imports_wasi=imports_wasi,
        policy=policy,
        gateway=gateway,
        preopens=preopens,
        metrics=sink,
        loop=asyncio.get_running_loop(),
        denials=denials,
        denial_total=lambda: total[0],
        max_output_bytes=max_output_bytes,
        start_later=start_later,
    )
    if start_later:
        try:
            await sb._start_off_loop()
        except BaseException as exc:
            sb.dispose_nowait()
            del sb
            _drop_frames(exc)  # see `call`: the error must not keep the store alive
            raise
    return sb
