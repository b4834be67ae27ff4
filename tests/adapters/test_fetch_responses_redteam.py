"""HttpxFetch against a granted server that is hostile in what it answers (the plugin may
collude with it): what a response can make the host read, parse and keep, and what a
connection it leaves behind can do to the next request on it."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Callable, Iterable, Iterator

import pytest

from suaveplan_sandbox.adapters._fetch import HttpxFetch
from suaveplan_sandbox.adapters._protocols import HttpRequest
from suaveplan_sandbox.errors import SuaveplanError

# A script answers one request (its head) with the bytes to send, in pieces.
Script = Callable[[bytes], Iterable[bytes]]


class _KeepAliveServer:
    """A loopback server that answers requests one after another on each connection."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections = 0
        self.requests: list[bytes] = []
        self.closed = threading.Event()
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
            conn.settimeout(30)
            data = b""
            try:
                while True:
                    while b"\r\n\r\n" not in data:
                        more = conn.recv(65536)
                        if not more:
                            return
                        data += more
                    head, _, data = data.partition(b"\r\n\r\n")
                    self.requests.append(head)
                    for piece in self.script(head):
                        conn.sendall(piece)
            except OSError:
                self.closed.set()  # the client hung up while we were still sending

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._server.join(timeout=10)


@contextlib.contextmanager
def _server(script: Script) -> Iterator[_KeepAliveServer]:
    server = _KeepAliveServer(script)
    try:
        yield server
    finally:
        server.close()


async def _code(fetch: HttpxFetch, request: HttpRequest) -> SuaveplanError:
    with pytest.raises(SuaveplanError) as info:
        await fetch.request(request)
    return info.value


def _answer(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


_FORGED = _answer(b"forged by the previous response")


def _two_responses_for_one(head: bytes) -> list[bytes]:
    # One write: both responses arrive in the host's first read, before the next request.
    if head.startswith(b"GET /a "):
        return [_answer(b"first") + _FORGED]
    return [_answer(b"the real answer")]


def _a_body_on_head(head: bytes) -> list[bytes]:
    if head.startswith(b"HEAD "):  # a HEAD response has no body: these bytes are extra
        return [b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(_FORGED) + _FORGED]
    return [_answer(b"the real answer")]


def _a_body_on_204(head: bytes) -> list[bytes]:
    if head.startswith(b"GET /a "):  # 204 and 304 responses end at their headers
        return [b"HTTP/1.1 204 No Content\r\n\r\n" + _FORGED]
    return [_answer(b"the real answer")]


@pytest.mark.parametrize(
    ("script", "first_method"),
    [(_two_responses_for_one, "GET"), (_a_body_on_head, "HEAD"), (_a_body_on_204, "GET")],
)
async def test_bytes_past_the_end_of_a_response_never_answer_the_next_request(
    script: Script, first_method: str
) -> None:
    # With one adapter shared by several plugins, the next request may be another plugin's:
    # it must not read the attacker's bytes, nor its own answer go to the request after it.
    fetch = HttpxFetch(allow_private=True)
    with _server(script) as server:
        await fetch.request(HttpRequest(url=server.url + "/a", method=first_method, rule="x"))
        for _ in range(2):
            answer = await fetch.request(HttpRequest(url=server.url + "/b", rule="x"))
            assert answer.body == b"the real answer"
    await fetch.aclose()


def _honest(head: bytes) -> list[bytes]:
    response = _answer(b"ok")
    return [response[: -len(b"ok")] if head.startswith(b"HEAD ") else response]


async def test_a_connection_that_ended_cleanly_is_still_reused() -> None:
    fetch = HttpxFetch(allow_private=True)
    with _server(_honest) as server:
        for method in ("GET", "HEAD", "GET"):
            answer = await fetch.request(HttpRequest(url=server.url, method=method, rule="x"))
            assert answer.status == 200
        assert server.connections == 1
    await fetch.aclose()


def _flood(head: bytes, repeat: bytes) -> Script:
    def script(request: bytes) -> Iterator[bytes]:
        yield head
        while True:  # until the host hangs up
            yield repeat * 64

    return script


_CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


@pytest.mark.parametrize(
    "script",
    [
        # Interim responses never end the head: nothing reaches the body limit.
        _flood(b"", b"HTTP/1.1 100 Continue\r\n\r\n"),
        _flood(b"", b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n"),
        # A 60 kB chunk extension per body byte: gigabytes parsed for a few bytes of body.
        _flood(_CHUNKED, b"1;" + b"e" * 60_000 + b"\r\nx\r\n"),
        # One-byte chunks: a parse step and a Python object per byte of body.
        _flood(_CHUNKED, b"1\r\nx\r\n" * 1000),
    ],
    ids=["100-continue", "103-early-hints", "chunk-extensions", "one-byte-chunks"],
)
async def test_what_a_response_makes_the_host_parse_is_bounded_not_just_its_body(
    script: Script,
) -> None:
    # Before the bound the host parsed at full speed, on its event loop, until the deadline.
    fetch = HttpxFetch(allow_private=True, timeout=15)
    with _server(script) as server:
        error = await _code(fetch, HttpRequest(url=server.url, rule="x"))
        assert error.code == "SAND_FETCH_TOO_LARGE"
        assert await asyncio.to_thread(server.closed.wait, 10)
        # The host keeps working, on the same adapter.
    with _server(lambda head: [_answer(b"ok")]) as server:
        answer = await fetch.request(HttpRequest(url=server.url, rule="x"))
        assert answer.body == b"ok"
    await fetch.aclose()


async def test_a_body_up_to_the_limit_still_arrives_whole_in_ordinary_chunks() -> None:
    body = bytes(range(256)) * 4096  # 1 MiB
    pieces = [body[i : i + 1000] for i in range(0, len(body), 1000)]
    chunked = [b"%x\r\n%s\r\n" % (len(p), p) for p in pieces]
    fetch = HttpxFetch(allow_private=True, max_response_bytes=len(body))
    with _server(lambda head: [_CHUNKED, *chunked, b"0\r\n\r\n"]) as server:
        answer = await fetch.request(HttpRequest(url=server.url, rule="x"))
        assert answer.body == body
        assert type(answer.body) is bytes
    await fetch.aclose()
