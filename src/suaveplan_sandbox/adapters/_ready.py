"""`Ready`: an adapter's answer that is there already, in the shape of a coroutine.

Some adapter calls can often answer at once and otherwise must wait: `BeneathRootFs` serves a
read the kernel's caches hold on the calling thread and sends any other to a worker thread.
Declared `async def`, such a method makes every caller pay for a coroutine, and the gateway
for the `asyncio.Task` every coroutine adapter runs in (`asyncio.timeout`, task groups and
anyio need one), even when nothing waits: on our benchmark machine that task was a tenth of a
proxied read. So the method is a plain `def` returning either `Ready(value)` or a coroutine.

`Ready` is a coroutine in every way callers use one: `await` gives the value without
suspending, and `asyncio.create_task`, `gather` and `ensure_future` accept it. It is not a
native coroutine, so it is never reported as "never awaited" when dropped. The gateway
recognises it by its exact type and takes `value` directly: no task, no trip round the loop,
and on a thread that may block (`dispatch_sync`) no hop to the loop at all.
"""

from __future__ import annotations

from collections.abc import Coroutine, Generator
from typing import Any, NoReturn, TypeVar, final

_T = TypeVar("_T")


@final
class Ready(Coroutine[Any, Any, _T]):
    """A coroutine that has finished: its result is `value`."""

    __slots__ = ("value",)

    def __init__(self, value: _T) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"Ready({self.value!r})"

    def __await__(self) -> Generator[Any, None, _T]:
        return self.value
        yield  # a generator function: the value is its return, nothing is yielded

    def send(self, value: object) -> NoReturn:
        raise StopIteration(self.value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> NoReturn:
        # As a finished step would: what is thrown in is raised out (a task cancelled before
        # its first step). The one-argument form is what asyncio uses.
        raise typ if val is None else val

    def close(self) -> None:
        return None
