"""A private event loop on a daemon thread: what the blocking sandbox facades drive."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar, final

from suaveplan_sandbox.errors import SuaveplanError

T = TypeVar("T")


@final
class LoopThread:
    """Starts its loop at construction; `run` blocks on one coroutine; `stop` ends it.

    `run` and `stop` may be called from different threads (a facade called on one thread and
    disposed on another): a run submitted before the stop is cancelled by it, never left
    waiting on a loop that will not turn again, and a run after it raises at once
    (`disposed_code`'s error when given)."""

    def __init__(self, name: str, *, disposed_code: str | None = None) -> None:
        self.loop = asyncio.new_event_loop()
        self._disposed_code = disposed_code
        self._lock = threading.Lock()  # orders submissions against `stop`
        self._stopping = False
        self._ending: asyncio.Task[None] | None = None  # `end_abandoned` on the loop's thread
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def _stopped(self) -> Exception:
        if self._disposed_code is None:
            return RuntimeError("the loop thread was stopped")
        return SuaveplanError(self._disposed_code, "the sandbox was disposed")

    def on_own_thread(self) -> bool:
        """Whether the caller runs on this loop's thread (where `run` and `stop` refuse)."""
        return threading.current_thread() is self._thread

    def end_abandoned(self, dispose: Callable[[], Coroutine[Any, Any, object]]) -> None:
        """For a facade collected without `dispose()` (its finalizer): run `dispose()` on the
        loop, then stop the loop thread. On the loop's own thread (a callback dropped the
        last reference) nothing can wait for the loop: the dispose is started there and the
        loop stops once it is done."""
        if self.on_own_thread():

            async def then_stop() -> None:
                try:
                    await dispose()
                finally:
                    self.loop.stop()

            self._ending = self.loop.create_task(then_stop())  # held: a task is weakly kept
            return
        with contextlib.suppress(Exception):
            self.run(dispose())
        self.stop()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        if threading.current_thread() is self._thread:
            # Called from a callback on this loop (an adapter, a bus handler): blocking on
            # the loop's own work would wait for ever.
            coro.close()
            raise _on_own_loop()
        with self._lock:
            if self._stopping:
                coro.close()  # never run: no "never awaited" warning
                raise self._stopped()
            fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result()
        except concurrent.futures.CancelledError:
            if self._stopping:  # cancelled by `stop`
                raise self._stopped() from None
            raise

    def stop(self) -> None:
        if threading.current_thread() is self._thread:
            raise _on_own_loop()  # waiting for the loop's own tasks from it never ends
        with self._lock:
            if self._stopping:
                return
            self._stopping = True
        # Every run submitted before the flag was set is queued ahead of `_drain`, so its
        # task exists when `_drain` cancels it: with a bare `loop.stop()`, a task whose first
        # step was queued behind the stop never ran, and its caller waited for ever.
        asyncio.run_coroutine_threadsafe(_drain(), self.loop).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


def _on_own_loop() -> SuaveplanError:
    return SuaveplanError(
        "SAND_INVALID_ARGUMENT",
        "a blocking sandbox was called from its own event loop's thread",
        {"reason": "blocking-call-on-own-loop"},
    )


async def _drain() -> None:
    """Cancel every other task of the loop and wait until they have ended."""
    me = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not me]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
