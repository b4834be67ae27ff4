"""HttpxFetch: address vetting, no DNS rebinding, redirects, limits, against a loopback server."""

from __future__ import annotations

import ipaddress
import ssl
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import trustme

from adapters._http import serving
from suaveplan_sandbox.adapters._fetch import HttpxFetch, Resolver, address_refused
from suaveplan_sandbox.adapters._protocols import HttpRequest
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions._decision import Allow, Deny, DenyReason


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        if self.path == "/big":
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"x" * 5000)
        elif self.path == "/slow":
            time.sleep(1.0)
            self.send_response(200)
            self.end_headers()
        elif self.path == "/drip":
            # Each byte arrives well within any per-read timeout; the whole never does.
            self.send_response(200)
            self.end_headers()
            for _ in range(30):
                self.wfile.write(b"x")
                self.wfile.flush()
                time.sleep(0.1)
        elif self.path.startswith("/redirect"):
            self.send_response(302)
            self.send_header("Location", self.path.split("=", 1)[1])
            self.end_headers()
        else:
            self.send_response(200)
            self.send_header("X-Host", self.headers.get("Host", ""))
            self.end_headers()
            self.wfile.write(b"hello")


@pytest.fixture(scope="module")
def server() -> Iterator[int]:
    with serving(ThreadingHTTPServer(("127.0.0.1", 0), _Handler)) as httpd:
        yield httpd.server_address[1]


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.1.2.3",
        "192.168.0.1",
        "169.254.169.254",
        "100.64.0.1",
        "224.0.0.1",
        "0.0.0.0",
        "240.0.0.1",
        "::1",
        "::",
        "fe80::1",
        "fc00::1",
        "ff02::1",
        "::ffff:127.0.0.1",
        "::ffff:10.0.0.1",
        "2002:7f00:1::",
        "64:ff9b::a00:1",
        "::127.0.0.1",
    ],
)
def test_non_public_addresses_are_refused(address: str) -> None:
    assert address_refused(ipaddress.ip_address(address))


@pytest.mark.parametrize("address", ["93.184.216.34", "2606:4700::1111", "64:ff9b::808:808"])
def test_public_addresses_are_accepted(address: str) -> None:
    assert not address_refused(ipaddress.ip_address(address))


async def test_a_loopback_request_with_the_opt_in_reaches_the_server(server: int) -> None:
    fetch = HttpxFetch(allow_private=True)
    response = await fetch.request(HttpRequest(url=f"http://127.0.0.1:{server}/", rule="x"))
    assert response.status == 200 and response.body == b"hello"
    await fetch.aclose()


async def test_loopback_is_refused_without_the_opt_in_unless_the_rule_is_that_ip(
    server: int,
) -> None:
    fetch = HttpxFetch()
    with pytest.raises(SuaveplanError) as info:
        await fetch.request(HttpRequest(url=f"http://127.0.0.1:{server}/", rule="example.com"))
    assert info.value.code == "SAND_FETCH_ADDRESS_REFUSED"
    ok = await fetch.request(HttpRequest(url=f"http://127.0.0.1:{server}/", rule="http:127.0.0.1"))
    assert ok.status == 200
    await fetch.aclose()


async def test_dns_rebinding_cannot_redirect_the_dial(server: int) -> None:
    answers = iter([["127.0.0.1"], ["10.0.0.1"]])
    calls: list[str] = []

    async def resolver(host: str, port: int) -> list[str]:
        calls.append(host)
        return next(answers)

    fetch = HttpxFetch(allow_private=True, resolver=resolver)
    response = await fetch.request(
        HttpRequest(url=f"http://plugin.test:{server}/", rule="http:plugin.test")
    )
    # One lookup; the vetted address was dialled with Host kept as the original name.
    assert calls == ["plugin.test"]
    assert dict(response.headers)["X-Host"] == f"plugin.test:{server}"

    async def private(host: str, port: int) -> list[str]:
        return ["93.184.216.34", "10.0.0.1"]

    with pytest.raises(SuaveplanError) as info:
        await HttpxFetch(resolver=private).request(
            HttpRequest(url="https://a.test/", rule="a.test")
        )
    assert info.value.code == "SAND_FETCH_ADDRESS_REFUSED"
    await fetch.aclose()


