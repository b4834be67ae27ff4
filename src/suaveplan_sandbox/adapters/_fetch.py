"""`HttpxFetch`: outbound HTTP that resolves once, vets every answer, and dials only those.

The URL is re-parsed with the checker's WHATWG parser. The host is resolved once (injectable
resolver). *Every* answer must be a public address unless the matched rule is that IP literal
or the host opted in with `allow_private=True`: an answer set that mixes public and private
addresses is refused whole, because that is what a rebinding or split-horizon attack looks
like, and dialling "only the good ones" would still let an attacker who controls the zone
steer which one is tried. A set of more than `MAX_ADDRESSES` distinct answers is refused too:
vetting is on the shared event loop. The vetted addresses are then dialled in the resolver's order,
falling back to the next one only when a connection cannot be established (nothing was sent);
DNS is never asked again (no rebinding).

Requests run on httpcore's connection pool, whose only network backend is `_VettedBackend`:
it dials nothing but the addresses vetted for the request running in the calling task, and
fails closed otherwise. The pool is keyed by the real hostname, so TLS SNI and certificate
checks are the hostname's and a connection verified for one name is never reused for another
that happens to share its address. There is no cookie jar, no proxy, no `.netrc`, no
environment (not even `SSLKEYLOGFILE`): the only headers sent are `Host`, the plugin's,
`Accept`, `Accept-Encoding: identity` and `User-Agent` unless the plugin set those,
`Content-Length`, and a Basic `Authorization` for credentials in the URL. Headers that frame
the message or manage the connection (`Host`, `Content-Length`, `Transfer-Encoding`,
`Connection`, ...) belong to the host: a plugin that sets one, or a header that is not a
token with a printable-ASCII value, is refused before any lookup. Bodies are never
decompressed; the byte limit is on the bytes delivered to the plugin. A response header
holding a control character (C0 but tab, DEL, or a byte 0x80-0x9F, which the plugin's
one-character-per-byte view would make a C1 control) fails the request whole: dropping or
rewriting it would change the response.

What a response makes the host read and parse is bounded too, not only its body: every read
goes through `_MeteredStream`, which charges the bytes to the response being read in the
calling task (`_WireBudget`): a head (status lines, headers, interim 1xx responses) of at
most `_HEAD_BYTES`, then the body limit plus a framing allowance, and a body in at most
`_max_pieces` pieces. Without that a server could keep the host parsing at full speed until
the deadline: an endless 100 Continue, kilobytes of chunk extension per body byte, one-byte
chunks. A connection goes back to the pool only when nothing follows the response on it
(`_ends_cleanly`): a second response sent with the first, a body on a HEAD, 204 or 304
reply, would otherwise answer the next request on that connection, which with a shared
adapter can be another plugin's.

Redirects are off by default; when on, each hop is re-checked with `recheck` and re-vetted,
the target is joined WHATWG-style, and `Authorization`, `Cookie` and `Proxy-Authorization`
are dropped when the origin changes. Response body size, header count and total time are
limited; `connect` has the same total deadline for its lookup and all vetted addresses.

The default resolver's `getaddrinfo` and `connect`'s blocking dials run on the adapter's own
small thread pool (`network_threads`), never on the event loop's default executor: a plugin
granted a name in a DNS zone it controls can make lookups hang for the resolver's timeout,
and on the shared executor that would hold threads the filesystem adapter's hops need. Here
it can hold at most `network_threads` threads, and later lookups queue behind them until the
request's own deadline ends them.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import re
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Final, TypeVar, final
from urllib.parse import unquote

import ada_url
import h11
import httpcore
import httpx

from suaveplan_sandbox import __version__
from suaveplan_sandbox.adapters._protocols import HttpRequest, HttpResponse
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions._decision import Allow, Deny
from suaveplan_sandbox.permissions._fetch_rules import (
    ParsedUrl,
    canonical_connect_host,
    canonical_host,
    parse_url,
)

Resolver = Callable[[str, int], Awaitable[list[str]]]
T = TypeVar("T")
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


def _valid_port(port: object) -> bool:
    """A port a connection can be made to: an int in 1..65535 (port 0 names no destination)."""
    return type(port) is int and 0 < port <= 65535


def _rule_host(rule: str) -> str | None:
    text = rule.removeprefix("http:")
    if text.startswith("["):
        text = text[: text.find("]") + 1]
    elif ":" in text:
        text = text.rsplit(":", 1)[0]
    return canonical_host(text)


DEFAULT_NETWORK_THREADS: Final = 4
# Distinct addresses a name may resolve to. One 64 KiB DNS answer holds ~6,000: more than a
# real name has, and each is vetted on the event loop every sandbox shares. A larger set is
# refused whole (like a mixed one), never cut to its first entries.
MAX_ADDRESSES: Final = 64


def _lookup(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def _refused() -> SuaveplanError:
    return SuaveplanError("SAND_FETCH_ADDRESS_REFUSED", "the host resolved to a refused address")


def _too_many_addresses() -> SuaveplanError:
    return SuaveplanError(
        "SAND_FETCH_ADDRESS_REFUSED",
        "the host resolved to too many addresses",
        {"reason": "too-many-addresses"},
    )


def _tls_context(verify: bool | ssl.SSLContext) -> ssl.SSLContext:
    """httpx's trust store (certifi) without its environment (SSL_CERT_FILE/DIR), and without
    the `SSLKEYLOGFILE` key log that `ssl.create_default_context` picks up from it: plugin
    traffic's session keys are never written anywhere. A context the host passes is its own."""
    context = httpx.create_ssl_context(verify=verify, trust_env=False)
    if not isinstance(verify, ssl.SSLContext):
        context.keylog_filename = None  # type: ignore[assignment]
    return context


