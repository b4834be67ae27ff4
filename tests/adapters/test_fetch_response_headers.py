"""What a granted server may put in response headers that reach the plugin.

A field value with CR, LF or NUL is a protocol violation (RFC 9110 section 5.5: reject the
message or replace them); other controls are invalid too. The adapter refuses the whole
response rather than drop or rewrite a header: a dropped `Content-Type` or a rewritten
`Location` changes what the response means. Values are handed over isomorphically (each
byte one character, as WHATWG fetch does), so a C1 control, or a UTF-8 encoded line
separator (whose bytes include one), would reach the plugin as a control character: refused
as well. Printable bytes above 0x9F (obs-text) still pass.
"""

from __future__ import annotations

import pytest

from adapters._http import Script, scripted
from suaveplan_sandbox.adapters._fetch import HttpxFetch
from suaveplan_sandbox.adapters._protocols import HttpRequest
from suaveplan_sandbox.errors import SuaveplanError


def _answering(field: bytes) -> Script:
    def script(head: bytes) -> list[bytes]:
        return [b"HTTP/1.1 200 OK\r\n" + field + b"\r\nContent-Length: 2\r\n\r\nok"]

    return script


async def _fetch(field: bytes) -> tuple[int, tuple[tuple[str, str], ...]]:
    with scripted(_answering(field)) as server:
        fetch = HttpxFetch(allow_private=True)
        try:
            response = await fetch.request(
                HttpRequest(url=server.url + "/", method="GET", rule="http:127.0.0.1")
            )
        finally:
            await fetch.aclose()
    return response.status, response.headers


@pytest.mark.parametrize(
    "field",
    [
        b"X-A: a\rb",
        b"X-A: a\nb",
        b"X-A: a\x00b",
        b"X-A: a\x01b",
        b"X-A: a\x08b",
        b"X-A: a\x0bb",
        b"X-A: a\x0cb",
        b"X-A: a\x1bb",  # ESC: terminal escape sequences in whatever prints it
        b"X-A: a\x1cb",  # FS, which str.splitlines() splits on
        b"X-A: a\x7fb",
        b"X-A: a\x85b",  # NEL as one byte (Latin-1)
        b"X-A: a\xc2\x85b",  # NEL in UTF-8
        b"X-A: a\xe2\x80\xa8b",  # LINE SEPARATOR in UTF-8
        b"X-A: a\xe2\x80\xa9b",  # PARAGRAPH SEPARATOR in UTF-8
        b"X-A: a\x9bb",  # CSI
        b"Location: /a\x1b[2Jb",
        b"X\x01A: v",
        b"X\x85A: v",
    ],
)
async def test_a_response_header_with_a_control_character_is_refused_with_a_code(
    field: bytes,
) -> None:
    with pytest.raises(SuaveplanError) as info:
        await _fetch(field)
    assert info.value.code == "SAND_FETCH_FAILED"


@pytest.mark.parametrize(
    "field",
    [b"X-A: a\x01b", b"X-A: a\x7fb", b"X-A: a\x85b", b"X-A: a\xe2\x80\xa8b"],
)
async def test_the_refusal_says_it_was_the_response_header(field: bytes) -> None:
    # The ones HTTP parsing itself let through are refused by the adapter, with a reason.
    with pytest.raises(SuaveplanError) as info:
        await _fetch(field)
    assert info.value.details == {"reason": "response-header-invalid"}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        (b"X-A: a\tb", "a\tb"),
        (b"X-A: caf\xe9", "caf\xe9"),  # Latin-1 obs-text: opaque data, one char a byte
        (b"X-A: \xc3\xa9t\xc3\xa9", "\xc3\xa9t\xc3\xa9"),  # UTF-8 without C1 bytes
        (b"X-A: a b ~!", "a b ~!"),
    ],
)
async def test_tabs_and_printable_bytes_still_reach_the_plugin(field: bytes, value: str) -> None:
    status, headers = await _fetch(field)
    assert status == 200
    assert ("X-A", value) in headers
