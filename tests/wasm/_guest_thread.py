"""A WASM sandbox's own guest thread, as the dispose and wake tests watch it.

`running` waits (a liveness guard, never a timing assertion) until the guest thread has taken
a call: it holds the sandbox's lock while a call runs. A call still queued when `dispose()`
comes is dropped, never run, which is another route than a running guest's. The thread
watched is this sandbox's executor thread, never a count of every guest thread of the
process (another test's may end meanwhile)."""

from __future__ import annotations

import asyncio
import threading

from suaveplan_sandbox.wasm import WasmSandbox


def guest_threads(sb: WasmSandbox) -> list[threading.Thread]:
    """The executor thread this sandbox runs its guest on (not the process-wide ticker)."""
    executor = sb._executor
    return [] if executor is None else list(executor._threads)


async def released(threads: list[threading.Thread]) -> bool:
    """Whether every thread of `threads` has ended (each given 10 s to)."""
    for thread in threads:
        await asyncio.to_thread(thread.join, 10)
    return not any(t.is_alive() for t in threads)


async def running(sb: WasmSandbox) -> bool:
    """Whether the guest thread took the call, within 30 s."""
    for _ in range(3000):
        if sb._lock.locked():
            return True
        await asyncio.sleep(0.01)
    return False