# RFC 9110 token (header names, methods) and a field value we are willing to send:
# printable ASCII, space and tab. Anything else (CR, LF, NUL, other controls, non-ASCII) is
# refused here rather than left to the HTTP library, which would raise unmapped errors.
_TOKEN: Final = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_FIELD_VALUE: Final = re.compile(r"[\t\x20-\x7e]*")
# A response header byte the plugin never receives: C0 controls but HT, DEL, and 0x80-0x9F,
# which the isomorphic (Latin-1) decoding the plugin gets would turn into C1 controls (a
# UTF-8 encoded NEL, LINE or PARAGRAPH SEPARATOR always holds one). CR, LF and NUL are a
# protocol violation that h11 already refuses; the rest RFC 9110 calls invalid too.
_RESPONSE_FIELD_REFUSED: Final = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f-\x9f]")
# Headers that frame the message or manage the connection: the host writes them. A plugin's
# `Transfer-Encoding` beside the host's `Content-Length` is a request-smuggling pair; a second
# `Host` addresses another virtual host on the granted address.
_HOST_OWNED: Final = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "upgrade",
    }
)
_CREDENTIALS: Final = frozenset({"authorization", "cookie", "proxy-authorization"})
_BODY_HEADERS: Final = frozenset(
    {"content-type", "content-encoding", "content-language", "content-location"}
)
_DEFAULT_HEADERS: Final = (
    ("Accept", "*/*"),
    ("Accept-Encoding", "identity"),  # the plugin gets the bytes it would decode itself
    ("User-Agent", f"suaveplan-sandbox/{__version__}"),
)
_DEFAULT_PORTS: Final = {"http": 80, "https": 443}
_REDIRECTS: Final = frozenset({301, 302, 303, 307, 308})
_BODY_METHODS: Final = frozenset({"POST", "PUT", "PATCH"})
_TRANSPORT_ERRORS: Final = (
    httpcore.NetworkError,
    httpcore.ProtocolError,
    httpcore.UnsupportedProtocol,
    httpcore.ProxyError,
)


def _header_refused(reason: str) -> SuaveplanError:
    return SuaveplanError(
        "SAND_FETCH_FAILED",
        "the request carries a header the host will not send",
        {"reason": reason},
    )


def _request_headers(headers: Iterable[object]) -> list[tuple[str, str]]:
    """The plugin's headers, validated; refuses malformed and host-owned ones."""
    out: list[tuple[str, str]] = []
    for item in headers:
        if not isinstance(item, tuple | list) or len(item) != 2:
            raise _header_refused("header-invalid")
        name, value = item
        if (
            not isinstance(name, str)
            or not isinstance(value, str)
            or _TOKEN.fullmatch(name) is None
            or _FIELD_VALUE.fullmatch(value) is None
        ):
            raise _header_refused("header-invalid")
        if name.lower() in _HOST_OWNED:
            raise _header_refused("header-not-permitted")
        out.append((name, value.strip(" \t")))
    return out


