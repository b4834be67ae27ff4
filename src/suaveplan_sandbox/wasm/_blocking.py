"""A blocking facade for scripts: the async sandbox driven on a private event-loop thread."""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any, final

from suaveplan_sandbox._loop_thread import LoopThread
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.wasm._sandbox import PreopenSpec, RunResult, WasmSandbox, create_wasm_sandbox


@final
class BlockingWasmSandbox:
    """Same operations as `WasmSandbox`, blocking. Use `with` or call `dispose()`."""

    def __init__(self, **kwargs: Any) -> None:
        self._loop = LoopThread("suaveplan-wasm-loop", disposed_code="SAND_WASM_DISPOSED")
        try:
            self._sb: WasmSandbox = self._loop.run(create_wasm_sandbox(**kwargs))
        except BaseException:
            self._loop.stop()
            raise
        # Collected without dispose(): the loop thread (a daemon, holding the sandbox through
        # its loop) would keep the guest's thread and their descriptors for the process's life.
        self._finalizer = weakref.finalize(self, self._loop.end_abandoned, self._sb.dispose)

    @property
    def denials(self) -> tuple[SuaveplanError, ...]:
        return self._sb.denials

    @property
    def denials_total(self) -> int:
        return self._sb.denials_total

    @property
    def state(self) -> str:
        return self._sb.state

    @property
    def preopens(self) -> tuple[PreopenSpec, ...]:
        return self._sb.preopens

    def call(self, export: str, *args: int | float) -> Any:
        return self._loop.run(self._sb.call(export, *args))

    def run(self, *, argv: Sequence[str] = (), stdin: bytes = b"") -> RunResult:
        return self._loop.run(self._sb.run(argv=argv, stdin=stdin))

    def dispose(self) -> None:
        if self._loop.loop.is_closed():
            return
        self._finalizer.detach()
        try:
            self._loop.run(self._sb.dispose())
        finally:
            self._loop.stop()

    def __enter__(self) -> BlockingWasmSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.dispose()


def create_wasm_sandbox_blocking(**kwargs: Any) -> BlockingWasmSandbox:
    """Blocking `create_wasm_sandbox` (same keyword arguments)."""
    return BlockingWasmSandbox(**kwargs)
