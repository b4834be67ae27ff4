"""When a call may wait for its answer inline, without a turn of the host's loop.

A call normally sends its frame and awaits a future that the loop's reader callback resolves.
Each hop through the loop (its selector noticing the frame, the reader callback, the future
waking the caller) costs more than the frame's own decoding, and a proxied read makes three:
the worker's host call, the reply's answer, the result. So when the sandbox polls for answers
(`busy_poll_us`) and no other sandbox on the loop has a job in flight, `VmSandbox.call` reads
the worker's frames itself, right after sending, serving a host call the gateway completes
there, until the call's result arrives, a host call has to wait on the loop (an adapter that
suspends), or `INLINE_WAIT_US` pass without a frame.

That holds the loop for at most `INLINE_WAIT_US` a wait, as a call that did that much work on
the host would, and never while another sandbox's answer could be waiting for it. A call
answered inline need not yield to the loop, and one that yielded every time would pay a turn
of the loop for each: instead, a call answered inline yields once (`asyncio.sleep(0)`) when
the loop has not turned for `MAX_HOLD_MS`, so a task calling in a tight loop lets every other
task run at least that often.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Final, final

# The longest one inline wait holds the loop (the sandbox's own `busy_poll_us` when smaller).
INLINE_WAIT_US: Final = 200
# How long calls answered inline may keep the loop from turning before one yields.
MAX_HOLD_MS: Final = 2
MAX_HOLD_S: Final = MAX_HOLD_MS / 1000


@final
class LoopShare:
    """What the sandboxes of one event loop know of each other: how many have a job in
    flight, and since when calls answered inline have held the loop."""

    __slots__ = ("busy", "held_since")

    def __init__(self) -> None:
        self.busy = 0  # sandboxes of this loop with a job in flight
        # Loop time of the first call answered inline since the loop last ran `_turned`.
        self.held_since: float | None = None

    def answered_inline(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Note a call answered inline; True when it must yield to the loop before returning."""
        now = loop.time()
        since = self.held_since
        if since is None:
            self.held_since = now
            loop.call_soon(self._turned)
            return False
        return now - since > MAX_HOLD_S

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
