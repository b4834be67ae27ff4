"""Loopback HTTP servers on threads, for the fetch adapter's tests."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from http.server import ThreadingHTTPServer

# A script answers one raw request (its head) with the bytes to send, in pieces.
Script = Callable[[bytes], Iterable[bytes]]


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


def _content_length(head: bytes) -> int:
    lowered = head.lower()
    if b"\r\ncontent-length:" not in lowered:
        return 0
    return int(lowered.split(b"\r\ncontent-length:")[1].split(b"\r\n")[0])


class ScriptedServer:
    """A loopback server that records each raw request (head, blank line and a
    Content-Length body) and answers it with what `script` returns for its head, byte for
    byte: the way to play a server that breaks HTTP. One request per connection, or with
    `keep_alive` one after another on each. `closed` is set when a client hung up while
    the script was still sending."""

    def __init__(self, script: Script, *, keep_alive: bool = False, timeout: float = 10) -> None:
        self.script = script
        self.requests: list[bytes] = []
        self.connections = 0
        self.closed = threading.Event()
        self._keep_alive = keep_alive
        self._timeout = timeout
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._sock.getsockname()[1]
        self._server = threading.Thread(target=self._serve, daemon=True)
        self._server.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(self._timeout)
            data = b""
            try:
                while True:
                    while b"\r\n\r\n" not in data:
                        more = conn.recv(65536)
                        if not more:
                            return
                        data += more
                    head, _, data = data.partition(b"\r\n\r\n")
                    length = _content_length(head)
                    while len(data) < length:
                        more = conn.recv(65536)
                        if not more:
                            return
                        data += more
                    self.requests.append(head + b"\r\n\r\n" + data[:length])
                    data = data[length:]
                    for piece in self.script(head):
                        conn.sendall(piece)
                    if not self._keep_alive:
                        return
            except OSError:
                self.closed.set()  # the client went away while we were still sending

    def close(self) -> None:
        # Closing alone does not wake a thread blocked in `accept` on Linux (it would stay
        # blocked for the rest of the session, on a descriptor number the next socket may
        # reuse); shutting the listener down does, and `accept` then fails.
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._server.join(timeout=10)
        assert not self._server.is_alive()


@contextlib.contextmanager
def scripted(script: Script, *, keep_alive: bool = False) -> Iterator[ScriptedServer]:
    """A `ScriptedServer` for the block, closed after it."""
    server = ScriptedServer(script, keep_alive=keep_alive)
    try:
        yield server
    finally:
        server.close()
