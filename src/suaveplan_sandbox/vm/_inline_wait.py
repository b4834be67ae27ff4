"""When a call may wait for its answer inline, without a turn of the host's loop.

A call normally sends its frame and awaits a future that the loop's reader callback resolves.
Each hop through the loop (its selector noticing the frame, the reader callback, the future
waking the caller) costs more than the frame's own decoding, and a proxied read makes three:
the worker's host call, the reply's answer, the result. So when the sandbox polls for answers
(`busy_poll_us`) and no other sandbox on the loop has a job in flight, `VmSandbox.call` reads
the worker's frames itself, right after sending, serving a host call the gateway completes
there, until the call's result arrives, a host call has to wait on the loop (an adapter that
suspends), or `INLINE_WAIT_US` pass without a frame.

A wait holds the loop for at most `INLINE_WAIT_US` without a frame and `MAX_HOLD_MS` in all,
as a call that did that much work on the host would, and never while another sandbox's
answer could be waiting for it. A call answered inline returns without yielding to the loop,
so calls answered inline one after another (a task calling in a tight loop, or many tasks
each making one call in the same turn) would keep the loop from polling its I/O and running
its timers. So inline waits may only start within `MAX_HOLD_MS` of the first one since the
loop last turned; after that a call waits on the loop as usual (and so yields, and lets the
sandboxes' answers overlap), and the next turn starts the count again. Time is the monotonic
clock's (`time.monotonic()`, the clock the C polling wait reads), whatever loop is running.
"""

from __future__ import annotations

import asyncio
import weakref
from time import monotonic
from typing import Final, final

# The longest one inline wait holds the loop (the sandbox's own `busy_poll_us` when smaller).
INLINE_WAIT_US: Final = 200
# How long inline waits may keep the loop from turning, one wait or several in a row.
MAX_HOLD_MS: Final = 2
MAX_HOLD_S: Final = MAX_HOLD_MS / 1000


@final
class LoopShare:
    """What the sandboxes of one event loop know of each other: how many have a job in
    flight, and since when inline waits have held the loop."""

    __slots__ = ("busy", "held_since")

    def __init__(self) -> None:
        self.busy = 0  # sandboxes of this loop with a job in flight
        # When the first inline wait since the loop last ran `_turned` began (monotonic).
        self.held_since: float | None = None

    def may_wait_inline(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Whether a call about to start (none of the loop's sandboxes busy) may wait
        inline; the first since the loop turned starts the hold."""
        if self.busy:
            return False
        since = self.held_since
        if since is None:
            self.held_since = monotonic()
            loop.call_soon(self._turned)
            return True
        return monotonic() - since <= MAX_HOLD_S

    def _turned(self) -> None:
        self.held_since = None


# Keyed weakly by the loop; a share holds no reference back to it.
_shares: Final[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopShare]] = (
    weakref.WeakKeyDictionary()
)


def loop_share(loop: asyncio.AbstractEventLoop) -> LoopShare:
    """The share of `loop`'s sandboxes (created on first use)."""
    share = _shares.get(loop)
    if share is None:
        share = _shares[loop] = LoopShare()
    return share
