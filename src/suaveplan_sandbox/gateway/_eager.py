"""Start a coroutine in a task whose first step runs now, on Python 3.11 as from 3.12.

An adapter coroutine that never suspends (an in-memory fake, a read the kernel's caches
answer) should be answered where the request arrived, without a trip round the loop, but
it must still run inside its own `asyncio.Task`: `asyncio.timeout`, task groups and anyio's
cancel scopes find their task with `current_task()` and later cancel it. Python 3.12 has this
as `asyncio.Task(..., eager_start=True)`. Python 3.11 does not, and there every coroutine
adapter cost the VM host two more trips round the loop per host call (the task's first step
and its done callback), about a third of a proxied read's latency on our benchmark machine.

On 3.11, `start_eagerly` does what 3.12's eager start does, from the outside: it creates the
task around `_Resumed`, a coroutine object that will continue the real one, then runs the real
coroutine's first step at once, in the task's context and with the task made current (the
step's `current_task()` is the task that will own the rest, as under eager start). If that step
finished the coroutine, the caller has the outcome now; the task's own first step, which the
loop still runs later, just ends (with None: its outcome was delivered already, and an error
raised twice would be reported as never retrieved). If the step suspended, the task's steps
pass every `send` and `throw` to the real coroutine: waking, cancelling and `asyncio.timeout`
reach it exactly as they would have.

Swapping the current task uses `asyncio.tasks._enter_task` and `_leave_task`, which are
private; they are what 3.11's own tasks call around each step, and 3.11 no longer changes.
This is the only private asyncio API the project uses, and only on 3.11. A loop with a task
factory gets ordinary tasks there (its factory may not take the `context=` the first step
needs), as before.
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
from collections.abc import Coroutine, Generator
from typing import Any, Final, NamedTuple, final


class Finished(NamedTuple):
    """The coroutine ended in its first step: it returned `value`, or raised `error`."""

    value: object
    error: BaseException | None = None

    def result(self) -> object:
        """The value, or the error raised (as `Task.result()` does)."""
        if self.error is not None:
            raise self.error
        return self.value


_PENDING: Final = object()

if sys.version_info < (3, 12):
    from asyncio.tasks import _enter_task, _leave_task


@final
class _Resumed(Coroutine[Any, Any, object]):
    """The task's coroutine: ends at once if the first step finished, else continues it."""

    __slots__ = ("_coro", "_first")

    def __init__(self, coro: Coroutine[Any, Any, object]) -> None:
        self._coro: Coroutine[Any, Any, object] | None = coro
        self._first: object = _PENDING  # what the real coroutine yielded in its first step

    def send(self, value: object) -> object:
        first = self._first
        if first is not _PENDING:
            self._first = _PENDING
            return first  # the task now waits on what the first step waited on
        if self._coro is None:
            raise StopIteration(None)
        return self._coro.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> object:
        self._first = _PENDING
        if self._coro is None:  # cancelled after its outcome was delivered: nothing to do
            raise StopIteration(None)
        if val is None and tb is None:
            return self._coro.throw(typ)
        return self._coro.throw(typ, val, tb)  # pragma: no cover - the 3-argument form

    def close(self) -> None:
        if self._coro is not None:
            self._coro.close()

    def __await__(self) -> Generator[Any, None, object]:  # pragma: no cover - never awaited
        raise TypeError("_Resumed is run by its task only")


def _start_311(
    loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, object]
) -> asyncio.Task[object] | Finished:
    if loop.get_task_factory() is not None:
        # A host's task factory may predate `context=` (3.11 passes it only when given), and
        # the step must run in the task's own context: start the task the ordinary way.
        return loop.create_task(coro)
    resumed = _Resumed(coro)
    context = contextvars.copy_context()
    task: asyncio.Task[object] = loop.create_task(resumed, context=context)
    outer = asyncio.current_task(loop)
    if outer is not None:
        _leave_task(loop, outer)
    _enter_task(loop, task)
    try:
        first = context.run(coro.send, None)
    except StopIteration as stop:
        resumed._coro = None
        return Finished(stop.value)
    except (KeyboardInterrupt, SystemExit):
        resumed._coro = None
        raise  # as an eager task re-raises them
    except BaseException as exc:
        resumed._coro = None
        return Finished(None, exc)
    finally:
        _leave_task(loop, task)
        if outer is not None:
            _enter_task(loop, outer)
    resumed._first = first
    return task


def start_eagerly(coro: Coroutine[Any, Any, object]) -> asyncio.Task[object] | Finished:
    """Run `coro`'s first step now, inside the task that owns it. `Finished` when that step
    ended it (returning or raising); otherwise the task, which runs the rest. Must be called
    on the running loop's thread."""
    loop = asyncio.get_running_loop()
    if sys.version_info >= (3, 12):
        task = asyncio.Task(coro, loop=loop, eager_start=True)
        if not task.done():
            return task
        if task.cancelled():
            return Finished(None, asyncio.CancelledError())
        error = task.exception()  # retrieved: never reported as unretrieved
        return Finished(None if error is not None else task.result(), error)
    return _start_311(loop, coro)