def _check_response_headers(headers: Sequence[tuple[bytes, bytes]]) -> None:
    """Refuse a response whose header names or values hold a control character: refused
    whole rather than a header dropped or rewritten, which would change its meaning."""
    search = _RESPONSE_FIELD_REFUSED.search
    for name, value in headers:
        if search(name) is not None or search(value) is not None:
            raise SuaveplanError(
                "SAND_FETCH_FAILED",
                "the response carries a header with a control character",
                {"reason": "response-header-invalid"},
            )


def _without(headers: Sequence[tuple[str, str]], names: frozenset[str]) -> list[tuple[str, str]]:
    return [(k, v) for k, v in headers if k.lower() not in names]


def _redirect_method(status: int, method: str) -> str:
    """Fetch/httpx: 303 turns anything but HEAD into GET; 301/302 turn POST into GET."""
    if (status == 303 and method != "HEAD") or (status in (301, 302) and method == "POST"):
        return "GET"
    return method


@final
@dataclass(frozen=True, slots=True)
class _Route:
    """Where the request in this task may connect: its origin and the vetted addresses."""

    host: str
    port: int
    addresses: tuple[str, ...]


_ROUTE: ContextVar[_Route | None] = ContextVar("suaveplan_fetch_route", default=None)


@final
class _VettedBackend(httpcore.AsyncNetworkBackend):
    """httpcore's only way out: dials the addresses vetted for the calling task's request.

    httpcore opens a connection in the task of the request it serves, so the task's `_ROUTE`
    is that request's. No route, or a route for another origin, is a connect error: nothing
    is ever dialled by name.
    """

    def __init__(self) -> None:
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        route = _ROUTE.get()
        if route is None or (route.host, route.port) != (host, port) or not route.addresses:
            raise httpcore.ConnectError("no vetted address for this origin")
        last: Exception | None = None
        for address in route.addresses:
            try:
                stream = await self._inner.connect_tcp(
                    address,
                    port,
                    timeout=timeout,
                    local_address=local_address,
                    socket_options=socket_options,
                )
                return _MeteredStream(stream)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                last = exc  # nothing was sent: the next vetted address may answer
        assert last is not None
        raise last

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("unix sockets are not dialled")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


# Bytes a response may make the host read before its final headers are parsed: h11 takes a
# header block of up to 100 kB, and a few interim (1xx) responses may precede it.
_HEAD_BYTES: Final = 512 * 1024
# Chunk-size lines, extensions and trailers beyond the body's own bytes.
_FRAMING_BYTES: Final = 256 * 1024
# Parse steps between two turns of the event loop while a body streams in: one-byte chunks
# otherwise make one 64 kB read a stall of tens of milliseconds for everything on the loop.
_PIECES_PER_TURN: Final = 1024


@final
class _WireBudget:
    """What the response being read in this task may still pull off its connection."""

    __slots__ = ("remaining",)

    def __init__(self) -> None:
        self.remaining = 0

    def charge(self, size: int) -> None:
        self.remaining -= size
        if self.remaining < 0:
            raise SuaveplanError("SAND_FETCH_TOO_LARGE", "the response is too large")


_BUDGET: ContextVar[_WireBudget | None] = ContextVar("suaveplan_fetch_budget", default=None)


