"""`cpuPercent` for WASM guests: thread CPU time sampled on every epoch tick.

Theory of operation. When a policy sets `cpuPercent`, each store gets a wasmtime epoch
deadline callback and a deadline of one tick. wasmtime runs the callback on the guest's own
thread each time the shared ticker bumps the epoch, so `time.thread_time()` there is the
guest thread's CPU time. The callback feeds it to a per-call `BudgetTracker.sample_cpu`
(CPU/wall over a sliding window; it raises `BUDGET_EXCEEDED` cpuPercent once and counts
`plugin.budget_exceeded_total`), checks the wall-clock budget itself (the callback replaces
the plain deadline trap), and either extends the deadline by one tick or returns an error,
which wasmtime turns into a trap that ends the guest. The callback never raises into C.
"""

from __future__ import annotations

import ctypes
import time
from typing import Any, Final, final

import wasmtime
from wasmtime import _ffi as ffi

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import BudgetTracker

_CONTINUE: Final = 0  # WASMTIME_UPDATE_DEADLINE_CONTINUE

# ctypes matches callback types by identity: take them from the binding's own signature.
_ARGTYPES: Final = ffi.dll.wasmtime_store_epoch_deadline_callback.argtypes
_Callback: Final = _ARGTYPES[1]
_Finalizer: Final = _ARGTYPES[3]


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
    """The epoch callback of one sandbox; `watch` is the call in progress (or None)."""

    def __init__(self) -> None:
        self.watch: CallWatch | None = None
        self._callback: Any = _Callback(self._on_epoch)
        self._finalizer: Any = _Finalizer()  # NULL: nothing to free

    def install(self, store: wasmtime.Store) -> None:
        ffi.wasmtime_store_epoch_deadline_callback(
            store.ptr(), self._callback, None, self._finalizer
        )

    def _on_epoch(self, _ctx: object, _data: object, delta: Any, kind: Any) -> int:
        try:
            watch = self.watch
            if watch is None or watch.tick():
                delta[0] = 1
                kind[0] = _CONTINUE
                return 0
            err = ffi.wasmtime_error_new(b"suaveplan: budget exceeded")
            return int(ctypes.cast(err, ctypes.c_void_p).value or 0)
        except BaseException:  # nothing may unwind into wasmtime's C frames
            delta[0] = 1
            kind[0] = _CONTINUE
            return 0
