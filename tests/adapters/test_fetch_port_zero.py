"""Port 0 never reaches a resolver or a socket: the gateway denies it, and `HttpxFetch`
refuses it again on its own (called directly, or on a redirect a lax `recheck` let through).
"""

from __future__ import annotations

from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from adapters._http import serving
from suaveplan_sandbox.adapters import Adapters
from suaveplan_sandbox.adapters._fetch import HttpxFetch, Resolver
from suaveplan_sandbox.adapters._protocols import HttpRequest
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.gateway import Gateway
from suaveplan_sandbox.metrics import PERMISSION_DENIED, InMemoryMetrics
from suaveplan_sandbox.permissions import PermissionChecker, PermissionPolicy
from suaveplan_sandbox.permissions._decision import Allow, Deny
from suaveplan_sandbox.testing import FakeFetch


class _Redirect(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(302)
        self.send_header("Location", self.path.split("=", 1)[1])
        self.send_header("Content-Length", "0")
        self.end_headers()


@pytest.fixture(scope="module")
def server() -> Iterator[int]:
    with serving(ThreadingHTTPServer(("127.0.0.1", 0), _Redirect)) as httpd:
        yield httpd.server_address[1]


def _recording_resolver() -> tuple[Resolver, list[tuple[str, int]]]:
    calls: list[tuple[str, int]] = []

    async def resolver(host: str, port: int) -> list[str]:
        calls.append((host, port))
        return ["127.0.0.1"]

    return resolver, calls


async def _code(awaitable: object) -> str:
    with pytest.raises(SuaveplanError) as info:
        await awaitable  # type: ignore[misc]
    return info.value.code


@pytest.mark.parametrize(
    "url",
    [
        "https://api.example.com:0/",
        "https://api.example.com:00/x",
        "https://api.example.com:0000/",
        "http://api.example.com:0/",
        "https://127.0.0.1:0/",
    ],
)
async def test_a_request_to_port_zero_is_refused_before_any_lookup(url: str) -> None:
    resolver, calls = _recording_resolver()
    fetch = HttpxFetch(allow_private=True, resolver=resolver)
    try:
        assert await _code(fetch.request(HttpRequest(url=url, rule="api.example.com"))) == (
            "SAND_FETCH_FAILED"
        )
    finally:
        await fetch.aclose()
    assert calls == []


@pytest.mark.parametrize("port", [0, -1, 65536, True])
async def test_a_connect_to_a_port_outside_1_to_65535_is_refused_before_any_lookup(
    port: int,
) -> None:
    resolver, calls = _recording_resolver()
    fetch = HttpxFetch(allow_private=True, resolver=resolver)
    try:
        code = await _code(fetch.connect("api.example.com", port, rule="api.example.com"))
    finally:
        await fetch.aclose()
    assert code == "SAND_FETCH_FAILED"
    assert calls == []


async def test_a_redirect_to_port_zero_let_through_by_recheck_is_still_refused(
    server: int,
) -> None:
    resolver, calls = _recording_resolver()

    def lax(url: str) -> Allow | Deny:  # a host's recheck that forgot about ports
        return Allow(rule="http:internal.test", target=url)

    fetch = HttpxFetch(allow_private=True, follow_redirects=True, recheck=lax, resolver=resolver)
    start = f"http://127.0.0.1:{server}/r?to=http://internal.test:0/"
    try:
        code = await _code(fetch.request(HttpRequest(url=start, rule="http:127.0.0.1")))
    finally:
        await fetch.aclose()
    assert code == "SAND_FETCH_FAILED"
    assert calls == []  # the second hop was never resolved, let alone dialled


async def test_a_redirect_to_port_zero_is_denied_by_the_checkers_recheck(server: int) -> None:
    policy = PermissionPolicy.from_manifest(
        {"name": "ports", "permissions": {"fetch": ["http:127.0.0.1", "http:internal.test"]}},
        root="/srv",
    )
    metrics = InMemoryMetrics()
    checker = PermissionChecker(policy, metrics=metrics)
    resolver, calls = _recording_resolver()
    fetch = HttpxFetch(
        allow_private=True, follow_redirects=True, recheck=checker.check_fetch, resolver=resolver
    )
    start = f"http://127.0.0.1:{server}/r?to=http://internal.test:00/"
    try:
        code = await _code(fetch.request(HttpRequest(url=start, rule="http:127.0.0.1")))
    finally:
        await fetch.aclose()
    assert code == "SAND_FETCH_REDIRECT_REFUSED"
    assert calls == []
    assert metrics.value(PERMISSION_DENIED.name, reason="invalid-url") == 1


async def test_the_gateway_denies_port_zero_and_never_calls_the_adapter() -> None:
    metrics = InMemoryMetrics()
    policy = PermissionPolicy.from_manifest(
        {"name": "ports", "permissions": {"fetch": ["*.example.com"]}}, root="/srv"
    )
    fake = FakeFetch()
    gateway = Gateway(
        checker=PermissionChecker(policy, metrics=metrics), adapters=Adapters(fetch=fake)
    )
    requests: list[tuple[str, dict[str, object]]] = [
        ("request", {"url": "https://a.example.com:0/"}),
        ("request", {"url": "https://a.example.com:0000/"}),
        ("connect", {"host": "a.example.com", "port": 0}),
    ]
    for operation, args in requests:
        with pytest.raises(SuaveplanError) as info:
            await gateway.dispatch("fetch", operation, args)
        assert info.value.code == "SAND_PERM_DENIED"
        assert info.value.details["reason"] == "invalid-url"
    assert fake.requests == []
    assert fake.connects == []
    assert metrics.value(PERMISSION_DENIED.name, capability="fetch", reason="invalid-url") == 3
    # The neighbours go through.
    await gateway.dispatch("fetch", "request", {"url": "https://a.example.com:65535/"})
    assert [r.url for r in fake.requests] == ["https://a.example.com:65535/"]
    await gateway.close()
    fake.close()
