"""HttpxFetch against a granted server that is hostile in what it answers (the plugin may
collude with it): what a response can make the host read, parse and keep, and what a
connection it leaves behind can do to the next request on it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import pytest

from adapters._http import Script, ScriptedServer, scripted
from suaveplan_sandbox.adapters._fetch import HttpxFetch
from suaveplan_sandbox.adapters._protocols import HttpRequest
from suaveplan_sandbox.errors import SuaveplanError


def _server(script: Script) -> contextlib.AbstractContextManager[ScriptedServer]:
    return scripted(script, keep_alive=True)


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
