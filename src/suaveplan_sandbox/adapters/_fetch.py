"""`HttpxFetch`: outbound HTTP that resolves once, vets every answer, and dials only those.

The URL is re-parsed with the checker's WHATWG parser. The host is resolved once (injectable
resolver). *Every* answer must be a public address unless the matched rule is that IP literal
or the host opted in with `allow_private=True`: an answer set that mixes public and private
addresses is refused whole, because that is what a rebinding or split-horizon attack looks
like, and dialling "only the good ones" would still let an attacker who controls the zone
steer which one is tried. The vetted addresses are then dialled in the resolver's order,
falling back to the next one only when a connection cannot be established (nothing was sent),
with `Host` and TLS SNI/verification set to the original hostname; DNS is never asked again
(no rebinding). Redirects are off by default; when on, each hop is re-checked with `recheck`
and re-vetted. Response body size, header count and total time are limited.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import Final, final

import httpx

from suaveplan_sandbox.adapters._protocols import HttpRequest, HttpResponse
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions._decision import Allow, Deny
from suaveplan_sandbox.permissions._fetch_rules import canonical_host, parse_url

Resolver = Callable[[str, int], Awaitable[list[str]]]
IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_CGNAT: Final = ipaddress.ip_network("100.64.0.0/10")
_NAT64: Final = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL: Final = ipaddress.ip_network("64:ff9b:1::/48")


def _v4_refused(ip: ipaddress.IPv4Address) -> bool:
    return (
        ip.is_private
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_unspecified
        or ip.is_reserved
        or ip in _CGNAT
        or not ip.is_global
    )


def address_refused(ip: IpAddress) -> bool:
    """Whether an address is non-public (private, loopback, link-local, CGNAT, embedded v4...)."""
    if isinstance(ip, ipaddress.IPv4Address):
        return _v4_refused(ip)
    if ip.ipv4_mapped is not None:
        return _v4_refused(ip.ipv4_mapped)
    if ip.sixtofour is not None:
        return _v4_refused(ip.sixtofour)
    if ip in _NAT64:
        return _v4_refused(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    if ip in _NAT64_LOCAL:
        return True
    packed = ip.packed
    if packed[:12] == b"\0" * 12 and int(ip) > 1:  # deprecated IPv4-compatible ::a.b.c.d
        return _v4_refused(ipaddress.IPv4Address(packed[12:]))
    return (
        ip.is_private
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_unspecified
        or ip.is_reserved
        or ip.is_site_local
        or not ip.is_global
    )


def _rule_host(rule: str) -> str | None:
    text = rule.removeprefix("http:")
    if text.startswith("["):
        text = text[: text.find("]") + 1]
    elif ":" in text:
        text = text.rsplit(":", 1)[0]
    return canonical_host(text)


async def _default_resolver(host: str, port: int) -> list[str]:
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def _refused() -> SuaveplanError:
    return SuaveplanError("SAND_FETCH_ADDRESS_REFUSED", "the host resolved to a refused address")


@final
class HttpxFetch:
    """The production `FetchAdapter` on httpx."""

    def __init__(
        self,
        *,
        allow_private: bool = False,
        resolver: Resolver | None = None,
        timeout: float = 30.0,
        max_response_bytes: int = 10 * 1024 * 1024,
        max_headers: int = 100,
        follow_redirects: bool = False,
        max_redirects: int = 5,
        verify: bool | ssl.SSLContext = True,
        recheck: Callable[[str], Allow | Deny] | None = None,
    ) -> None:
        if follow_redirects and recheck is None:
            raise SuaveplanError("SAND_INVALID_ARGUMENT", "following redirects needs recheck=")
        self._allow_private = allow_private
        self._resolve = resolver or _default_resolver
        self._timeout = timeout
        self._max_bytes = max_response_bytes
        self._max_headers = max_headers
        self._follow = follow_redirects
        self._max_redirects = max_redirects
        self._recheck = recheck
        self._client = httpx.AsyncClient(
            verify=verify, timeout=timeout, follow_redirects=False, trust_env=False
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def vet(self, host: str, port: int, rule: str) -> list[str]:
        """Resolve `host` once; return every address to dial, in order, or raise.

        All answers must pass (a mixed public/private set is refused whole).
        """
        literal = host[1:-1] if host.startswith("[") else host
        try:
            ip: IpAddress | None = ipaddress.ip_address(literal)
        except ValueError:
            ip = None
        if ip is not None:
            same = _rule_host(rule) == canonical_host(host)
            if address_refused(ip) and not (self._allow_private or same):
                raise _refused()
            return [str(ip)]
        try:
            answers = await self._resolve(host, port)
        except (OSError, UnicodeError) as exc:
            raise SuaveplanError(
                "SAND_FETCH_FAILED", "the host did not resolve", cause=exc
            ) from None
        addresses: list[IpAddress] = []
        for answer in answers:
            try:
                parsed = ipaddress.ip_address(answer)
            except ValueError:
                raise _refused() from None  # a resolver answer that is not an address
            if parsed not in addresses:
                addresses.append(parsed)
        if not addresses:
            raise SuaveplanError("SAND_FETCH_FAILED", "the host did not resolve")
        if not self._allow_private and any(address_refused(a) for a in addresses):
            raise _refused()
        return [str(a) for a in addresses]

    async def request(self, request: HttpRequest) -> HttpResponse:
        try:
            return await asyncio.wait_for(self._request(request), self._timeout)
        except TimeoutError:
            raise SuaveplanError(
                "SAND_FETCH_TIMEOUT", "the request exceeded its time limit"
            ) from None

    async def _request(self, request: HttpRequest) -> HttpResponse:
        url, method, body, headers = request.url, request.method, request.body, request.headers
        rule = request.rule
        for hop in range(self._max_redirects + 1):
            parsed = parse_url(url)
            if parsed is None or parsed.scheme not in ("http", "https"):
                raise SuaveplanError("SAND_FETCH_FAILED", "the URL does not parse")
            addresses = await self.vet(parsed.host, parsed.port, rule)
            target = httpx.URL(parsed.href)
            host_header = parsed.host if target.port is None else f"{parsed.host}:{target.port}"
            response = await self._send_first_reachable(
                addresses,
                target=target,
                method=method,
                headers=[*headers, ("Host", host_header)],
                body=body,
                hostname=parsed.host,
            )
            try:
                if len(response.headers.raw) > self._max_headers:
                    raise SuaveplanError("SAND_FETCH_TOO_LARGE", "too many response headers")
                if response.is_redirect:
                    location = response.headers.get("location")
                    if not self._follow or location is None or hop == self._max_redirects:
                        raise SuaveplanError("SAND_FETCH_REDIRECT_REFUSED", "redirect refused")
                    url = str(httpx.URL(parsed.href).join(location))
                    assert self._recheck is not None
                    decision = self._recheck(url)
                    if isinstance(decision, Deny):
                        raise SuaveplanError("SAND_FETCH_REDIRECT_REFUSED", "redirect denied")
                    rule = decision.rule or ""
                    if response.status_code in (301, 302, 303):
                        method, body = "GET", b""
                    continue
                chunks: list[bytes] = []
                total = 0
                async for chunk in response.aiter_raw():
                    total += len(chunk)
                    if total > self._max_bytes:
                        raise SuaveplanError("SAND_FETCH_TOO_LARGE", "the response is too large")
                    chunks.append(chunk)
                return HttpResponse(
                    status=response.status_code,
                    headers=tuple(
                        (k.decode("latin-1"), v.decode("latin-1")) for k, v in response.headers.raw
                    ),
                    body=b"".join(chunks),
                )
            except httpx.HTTPError as exc:
                raise SuaveplanError(
                    "SAND_FETCH_FAILED", f"the request failed ({type(exc).__name__})", cause=exc
                ) from None
            finally:
                await response.aclose()
        raise SuaveplanError("SAND_FETCH_REDIRECT_REFUSED", "too many redirects")

    async def _send_first_reachable(
        self,
        addresses: list[str],
        *,
        target: httpx.URL,
        method: str,
        headers: list[tuple[str, str]],
        body: bytes,
        hostname: str,
    ) -> httpx.Response:
        """Send to the first vetted address that accepts a connection; never re-resolve."""
        last: httpx.HTTPError | None = None
        for address in addresses:
            req = self._client.build_request(
                method,
                target.copy_with(host=address),
                headers=headers,
                content=body,
                extensions={"sni_hostname": hostname.strip("[]")},
            )
            try:
                return await self._client.send(req, stream=True)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                last = exc  # nothing was sent: the next vetted address may answer
            except httpx.TimeoutException as exc:
                raise SuaveplanError(
                    "SAND_FETCH_TIMEOUT", "the request timed out", cause=exc
                ) from None
            except httpx.HTTPError as exc:
                raise SuaveplanError(
                    "SAND_FETCH_FAILED", f"the request failed ({type(exc).__name__})", cause=exc
                ) from None
        if isinstance(last, httpx.ConnectTimeout):
            raise SuaveplanError("SAND_FETCH_TIMEOUT", "the connection timed out", cause=last)
        raise SuaveplanError(
            "SAND_FETCH_FAILED", "no vetted address accepted the connection", cause=last
        )

    async def connect(self, host: str, port: int, *, rule: str) -> socket.socket:
        addresses = await self.vet(host, port, rule)

        def dial() -> socket.socket:
            last: OSError | None = None
            for address in addresses:
                try:
                    return socket.create_connection((address, port), timeout=self._timeout)
                except OSError as exc:
                    last = exc
            assert last is not None
            raise last

        try:
            return await asyncio.to_thread(dial)
        except OSError as exc:
            raise SuaveplanError("SAND_FETCH_FAILED", "the connection failed", cause=exc) from None