async def test_redirects_are_refused_by_default_and_rechecked_when_on(server: int) -> None:
    base = f"http://127.0.0.1:{server}"
    fetch = HttpxFetch(allow_private=True)
    with pytest.raises(SuaveplanError) as info:
        await fetch.request(HttpRequest(url=f"{base}/redirect?to=/", rule="x"))
    assert info.value.code == "SAND_FETCH_REDIRECT_REFUSED"

    def recheck(url: str) -> Allow | Deny:
        if url.startswith(base):
            return Allow(rule="http:127.0.0.1", target=url)
        return Allow(rule="evil.test", target=url)

    follow = HttpxFetch(follow_redirects=True, recheck=recheck, resolver=None)
    ok = await HttpxFetch(allow_private=True, follow_redirects=True, recheck=recheck).request(
        HttpRequest(url=f"{base}/redirect?to=/", rule="x")
    )
    assert ok.body == b"hello"
    # A public first hop redirected to a private address: the second hop is re-vetted.
    with pytest.raises(SuaveplanError) as info:
        await follow.request(
            HttpRequest(url=f"{base}/redirect?to=http://169.254.169.254/", rule="http:127.0.0.1")
        )
    assert info.value.code == "SAND_FETCH_ADDRESS_REFUSED"
    await fetch.aclose()
    await follow.aclose()


async def test_oversized_and_slow_responses_have_codes(server: int) -> None:
    base = f"http://127.0.0.1:{server}"
    fetch = HttpxFetch(allow_private=True, max_response_bytes=1000, timeout=0.2)
    with pytest.raises(SuaveplanError) as info:
        await fetch.request(HttpRequest(url=f"{base}/big", rule="x"))
    assert info.value.code == "SAND_FETCH_TOO_LARGE"
    with pytest.raises(SuaveplanError) as info:
        await fetch.request(HttpRequest(url=f"{base}/slow", rule="x"))
    assert info.value.code == "SAND_FETCH_TIMEOUT"
    drip = HttpxFetch(allow_private=True, timeout=0.5)
    with pytest.raises(SuaveplanError) as info:
        await drip.request(HttpRequest(url=f"{base}/drip", rule="x"))
    assert info.value.code == "SAND_FETCH_TIMEOUT"
    await drip.aclose()
    few = HttpxFetch(allow_private=True, max_headers=1)
    with pytest.raises(SuaveplanError) as info:
        await few.request(HttpRequest(url=f"{base}/", rule="x"))
    assert info.value.code == "SAND_FETCH_TOO_LARGE"
    await fetch.aclose()
    await few.aclose()


async def test_connect_vets_the_address_and_returns_a_socket(server: int) -> None:
    with pytest.raises(SuaveplanError) as info:
        await HttpxFetch().connect("127.0.0.1", server, rule="a.test")
    assert info.value.code == "SAND_FETCH_ADDRESS_REFUSED"
    sock = await HttpxFetch().connect("127.0.0.1", server, rule="127.0.0.1")
    assert sock.getpeername()[1] == server
    sock.close()


@pytest.fixture(scope="module")
def tls_server() -> Iterator[tuple[int, ssl.SSLContext]]:
    ca = trustme.CA()
    cert = ca.issue_cert("plugin.test")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(server_ctx)
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.socket = server_ctx.wrap_socket(httpd.socket, server_side=True)
    with serving(httpd):
        yield httpd.server_address[1], client_ctx


async def test_https_dials_the_vetted_ip_and_verifies_the_original_hostname(
    tls_server: tuple[int, ssl.SSLContext],
) -> None:
    port, ctx = tls_server

    async def resolver(host: str, port: int) -> list[str]:
        return ["127.0.0.1"]

    fetch = HttpxFetch(allow_private=True, resolver=resolver, verify=ctx)
    response = await fetch.request(HttpRequest(url=f"https://plugin.test:{port}/", rule="x"))
    assert response.body == b"hello"
    with pytest.raises(SuaveplanError) as info:
        await fetch.request(HttpRequest(url=f"https://other.test:{port}/", rule="x"))
    assert info.value.code == "SAND_FETCH_FAILED"
    await fetch.aclose()


def _counting_resolver(answers: list[str]) -> tuple[Resolver, list[str]]:
    calls: list[str] = []

    async def resolver(host: str, port: int) -> list[str]:
        calls.append(host)
        return list(answers)

    return resolver, calls


