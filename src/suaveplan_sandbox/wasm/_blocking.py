"""A blocking facade for scripts: the async sandbox driven on a private event-loop thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar, final

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.wasm._sandbox import PreopenSpec, RunResult, WasmSandbox, create_wasm_sandbox

T = TypeVar("T")


@final
class BlockingWasmSandbox:
    """Same operations as `WasmSandbox`, blocking. Use `with` or call `dispose()`."""

    def __init__(self, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="suaveplan-wasm-loop", daemon=True
        )
        self._thread.start()
        try:
            self._sb: WasmSandbox = self._wait(create_wasm_sandbox(**kwargs))
        except BaseException:
            self._stop()
            raise

    def _wait(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

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
        return self._wait(self._sb.call(export, *args))

    def run(self, *, argv: Sequence[str] = (), stdin: bytes = b"") -> RunResult:
        return self._wait(self._sb.run(argv=argv, stdin=stdin))

    def dispose(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._wait(self._sb.dispose())
        finally:
            self._stop()

    def __enter__(self) -> BlockingWasmSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.dispose()


def create_wasm_sandbox_blocking(**kwargs: Any) -> BlockingWasmSandbox:
    """Blocking `create_wasm_sandbox` (same keyword arguments)."""
    return BlockingWasmSandbox(**kwargs)
