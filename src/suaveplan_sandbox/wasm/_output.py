"""A run's captured stdout or stderr: the first `limit` bytes, then the stream fails.

Theory of operation. wasmtime-py (checked against 50.0.1) calls a `stdout_custom` /
`stderr_custom` callback from wasmtime's own I/O threads (not the guest's) with chunks of at
most 4 KiB, while the guest waits in `fd_write` until every chunk is taken; one guest write
of a large buffer is many calls. The callback answers how many bytes it took: `None` is all
of them, a negative number an error. On an error wasmtime fails that write with `EIO` and
closes the stream: every later write to it is `EIO` at once, without calling back (so a
guest looping on writes past the limit costs the host no Python). Two answers must never
happen: more than the chunk's length (wasmtime aborts the process) and an exception
(wasmtime-py prints it to the host's own stdout and answers `EIO`).

So `OutputCapture` keeps what fits under the limit (a write that crosses it leaves its
prefix), records `truncated`, and fails the stream, like a pipe into `head -c limit`: the
guest sees `EIO` on that write and every later one and decides itself whether to go on.
`take()` ends the capture (anything arriving later is refused) and returns the bytes.
"""

from __future__ import annotations

import errno
import threading
from typing import Final, final

# The bytes a run keeps of stdout, and as much again of stderr (`max_output_bytes`).
DEFAULT_MAX_OUTPUT_BYTES: Final = 1024 * 1024
_FAILED: Final = -errno.EIO


@final
class OutputCapture:
    """One stream of one run. Callable as wasmtime's custom-output callback."""

    __slots__ = ("_buf", "_closed", "_limit", "_lock", "truncated")

    def __init__(self, limit: int) -> None:
        self._buf = bytearray()
        self._limit = limit
        self._lock = threading.Lock()  # wasmtime may call from more than one I/O thread
        self._closed = False
        self.truncated = False

    def __call__(self, data: bytes) -> int | None:
        try:
            with self._lock:
                if self._closed or self.truncated:
                    return _FAILED
                room = self._limit - len(self._buf)
                if len(data) <= room:
                    self._buf += data
                    return None
                self._buf += data[:room]
                self.truncated = True
                return _FAILED
        except BaseException:  # nothing may unwind into wasmtime-py's callback wrapper
            return _FAILED

    def take(self) -> bytes:
        """The bytes kept; the capture refuses anything written after this."""
        with self._lock:
            self._closed = True
            return bytes(self._buf)