@final
class _MeteredStream(httpcore.AsyncNetworkStream):
    """A connection whose reads are charged to the calling task's response (`_BUDGET`).

    httpcore reads a response in the task that asked for it, so the budget is that request's.
    A read outside any request, or on a connection `retire`d for holding bytes past its last
    response, fails; a retired connection also reports itself readable, which is how the pool
    recognises a connection it must close instead of reusing.
    """

    def __init__(self, inner: httpcore.AsyncNetworkStream) -> None:
        self._inner = inner
        self._retired = False

    def retire(self) -> None:
        self._retired = True

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        budget = _BUDGET.get()
        if budget is None or self._retired:
            raise httpcore.ReadError("no response may read this connection")
        data = await self._inner.read(max_bytes, timeout)
        budget.charge(len(data))
        return data

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        await self._inner.write(buffer, timeout)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        return _MeteredStream(await self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> object:
        if info == "is_readable" and self._retired:
            return True
        return self._inner.get_extra_info(info)


def _ends_cleanly(response: httpcore.Response) -> bool:
    """Whether nothing was received past the end of `response` on its connection.

    h11 keeps such bytes for the connection's next cycle, where they would be read as the
    answer to the next request. httpcore does not expose them, so this looks through its pool
    stream at the connection's h11 state; an httpcore shaped otherwise counts as unclean,
    which only costs connection reuse.
    """
    stream = getattr(response.stream, "_stream", None)
    state = getattr(getattr(stream, "_connection", None), "_h11_state", None)
    if not isinstance(state, h11.Connection) or state.their_state is not h11.DONE:
        return False
    data, closed = state.trailing_data
    return not data and not closed


def _basic_auth(url: ada_url.URL) -> str | None:
    if not url.username and not url.password:
        return None
    pair = f"{unquote(url.username)}:{unquote(url.password)}".encode()
    return "Basic " + base64.b64encode(pair).decode("ascii")


@final
class HttpxFetch:
    """The production `FetchAdapter`, on httpx's transport layer (httpcore)."""

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
        network_threads: int = DEFAULT_NETWORK_THREADS,
    ) -> None:
        if follow_redirects and recheck is None:
            raise SuaveplanError("SAND_INVALID_ARGUMENT", "following redirects needs recheck=")
        if isinstance(network_threads, bool) or not isinstance(network_threads, int):
            raise SuaveplanError("SAND_INVALID_ARGUMENT", "network_threads must be an int")
        if network_threads < 1:
            raise SuaveplanError("SAND_INVALID_ARGUMENT", "network_threads must be at least 1")
        self._allow_private = allow_private
        self._resolve = resolver or self._default_resolver
        # Created on first use: an adapter that never resolves or dials starts no thread.
        self._network_threads = network_threads
        self._network: ThreadPoolExecutor | None = None
        self._closed = False
        self._timeout = timeout
        self._timeouts = {"connect": timeout, "read": timeout, "write": timeout, "pool": timeout}
        self._max_bytes = max_response_bytes
        # Each piece is a parse step and a Python object: one-byte chunks must not make a
        # 10 MB limit millions of them.
        self._max_pieces = max(65_536, max_response_bytes // 512)
        self._max_headers = max_headers
        self._follow = follow_redirects
        self._max_redirects = max_redirects
        self._recheck = recheck
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=_tls_context(verify),
            max_connections=100,
            max_keepalive_connections=20,
            keepalive_expiry=5.0,
            network_backend=_VettedBackend(),
        )

    async def aclose(self) -> None:
        self._closed = True
        await self._pool.aclose()
        if self._network is not None:
            # A lookup stuck in getaddrinfo cannot be interrupted: its thread ends when the
            # resolver gives up; queued lookups are dropped, and nothing waits here.
            self._network.shutdown(wait=False, cancel_futures=True)
            self._network = None

    async def _on_network_thread(self, fn: Callable[..., T], *args: object) -> T:
        if self._closed:
            raise SuaveplanError("SAND_FETCH_FAILED", "the fetch adapter is closed")
        if self._network is None:
            self._network = ThreadPoolExecutor(
                self._network_threads, thread_name_prefix="suaveplan-fetch-net"
            )
        try:
            return await asyncio.get_running_loop().run_in_executor(self._network, fn, *args)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            # Not this task's cancellation: `aclose` dropped the queued work.
            raise SuaveplanError("SAND_FETCH_FAILED", "the fetch adapter is closed") from None

    async def _default_resolver(self, host: str, port: int) -> list[str]:
        return await self._on_network_thread(_lookup, host, port)

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
        # A dict, not a list scan: de-duplicating thousands of answers by `in` on a list was
        # quadratic, seconds on the shared event loop for one answer a zone's owner chose.
        addresses: dict[IpAddress, None] = {}
        for answer in answers:
            try:
                parsed = ipaddress.ip_address(answer)
            except ValueError:
                raise _refused() from None  # a resolver answer that is not an address
            addresses[parsed] = None
            if len(addresses) > MAX_ADDRESSES:
                raise _too_many_addresses()
        if not addresses:
            raise SuaveplanError("SAND_FETCH_FAILED", "the host did not resolve")
        if not self._allow_private and any(address_refused(a) for a in addresses):
            raise _refused()
        return [str(a) for a in addresses]

    async def request(self, request: HttpRequest) -> HttpResponse:
        budget = _WireBudget()
        token = _BUDGET.set(budget)  # copied into wait_for's task where it makes one
        try:
            return await asyncio.wait_for(self._request(request, budget), self._timeout)
        except TimeoutError:
            raise SuaveplanError(
                "SAND_FETCH_TIMEOUT", "the request exceeded its time limit"
            ) from None
        finally:
            _BUDGET.reset(token)

    async def _request(self, request: HttpRequest, budget: _WireBudget) -> HttpResponse:
        url, method, body, rule = request.url, request.method, request.body, request.rule
        if not isinstance(method, str) or _TOKEN.fullmatch(method) is None:
            raise SuaveplanError("SAND_FETCH_FAILED", "the method is not a token")
        headers = _request_headers(request.headers)
        for hop in range(self._max_redirects + 1):
            parsed = parse_url(url)
            if parsed is None or parsed.scheme not in _DEFAULT_PORTS:
                raise SuaveplanError("SAND_FETCH_FAILED", "the URL does not parse")
            if not _valid_port(parsed.port):
                # The checker denies `:0` (`invalid-url`); an adapter called directly, or a
                # `recheck` that lets one through, still never resolves or dials it.
                raise SuaveplanError("SAND_FETCH_FAILED", "the URL names port 0")
            addresses = await self.vet(parsed.host, parsed.port, rule)
            budget.remaining = _HEAD_BYTES
            response = await self._send(parsed, addresses, method, headers, body)
            budget.remaining = self._max_bytes + _FRAMING_BYTES
            try:
                if len(response.headers) > self._max_headers:
                    raise SuaveplanError("SAND_FETCH_TOO_LARGE", "too many response headers")
                _check_response_headers(response.headers)
                location = next((v for k, v in response.headers if k.lower() == b"location"), None)
                if response.status in _REDIRECTS and location is not None:
                    if not self._follow or hop == self._max_redirects:
                        raise SuaveplanError("SAND_FETCH_REDIRECT_REFUSED", "redirect refused")
                    try:
                        joined = ada_url.join_url(parsed.href, location.decode("utf-8", "replace"))
                    except ValueError:
                        raise SuaveplanError(
                            "SAND_FETCH_REDIRECT_REFUSED", "the redirect target does not parse"
                        ) from None
                    assert self._recheck is not None
                    decision = self._recheck(joined)
                    if isinstance(decision, Deny):
                        raise SuaveplanError("SAND_FETCH_REDIRECT_REFUSED", "redirect denied")
                    rule = decision.rule or ""
                    url = decision.target or joined
                    following = parse_url(url)
                    if following is None or (following.scheme, following.host, following.port) != (
                        parsed.scheme,
                        parsed.host,
                        parsed.port,
                    ):
                        # Credentials are for the origin they were written for (as browsers).
                        headers = _without(headers, _CREDENTIALS)
                    new_method = _redirect_method(response.status, method)
                    if new_method != method:
                        method, body = new_method, b""
                        headers = _without(headers, _BODY_HEADERS)
                    continue
                received = bytearray()
                pieces = 0
                async for chunk in response.aiter_stream():
                    pieces += 1
                    if len(received) + len(chunk) > self._max_bytes or pieces > self._max_pieces:
                        raise SuaveplanError("SAND_FETCH_TOO_LARGE", "the response is too large")
                    received += chunk
                    if pieces % _PIECES_PER_TURN == 0:
                        await asyncio.sleep(0)
                if not _ends_cleanly(response):
                    connection = response.extensions.get("network_stream")
                    if isinstance(connection, _MeteredStream):
                        connection.retire()
                return HttpResponse(
                    status=response.status,
                    headers=tuple(
                        (k.decode("latin-1"), v.decode("latin-1")) for k, v in response.headers
                    ),
                    body=bytes(received),
                )
            except httpcore.TimeoutException as exc:
                raise SuaveplanError(
                    "SAND_FETCH_TIMEOUT", "the request timed out", cause=exc
                ) from None
            except _TRANSPORT_ERRORS as exc:
                raise SuaveplanError(
                    "SAND_FETCH_FAILED", f"the request failed ({type(exc).__name__})", cause=exc
                ) from None
            finally:
                await response.aclose()
        raise SuaveplanError("SAND_FETCH_REDIRECT_REFUSED", "too many redirects")

    async def _send(
        self,
        parsed: ParsedUrl,
        addresses: list[str],
        method: str,
        headers: Sequence[tuple[str, str]],
        body: bytes,
    ) -> httpcore.Response:
        """Send on the pool with the vetted addresses as this task's only route out."""
        url = ada_url.URL(parsed.href)
        host = parsed.host[1:-1] if parsed.host.startswith("[") else parsed.host
        default = parsed.port == _DEFAULT_PORTS[parsed.scheme]
        wire: list[tuple[str, str]] = [
            ("Host", parsed.host if default else f"{parsed.host}:{parsed.port}"),
            *headers,
        ]
        present = {k.lower() for k, _ in headers}
        wire += [(k, v) for k, v in _DEFAULT_HEADERS if k.lower() not in present]
        auth = _basic_auth(url)
        if auth is not None and "authorization" not in present:
            wire.append(("Authorization", auth))
        if body or method in _BODY_METHODS:
            wire.append(("Content-Length", str(len(body))))
        outgoing = httpcore.Request(
            method.encode("ascii"),
            httpcore.URL(
                scheme=parsed.scheme.encode("ascii"),
                host=host.encode("ascii"),
                port=parsed.port,
                target=(url.pathname + url.search).encode("ascii"),
            ),
            headers=[(k.encode("ascii"), v.encode("ascii")) for k, v in wire],
            content=body,
            extensions={"timeout": self._timeouts},
        )
        token = _ROUTE.set(_Route(host, parsed.port, tuple(addresses)))
        try:
            return await self._pool.handle_async_request(outgoing)
        except httpcore.TimeoutException as exc:
            raise SuaveplanError("SAND_FETCH_TIMEOUT", "the request timed out", cause=exc) from None
        except _TRANSPORT_ERRORS as exc:
            raise SuaveplanError(
                "SAND_FETCH_FAILED", f"the request failed ({type(exc).__name__})", cause=exc
            ) from None
        finally:
            _ROUTE.reset(token)

    async def connect(self, host: str, port: int, *, rule: str) -> socket.socket:
        # The name the checker judged (`check_host`: WHATWG host parsing), not the plugin's
        # spelling of it, which `getaddrinfo` would read its own way: `straße.de` through
        # Python's IDNA 2003 codec is `strasse.de`, a domain no rule granted, and `127.1` or
        # a bare `::1` would miss the IP-literal rule they matched.
        name = canonical_connect_host(host)
        if name is None:
            raise SuaveplanError("SAND_FETCH_FAILED", "the host is not a valid host name")
        if not _valid_port(port):  # as `check_host` refuses it: never resolved, never dialled
            raise SuaveplanError("SAND_FETCH_FAILED", "the port is not 1..65535")
        # One deadline for the lookup and every address: a zone that does not answer must
        # not hold the call past `timeout`, nor a name answering with many addresses that
        # swallow SYNs hold a thread for `timeout` times each of them.
        deadline = time.monotonic() + self._timeout
        try:
            addresses = await asyncio.wait_for(self.vet(name, port, rule), self._timeout)
        except TimeoutError:
            raise SuaveplanError("SAND_FETCH_TIMEOUT", "the lookup timed out") from None

        def dial() -> socket.socket:
            last: OSError = TimeoutError("the connection timed out")
            for address in addresses:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    sock = socket.create_connection((address, port), timeout=remaining)
                except OSError as exc:
                    last = exc
                    continue
                sock.settimeout(self._timeout)
                return sock
            raise last

        try:
            return await self._on_network_thread(dial)
        except TimeoutError as exc:
            raise SuaveplanError(
                "SAND_FETCH_TIMEOUT", "the connection timed out", cause=exc
            ) from None
        except OSError as exc:
            raise SuaveplanError("SAND_FETCH_FAILED", "the connection failed", cause=exc) from None
