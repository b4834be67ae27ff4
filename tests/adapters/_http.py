"""A loopback HTTP server on a thread, for the fetch adapter's tests."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer


@contextlib.contextmanager
def serving(httpd: ThreadingHTTPServer) -> Iterator[ThreadingHTTPServer]:
    """`httpd` answering on a daemon thread until the block ends; then stopped (`shutdown`
    waits for its loop to return, so no thread outlives the block) and its socket closed."""
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()
