"""HttpxFetch against a plugin that picks url, method, headers and body, and a granted server
that answers maliciously: what reaches the wire, what the host keeps, and how it stops."""

from __future__ import annotations

import asyncio
import gzip
import socket
import ssl
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpcore
import pytest
import trustme

from adapters._http import Script, ScriptedServer, serving
from suaveplan_sandbox.adapters._fetch import HttpxFetch, _VettedBackend
from suaveplan_sandbox.adapters._protocols import HttpRequest
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions._decision import Allow, Deny


def _ok(head: bytes) -> list[bytes]:
    return [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"]


@pytest.fixture
def recorder() -> Iterator[ScriptedServer]:
    server = ScriptedServer(_ok)
    yield server
    server.close()


def _headers(raw: bytes) -> list[tuple[str, str]]:
    head = raw.split(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")[1:]
    return [(k.strip().lower(), v.strip()) for k, _, v in (line.partition(":") for line in head)]


async def _code(fetch: HttpxFetch, request: HttpRequest) -> SuaveplanError:
    with pytest.raises(SuaveplanError) as info:
        await fetch.request(request)
    return info.value


@pytest.mark.parametrize(
    "header",
    [
        ("Host", "internal.admin.test"),
        ("host", "internal.admin.test"),
        ("Content-Length", "0"),
        ("Transfer-Encoding", "chunked"),
        ("transfer-encoding", "chunked"),
        ("Connection", "Upgrade"),
        ("Upgrade", "websocket"),
        ("Keep-Alive", "timeout=5"),
        ("Proxy-Connection", "keep-alive"),
        ("TE", "trailers"),
        ("Trailer", "X-Checksum"),
    ],
)
async def test_a_plugin_cannot_set_the_headers_that_frame_the_message_or_name_the_host(
    header: tuple[str, str], recorder: ScriptedServer
) -> None:
    # Transfer-Encoding beside the host's Content-Length is a request-smuggling pair; a second
    # Host reaches another virtual host on the granted address (domain fronting).
    fetch = HttpxFetch(allow_private=True)
    error = await _code(
        fetch,
        HttpRequest(
            url=f"http://127.0.0.1:{recorder.port}/",
            method="POST",
            headers=(header,),
            body=b"0\r\n\r\nGET /admin HTTP/1.1\r\nHost: internal\r\n\r\n",
            rule="x",
        ),
    )
    assert error.code == "SAND_FETCH_FAILED"
    assert error.details == {"reason": "header-not-permitted"}
    assert recorder.connections == 0
    await fetch.aclose()


@pytest.mark.parametrize(
    "header",
    [
        ("X-A", "a\r\nX-Injected: 1"),
        ("X-A", "a\nX-Injected: 1"),
        ("X-A", "a\x00b"),
        ("X-A", "caf\u00e9"),
        ("X-A", "\u2028"),
        ("X-\u00e9", "a"),
        ("X A", "a"),
        ("X-A:", "a"),
        ("", "a"),
        ("X-A\r\nX-B", "a"),
    ],
)
async def test_header_names_and_values_that_are_not_tokens_and_printable_ascii_are_refused(
    header: tuple[str, str], recorder: ScriptedServer
) -> None:
    calls: list[str] = []

    async def resolver(host: str, port: int) -> list[str]:
        calls.append(host)
        return ["127.0.0.1"]

    fetch = HttpxFetch(allow_private=True, resolver=resolver)
    error = await _code(
        fetch,
        HttpRequest(url=f"http://plugin.test:{recorder.port}/", headers=(header,), rule="x"),
    )
    assert error.code == "SAND_FETCH_FAILED"
    assert error.details == {"reason": "header-invalid"}
    assert calls == [] and recorder.connections == 0
    await fetch.aclose()


async def test_the_host_frames_the_body_itself_with_one_content_length(
    recorder: ScriptedServer,
) -> None:
    fetch = HttpxFetch(allow_private=True)
    body = b"0\r\n\r\nGET /smuggled HTTP/1.1\r\n\r\n"
    response = await fetch.request(
        HttpRequest(
            url=f"http://127.0.0.1:{recorder.port}/",
            method="POST",
            headers=(("Content-Type", "text/plain"),),
            body=body,
            rule="x",
        )
    )
    assert response.status == 200
    [raw] = recorder.requests
    headers = _headers(raw)
    assert [v for k, v in headers if k == "content-length"] == [str(len(body))]
    assert [k for k, _ in headers if k == "transfer-encoding"] == []
    assert [v for k, v in headers if k == "host"] == [f"127.0.0.1:{recorder.port}"]
    assert raw.endswith(b"\r\n\r\n" + body)
    await fetch.aclose()


async def test_a_cookie_a_server_sets_is_never_sent_with_a_later_request() -> None:
    def set_cookie(head: bytes) -> list[bytes]:
        return [
            b"HTTP/1.1 200 OK\r\nSet-Cookie: session=granted-host-secret; Path=/\r\n"
            b"Content-Length: 2\r\nConnection: close\r\n\r\nok"
        ]

    server = ScriptedServer(set_cookie)
    fetch = HttpxFetch(allow_private=True)
    for _ in range(2):
        response = await fetch.request(
            HttpRequest(url=f"http://127.0.0.1:{server.port}/", rule="x")
        )
        assert ("Set-Cookie", "session=granted-host-secret; Path=/") in response.headers
    assert len(server.requests) == 2
    assert all(k != "cookie" for raw in server.requests for k, _ in _headers(raw))
    await fetch.aclose()
    server.close()


def _gzip_if_asked(head: bytes) -> list[bytes]:
    asked = [v for k, v in _headers(head + b"\r\n\r\n") if k == "accept-encoding"]
    if asked and "gzip" in asked[0]:
        body = gzip.compress(b"hello" * 4)
        return [
            b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n"
            b"Connection: close\r\n\r\n" % len(body),
            body,
        ]
    return [b"HTTP/1.1 200 OK\r\nContent-Length: 20\r\nConnection: close\r\n\r\n" + b"hello" * 4]


async def test_the_host_asks_for_identity_bodies_and_never_decodes_one_it_did_not_ask_for() -> None:
    server = ScriptedServer(_gzip_if_asked)
    fetch = HttpxFetch(allow_private=True)
    plain = await fetch.request(HttpRequest(url=f"http://127.0.0.1:{server.port}/", rule="x"))
    assert plain.body == b"hello" * 4
    assert ("accept-encoding", "identity") in _headers(server.requests[0])
    # A plugin that asks for gzip gets the bytes as sent: the host decompresses nothing, so a
    # decompression bomb costs the host only its compressed size.
    packed = await fetch.request(
        HttpRequest(
            url=f"http://127.0.0.1:{server.port}/",
            headers=(("Accept-Encoding", "gzip"),),
            rule="x",
        )
    )
    assert gzip.decompress(packed.body) == b"hello" * 4
    assert [k for k, _ in _headers(server.requests[1]) if k == "accept-encoding"] == [
        "accept-encoding"
    ]
    await fetch.aclose()
    server.close()


async def test_host_configuration_in_the_environment_is_not_applied_to_plugin_requests(
    recorder: ScriptedServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    proxy = ScriptedServer(_ok)
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login host-user password host-password\n")
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "all_proxy"):
        monkeypatch.setenv(name, f"http://127.0.0.1:{proxy.port}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.setenv("NETRC", str(netrc))
    fetch = HttpxFetch(allow_private=True)
    response = await fetch.request(HttpRequest(url=f"http://127.0.0.1:{recorder.port}/", rule="x"))
    assert response.status == 200
    assert proxy.requests == [] and len(recorder.requests) == 1
    assert all(k != "authorization" for k, _ in _headers(recorder.requests[0]))
    await fetch.aclose()
    proxy.close()


async def test_credentials_in_the_url_are_sent_as_basic_auth_to_that_url_only(
    recorder: ScriptedServer,
) -> None:
    fetch = HttpxFetch(allow_private=True)
    await fetch.request(
        HttpRequest(url=f"http://us%40er:p%3Ass@127.0.0.1:{recorder.port}/", rule="x")
    )
    assert ("authorization", "Basic dXNAZXI6cDpzcw==") in _headers(recorder.requests[0])
    await fetch.aclose()


def _redirect_to(target: str, status: int = 307) -> Script:
    def script(head: bytes) -> list[bytes]:
        if head.startswith((b"GET /start", b"POST /start")):
            return [
                b"HTTP/1.1 %d Moved\r\nLocation: %s\r\nContent-Length: 0\r\n"
                b"Connection: close\r\n\r\n" % (status, target.encode())
            ]
        return _ok(head)

    return script


async def _follow(server: ScriptedServer, start: str, request: HttpRequest) -> None:
    async def resolver(host: str, port: int) -> list[str]:
        return ["127.0.0.1"]

    def recheck(url: str) -> Allow | Deny:
        return Allow(rule="x", target=url)

    fetch = HttpxFetch(
        allow_private=True, resolver=resolver, follow_redirects=True, recheck=recheck
    )
    response = await fetch.request(request)
    assert response.status == 200
    await fetch.aclose()


_CREDENTIALED = (
    ("Authorization", "Bearer plugin-token"),
    ("Cookie", "session=abc"),
    ("Proxy-Authorization", "Basic eDp5"),
    ("X-Trace", "1"),
)


async def test_credentials_are_dropped_when_a_redirect_leaves_the_origin() -> None:
    server = ScriptedServer(lambda head: [])
    server.script = _redirect_to(f"http://elsewhere.test:{server.port}/final")
    start = f"http://plugin.test:{server.port}/start"
    await _follow(server, start, HttpRequest(url=start, headers=_CREDENTIALED, rule="x"))
    first, second = (_headers(raw) for raw in server.requests)
    assert ("authorization", "Bearer plugin-token") in first
    assert ("cookie", "session=abc") in first
    names = {k for k, _ in second}
    assert ("host", f"elsewhere.test:{server.port}") in second
    assert "x-trace" in names
    assert not names & {"authorization", "cookie", "proxy-authorization"}
    server.close()


async def test_credentials_are_kept_when_a_redirect_stays_on_the_origin() -> None:
    server = ScriptedServer(lambda head: [])
    server.script = _redirect_to("/final")
    start = f"http://plugin.test:{server.port}/start"
    await _follow(server, start, HttpRequest(url=start, headers=_CREDENTIALED, rule="x"))
    second = _headers(server.requests[1])
    assert ("authorization", "Bearer plugin-token") in second
    assert ("cookie", "session=abc") in second
    server.close()


async def test_a_redirect_that_turns_a_post_into_a_get_drops_the_body_and_its_headers() -> None:
    server = ScriptedServer(lambda head: [])
    server.script = _redirect_to("/final", status=303)
    start = f"http://plugin.test:{server.port}/start"
    await _follow(
        server,
        start,
        HttpRequest(
            url=start,
            method="POST",
            headers=(("Content-Type", "application/json"), ("X-Trace", "1")),
            body=b'{"a": 1}',
            rule="x",
        ),
    )
    second = server.requests[1]
    assert second.startswith(b"GET /final HTTP/1.1\r\n")
    names = {k for k, _ in _headers(second)}
    assert "x-trace" in names
    assert not names & {"content-type", "content-length"}
    assert second.endswith(b"\r\n\r\n")
    server.close()


def _endless_chunks(head: bytes) -> list[bytes]:
    return [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"] + [
        b"1000\r\n" + b"x" * 0x1000 + b"\r\n"
    ] * 10_000


async def test_an_endless_chunked_body_is_cut_at_the_limit_while_it_streams() -> None:
    server = ScriptedServer(_endless_chunks)
    fetch = HttpxFetch(allow_private=True, max_response_bytes=64 * 1024, timeout=30)
    error = await _code(fetch, HttpRequest(url=f"http://127.0.0.1:{server.port}/", rule="x"))
    assert error.code == "SAND_FETCH_TOO_LARGE"
    # The host hung up long before the 40 MB the server meant to send.
    assert await asyncio.to_thread(server.closed.wait, 10)
    await fetch.aclose()
    server.close()


def _short_body(head: bytes) -> list[bytes]:
    return [b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\nConnection: close\r\n\r\nonly this"]


async def test_a_content_length_longer_than_the_body_is_a_failed_fetch() -> None:
    server = ScriptedServer(_short_body)
    fetch = HttpxFetch(allow_private=True)
    error = await _code(fetch, HttpRequest(url=f"http://127.0.0.1:{server.port}/", rule="x"))
    assert error.code == "SAND_FETCH_FAILED"
    await fetch.aclose()
    server.close()


def _drip(head: bytes) -> Iterator[bytes]:
    yield b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n"
    for _ in range(2000):
        time.sleep(0.05)
        yield b"x"


async def test_cancelling_a_fetch_closes_its_connection_promptly() -> None:
    # The sandbox's wall-clock budget and dispose() cancel the adapter's awaitable.
    server = ScriptedServer(_drip)
    fetch = HttpxFetch(allow_private=True, timeout=60)
    task = asyncio.create_task(
        fetch.request(HttpRequest(url=f"http://127.0.0.1:{server.port}/", rule="x"))
    )
    while not server.requests:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # The server's next write fails once the host has closed the socket (well within 60 s).
    assert await asyncio.to_thread(server.closed.wait, 10)
    await fetch.aclose()
    server.close()


class _KeepAlive(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    connections = 0

    def log_message(self, format: str, *args: object) -> None:
        pass

    def setup(self) -> None:
        type(self).connections += 1
        super().setup()

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "5")
        self.end_headers()
        self.wfile.write(b"hello")


@pytest.fixture
def keepalive_tls() -> Iterator[tuple[int, ssl.SSLContext, type[_KeepAlive]]]:
    ca = trustme.CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("plugin.test").configure_cert(server_ctx)
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)
    handler = type("_Counted", (_KeepAlive,), {"connections": 0})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.socket = server_ctx.wrap_socket(httpd.socket, server_side=True)
    with serving(httpd):
        yield httpd.server_address[1], client_ctx, handler


async def test_a_tls_connection_verified_for_one_name_is_never_reused_for_another(
    keepalive_tls: tuple[int, ssl.SSLContext, type[_KeepAlive]],
) -> None:
    port, ctx, handler = keepalive_tls

    async def resolver(host: str, port: int) -> list[str]:
        return ["127.0.0.1"]  # both names share one address, as on a CDN

    fetch = HttpxFetch(allow_private=True, resolver=resolver, verify=ctx)
    for _ in range(2):
        ok = await fetch.request(HttpRequest(url=f"https://plugin.test:{port}/", rule="x"))
        assert ok.body == b"hello"
    assert handler.connections == 1  # the same name does reuse its verified connection
    # The certificate does not cover other.test: the pooled plugin.test connection must not
    # carry its request.
    error = await _code(fetch, HttpRequest(url=f"https://other.test:{port}/", rule="x"))
    assert error.code == "SAND_FETCH_FAILED"
    await fetch.aclose()


async def test_the_transport_dials_nothing_outside_a_vetted_request() -> None:
    backend = _VettedBackend()
    with pytest.raises(httpcore.ConnectError):
        await backend.connect_tcp("127.0.0.1", 9)
    with pytest.raises(httpcore.ConnectError):
        await backend.connect_unix_socket("/run/anything.sock")


@pytest.fixture
def swallowing_addresses() -> Iterator[tuple[list[str], int]]:
    """Loopback addresses whose full accept queues drop SYNs: a connect there hangs."""
    port = 0
    keep: list[socket.socket] = []
    addresses = [f"127.0.0.{i}" for i in range(2, 10)]
    for address in addresses:
        listener = socket.socket()
        listener.bind((address, port))
        port = listener.getsockname()[1]
        listener.listen(0)
        keep.append(listener)
        for _ in range(3):
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex((address, port))  # in progress: it fills the queue
            keep.append(filler)
    time.sleep(0.1)
    yield addresses, port
    for sock in keep:
        sock.close()


async def test_connect_has_one_deadline_across_all_vetted_addresses(
    swallowing_addresses: tuple[list[str], int],
) -> None:
    addresses, port = swallowing_addresses

    async def resolver(host: str, port: int) -> list[str]:
        return list(addresses)

    fetch = HttpxFetch(allow_private=True, resolver=resolver, timeout=0.5)
    started = time.monotonic()
    with pytest.raises(SuaveplanError) as info:
        await fetch.connect("many.test", port, rule="many.test")
    # Eight addresses at the full timeout each would take 4 s and hold a thread meanwhile.
    assert time.monotonic() - started < 2.5
    assert info.value.code == "SAND_FETCH_TIMEOUT"
    await fetch.aclose()
