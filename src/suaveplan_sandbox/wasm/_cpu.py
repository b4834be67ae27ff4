"""`cpuPercent` for WASM guests: thread CPU time sampled on every epoch tick; and the same
tick ending a guest without `cpuPercent` once its sandbox is disposed, which judges
`wallClockMs` too when that is set (`DisposeWatcher`).

Theory of operation. When a policy sets `cpuPercent`, each store gets a wasmtime epoch
deadline callback and a deadline of one tick. wasmtime runs the callback on the guest's own
thread each time the shared ticker bumps the epoch, so `time.thread_time()` there is the
guest thread's CPU time. The callback feeds it to a per-call `BudgetTracker.sample_cpu`
(CPU/wall over a sliding window; it raises `BUDGET_EXCEEDED` cpuPercent once and counts
`plugin.budget_exceeded_total`), checks the wall-clock budget itself (the callback replaces
the plain deadline trap), and either extends the deadline by one tick or returns an error,
which wasmtime turns into a trap that ends the guest. The callback never raises into C.

Why a private binding. wasmtime-py (checked against 50.0.1) has no public route to this:
`Store.set_epoch_deadline` and fuel exhaustion (`Config.consume_fuel`, `Store.set_fuel`)
can only *trap*, which ends the guest before its CPU share over a window can be judged, and
neither has a callback; fuel also counts instructions, not CPU time. The C API's
`wasmtime_store_epoch_deadline_callback` is what we need, and wasmtime-py binds it only in
its private `wasmtime._ffi`. Every use of that module is in `_EpochHook` below (binding, error
object, store pointer). `epoch_hook_problem()` checks the binding still has the shape used
here; `tests/wasm/test_wasm_cpu_budget.py` fails loudly when a wasmtime upgrade changes it,
and a create whose policy sets `cpuPercent` fails closed (`SAND_WASM_INSTANTIATION_FAILED`,
`details.stage="cpu-budget"`) rather than run the guest without the budget.
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import importlib.metadata as _metadata
import threading
import time
from collections.abc import Callable
from typing import Any, Final, final

import wasmtime

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import BudgetTracker

_CONTINUE: Final = 0  # WASMTIME_UPDATE_DEADLINE_CONTINUE


def _private_ffi() -> Any:
    return importlib.import_module("wasmtime._ffi")


def epoch_hook_problem(ffi: Any = None) -> str | None:
    """None when wasmtime's private epoch-callback binding has the shape `_EpochHook` uses.

    Otherwise a one-line description of what is missing or changed (for the error and the
    test that guards upgrades). `ffi` defaults to `wasmtime._ffi`.
    """
    try:
        ffi = _private_ffi() if ffi is None else ffi
        binding = ffi.dll.wasmtime_store_epoch_deadline_callback
        argtypes = list(binding.argtypes)
        if len(argtypes) != 4:
            return f"wasmtime_store_epoch_deadline_callback takes {len(argtypes)} arguments, not 4"
        callback, finalizer = argtypes[1], argtypes[3]
        cb_args = list(callback._argtypes_)
        if callback._restype_ is not ctypes.c_size_t or len(cb_args) != 4:
            return "the epoch callback type is no longer size_t(ctx, data, *delta, *kind)"
        if cb_args[2]._type_ is not ctypes.c_uint64 or cb_args[3]._type_ is not ctypes.c_uint8:
            return "the epoch callback's out-parameters are no longer (*uint64, *uint8)"
        if finalizer._restype_ is not None or len(finalizer._argtypes_) != 1:
            return "the epoch callback finalizer type changed"
        if not callable(ffi.wasmtime_store_epoch_deadline_callback):
            return "wasmtime._ffi.wasmtime_store_epoch_deadline_callback is gone"
        if not callable(ffi.wasmtime_error_new):
            return "wasmtime._ffi.wasmtime_error_new is gone"
        if not callable(getattr(wasmtime.Store, "ptr", None)):
            return "wasmtime.Store.ptr() is gone"
    except (AttributeError, ImportError, IndexError, TypeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


@functools.cache
def _installed_hook_problem() -> str | None:
    return epoch_hook_problem()


@final
class _EpochHook:
    """The only user of `wasmtime._ffi`: one store's epoch-deadline callback.

    `on_tick()` runs on the guest thread at every tick: True lets the guest go on for one
    more tick, False ends it with a trap. Keep this object alive as long as the store.
    """

    def __init__(self, on_tick: Callable[[], bool]) -> None:
        ffi = _private_ffi()
        argtypes = ffi.dll.wasmtime_store_epoch_deadline_callback.argtypes
        # ctypes matches callback types by identity: take them from the binding's signature.
        self._ffi = ffi
        self._on_tick = on_tick
        self._callback: Any = argtypes[1](self._on_epoch)
        self._finalizer: Any = argtypes[3]()  # NULL: nothing to free

    def install(self, store: wasmtime.Store) -> None:
        self._ffi.wasmtime_store_epoch_deadline_callback(
            store.ptr(), self._callback, None, self._finalizer
        )

    def _on_epoch(self, _ctx: object, _data: object, delta: Any, kind: Any) -> int:
        try:
            if self._on_tick():
                delta[0] = 1
                kind[0] = _CONTINUE
                return 0
            err = self._ffi.wasmtime_error_new(b"suaveplan: budget exceeded")
            return int(ctypes.cast(err, ctypes.c_void_p).value or 0)
        except BaseException:  # nothing may unwind into wasmtime's C frames
            delta[0] = 1
            kind[0] = _CONTINUE
            return 0


def epoch_hook_available() -> bool:
    """Whether the installed wasmtime can run `_EpochHook`s (see `epoch_hook_problem`)."""
    return _installed_hook_problem() is None


@final
class WallWatch:
    """One guest call's wallClockMs deadline under `DisposeWatcher`; read after it fails.

    `error` is always None (no CPU is judged); it is there so a failure reads it as it reads
    a `CallWatch`'s."""

    __slots__ = ("wall_deadline", "wall_exceeded")
    error: Final[SuaveplanError | None] = None

    def __init__(self, wall_deadline: float) -> None:
        self.wall_deadline = wall_deadline
        self.wall_exceeded = False