@pytest.mark.parametrize(
    "answers",
    [
        ["93.184.216.34", "10.0.0.1"],
        ["10.0.0.1", "93.184.216.34"],
        ["2606:4700::1111", "::ffff:127.0.0.1"],
        ["93.184.216.34", "not-an-address"],
    ],
)
async def test_an_answer_set_mixing_public_and_private_is_refused_before_any_dial(
    answers: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    resolver, calls = _counting_resolver(answers)
    fetch = HttpxFetch(resolver=resolver)
    dialled: list[object] = []

    async def no_send(*args: object, **kwargs: object) -> object:
        dialled.append(args)
        raise AssertionError("dialled")

    monkeypatch.setattr(fetch._pool, "handle_async_request", no_send)
    with pytest.raises(SuaveplanError) as info:
        await fetch.request(HttpRequest(url="https://mixed.test/", rule="mixed.test"))
    assert info.value.code == "SAND_FETCH_ADDRESS_REFUSED"
    with pytest.raises(SuaveplanError) as info:
        await fetch.connect("mixed.test", 443, rule="mixed.test")
    assert info.value.code == "SAND_FETCH_ADDRESS_REFUSED"
    assert dialled == []
    assert calls == ["mixed.test", "mixed.test"]
    await fetch.aclose()


async def test_vetted_addresses_are_dialled_in_order_with_fallback_and_one_lookup(
    server: int,
) -> None:
    # 127.0.0.2 is loopback too, but nothing listens there: the connection is refused.
    resolver, calls = _counting_resolver(["127.0.0.2", "127.0.0.1"])
    fetch = HttpxFetch(allow_private=True, resolver=resolver)
    response = await fetch.request(
        HttpRequest(url=f"http://multi.test:{server}/", rule="http:multi.test")
    )
    assert response.status == 200
    assert dict(response.headers)["X-Host"] == f"multi.test:{server}"
    assert calls == ["multi.test"]
    sock = await fetch.connect("multi.test", server, rule="multi.test")
    assert sock.getpeername() == ("127.0.0.1", server)
    sock.close()
    assert calls == ["multi.test", "multi.test"]
    await fetch.aclose()


async def test_when_no_vetted_address_answers_the_fetch_fails_without_a_second_lookup(
    server: int,
) -> None:
    resolver, calls = _counting_resolver(["127.0.0.2", "127.0.0.3"])
    fetch = HttpxFetch(allow_private=True, resolver=resolver)
    with pytest.raises(SuaveplanError) as info:
        await fetch.request(HttpRequest(url=f"http://down.test:{server}/", rule="x"))
    assert info.value.code == "SAND_FETCH_FAILED"
    with pytest.raises(SuaveplanError) as info:
        await fetch.connect("down.test", server, rule="x")
    assert info.value.code == "SAND_FETCH_FAILED"
    assert calls == ["down.test", "down.test"]
    await fetch.aclose()


async def test_a_redirect_to_a_name_that_resolves_private_is_refused(server: int) -> None:
    base = f"http://127.0.0.1:{server}"
    answers = {"internal.test": ["10.0.0.7"]}

    async def resolver(host: str, port: int) -> list[str]:
        return answers[host]

    def recheck(url: str) -> Allow | Deny:
        return Allow(rule="http:internal.test", target=url)

    fetch = HttpxFetch(follow_redirects=True, recheck=recheck, resolver=resolver)
    with pytest.raises(SuaveplanError) as info:
        await fetch.request(
            HttpRequest(url=f"{base}/redirect?to=http://internal.test/", rule="http:127.0.0.1")
        )
    assert info.value.code == "SAND_FETCH_ADDRESS_REFUSED"

    def deny(url: str) -> Allow | Deny:
        return Deny(capability="fetch", reason=DenyReason.HOST_NOT_IN_ALLOWLIST)

    denied = HttpxFetch(follow_redirects=True, recheck=deny, resolver=resolver)
    with pytest.raises(SuaveplanError) as info:
        await denied.request(
            HttpRequest(url=f"{base}/redirect?to=http://internal.test/", rule="http:127.0.0.1")
        )
    assert info.value.code == "SAND_FETCH_REDIRECT_REFUSED"
    await fetch.aclose()
    await denied.aclose()
