"""`fork()` for the tests whose child runs a few lines of our own code in a copy of the test
process (hardening applied to it, an fd or lifeline check) and then `os._exit`s.

From Python 3.12 `os.fork()` warns (DeprecationWarning) when the process has other threads:
a lock one of them holds at that moment stays held in the child, which deadlocks if the child
takes it. The sandboxes never fork a host process (workers come from a fork server started as
a fresh interpreter); only these tests do. So before it forks, this checks which threads are
alive and allows only the long-lived ones the suite leaves running by design, none of which
the children touch:

- `suaveplan-wasm-epoch`: the WASM engine's epoch ticker (`wasm._engine`), a daemon that
  sleeps and bumps a counter inside wasmtime, which no child calls;
- `asyncio_*`: idle workers of an event loop's default executor (`asyncio.to_thread`), which
  wait on a queue with no lock held;

and then forks without the warning. Any other thread alive fails the test that forks: it is
a thread some earlier test left running, which is a leak to fix, and a lock it holds could
hang the child.
"""

from __future__ import annotations

import os
import threading
import warnings
from typing import Final

_ALLOWED_PREFIXES: Final = ("suaveplan-wasm-epoch", "asyncio_")


def unexpected_threads() -> list[str]:
    """Names of the live threads, other than this one, that `fork` does not allow."""
    me = threading.current_thread()
    return sorted(
        t.name
        for t in threading.enumerate()
        if t is not me and not t.name.startswith(_ALLOWED_PREFIXES)
    )


def fork() -> int:
    """`os.fork()` after checking that only the allowed threads are alive (see above)."""
    unexpected = unexpected_threads()
    assert not unexpected, f"threads alive at fork (an earlier test leaked them): {unexpected}"
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=r"This process .* is multi-threaded", category=DeprecationWarning
        )
        return os.fork()