@final
class DisposeWatcher:
    """The epoch callback of a sandbox without `cpuPercent`: the guest goes on, one tick at a
    time, until `disposed` is set, then traps at the next tick. Under `wallClockMs` it also
    holds `watch`, the call in progress, and traps at the first tick at or past its deadline
    (`wall_exceeded` says which: a breach, or the end that `dispose()` asked for).

    Without it nothing ends guest code that never returns: a store's plain deadline can only
    trap, and with no budget it is set past any run (with `wallClockMs`, at the budget),
    while `dispose()` cannot touch a store whose guest runs on another thread. So a disposed
    sandbox's guest kept its thread, a core and its store's preopened directories for the
    life of the process (until the wall-clock budget ended it, under `wallClockMs`). A tick
    costs one Python call on the guest thread (`TICK_S` apart; under `wallClockMs`, with one
    clock read), a share of a guest's time too small to measure. It holds only the event and
    the call's watch, never the sandbox."""

    def __init__(self, disposed: threading.Event) -> None:
        self.watch: WallWatch | None = None
        self._disposed = disposed
        self._hook = _EpochHook(self._on_tick)

    def install(self, store: wasmtime.Store) -> None:
        self._hook.install(store)

    def _on_tick(self) -> bool:
        if self._disposed.is_set():
            return False
        watch = self.watch
        if watch is None or time.monotonic() < watch.wall_deadline:
            return True
        watch.wall_exceeded = True
        return False


@final
class CallWatch:
    """One guest call's CPU tracker and wall-clock deadline; read after the call fails."""

    __slots__ = ("error", "tracker", "wall_deadline", "wall_exceeded")

    def __init__(self, tracker: BudgetTracker, wall_ms: float | None) -> None:
        self.tracker = tracker
        self.wall_deadline = None if wall_ms is None else time.monotonic() + wall_ms / 1000.0
        self.wall_exceeded = False
        self.error: SuaveplanError | None = None
        tracker.sample_cpu(time.thread_time(), at=time.monotonic())

    def tick(self) -> bool:
        """True to let the guest go on; False (reason recorded) to end it."""
        now = time.monotonic()
        if self.wall_deadline is not None and now >= self.wall_deadline:
            self.wall_exceeded = True
            return False
        try:
            self.tracker.sample_cpu(time.thread_time(), at=now)
        except SuaveplanError as exc:
            self.error = exc
            return False
        return True


@final
class CpuWatcher:
    """The epoch callback of one sandbox; `watch` is the call in progress (or None).

    Raises `SAND_WASM_INSTANTIATION_FAILED` (`stage="cpu-budget"`) when the installed
    wasmtime cannot run the callback: the budget is never silently dropped.
    """

    def __init__(self, disposed: threading.Event) -> None:
        if _installed_hook_problem() is not None:
            raise SuaveplanError(
                "SAND_WASM_INSTANTIATION_FAILED",
                "this wasmtime cannot enforce cpuPercent (no epoch deadline callback)",
                {"stage": "cpu-budget", "wasmtime": _metadata.version("wasmtime")},
            )
        self.watch: CallWatch | None = None
        self._disposed = disposed  # set: the guest ends at the next tick, as `DisposeWatcher`
        self._hook = _EpochHook(self._on_tick)

    def install(self, store: wasmtime.Store) -> None:
        self._hook.install(store)

    def _on_tick(self) -> bool:
        if self._disposed.is_set():
            return False
        watch = self.watch
        return watch is None or watch.tick()
