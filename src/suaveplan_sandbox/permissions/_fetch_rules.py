"""Fetch rules: WHATWG URL parsing (ada-url) and host matching.

Pure code. A rule is `[http:]host[:port]` or `[http:]*.suffix[:port]`; hosts in rules are
normalised exactly like URL hosts (the WHATWG host parser: lower-case, IDNA, IPv4 canonical,
IPv6 bracketed) and a single trailing dot is ignored. Exact hosts live in a dict and
`*.suffix` rules are found by walking the host's label suffixes into a second dict, so a check
costs O(labels), not O(rules).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, final

import ada_url

from suaveplan_sandbox.permissions._decision import Allow, Deny, DenyReason

# ada's cffi module is untyped; we call its C API directly for speed.
_ADAPTER: Final = importlib.import_module("ada_url.ada_adapter")
_ffi: Final[Any] = _ADAPTER.ffi
_lib: Final[Any] = _ADAPTER.lib
_HTTP_PREFIX: Final = "http:"
_CACHE_ENTRIES: Final = 4096
_CACHED_URL_CHARS: Final = 2048
_DEFAULT_PORTS: Final = {"https": 443, "http": 80}
# Delimiters and anything the WHATWG parser would silently strip or reinterpret.
_FORBIDDEN_HOST_CHARS: Final = frozenset("/\\?#@%*[]: \t\r\n\x00\x7f") | frozenset(
    chr(c) for c in range(0x20)
)
_IPV4: Final = int(ada_url.HostType.IPV4)
_IPV6: Final = int(ada_url.HostType.IPV6)


class FetchRuleError(ValueError):
    """A malformed fetch rule, raised when the rule set is built."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(f"fetch rule {index}: {message}")
        self.index = index
        self.message = message


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ParsedUrl:
    """The one WHATWG parse of a URL; `port` is the effective port (0 if the scheme has none)."""

    href: str
    scheme: str
    host: str
    port: int
    is_ip: bool


_PORT_OMITTED: Final = 0xFFFFFFFF
_ParsedFields = tuple[str, str, str, int, bool]  # href, scheme, host, port, is_ip


def _parse_fields(url: object) -> _ParsedFields | None:
    """One WHATWG parse through ada's C API, or None if `url` does not parse.

    The Python wrapper (`ada_url.URL`) costs more per attribute than the parse itself, so we
    take the serialised href once and slice scheme and host out of it with ada's own
    component offsets (`ada_get_components`), and read the port from the same struct.
    `tests/permissions/test_fetch_rules.py` checks these slices against the wrapper's
    attributes for every URL vector and for generated URLs.
    """
    if type(url) is not str:
        return None
    try:
        raw = url.encode("utf-8")
    except UnicodeEncodeError:
        return None
    lib = _lib
    handle = lib.ada_parse(raw, len(raw))
    try:
        if not lib.ada_is_valid(handle):
            return None
        value = lib.ada_get_href(handle)
        href = _ffi.unpack(value.data, value.length).decode("utf-8")
        parts = lib.ada_get_components(handle)
        protocol_end = parts.protocol_end
        host_start = parts.host_start
        host_end = parts.host_end
        port_value = parts.port
        host_type = lib.ada_get_host_type(handle)
    finally:
        lib.ada_free(handle)
    scheme = href[: protocol_end - 1]  # `protocol_end` counts the ":"
    # With credentials, `host_start` points at the "@" that ends them; "@" can never be part
    # of a host (it is a forbidden host code point), so dropping it is exact.
    host = href[host_start:host_end]
    if host.startswith("@"):
        host = host[1:]
    if host.endswith("."):
        host = host[:-1]
    port = _DEFAULT_PORTS.get(scheme, 0) if port_value == _PORT_OMITTED else int(port_value)
    return href, scheme, host, port, host_type in (_IPV4, _IPV6)


def parse_url(url: object) -> ParsedUrl | None:
    """Parse `url` per WHATWG, or None if it does not parse."""
    fields = _parse_fields(url)
    if fields is None:
        return None
    href, scheme, host, port, is_ip = fields
    return ParsedUrl(href=href, scheme=scheme, host=host, port=port, is_ip=is_ip)


def _canonical(text: str) -> tuple[str, bool] | None:
    if type(text) is not str or not text:
        return None
    if text.startswith("[") and text.endswith("]"):
        inner = text[1:-1]
        if not inner or any(c not in "0123456789abcdefABCDEF:." for c in inner):
            return None
    elif any(c in _FORBIDDEN_HOST_CHARS for c in text):
        return None
    try:
        url = ada_url.URL("https://" + text + "/")
    except ValueError:
        return None
    host = url.hostname
    if host.endswith("."):
        host = host[:-1]
    if not host:
        return None
    host_type = url.host_type
    return host, host_type in (_IPV4, _IPV6)


def canonical_host(text: str) -> str | None:
    """Normalise a host exactly as a URL host is normalised, or None if it is not a host."""
    result = _canonical(text)
    return None if result is None else result[0]


@final
@dataclass(frozen=True, slots=True)
class _Rule:
    index: int
    text: str
    port: int | None
    http: bool


def _split_port(index: int, hostport: str) -> tuple[str, int | None]:
    if hostport.startswith("["):
        close = hostport.find("]")
        if close < 0:
            raise FetchRuleError(index, "unterminated IPv6 literal")
        host, rest = hostport[: close + 1], hostport[close + 1 :]
        if not rest:
            return host, None
        if not rest.startswith(":"):
            raise FetchRuleError(index, "unexpected text after IPv6 literal")
        port_text = rest[1:]
    elif ":" in hostport:
        host, _, port_text = hostport.partition(":")
        if ":" in port_text:
            raise FetchRuleError(index, "IPv6 literals in rules must be bracketed")
    else:
        return hostport, None
    if not port_text.isascii() or not port_text.isdigit() or len(port_text) > 5:
        raise FetchRuleError(index, "port must be a number 1..65535")
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise FetchRuleError(index, "port must be a number 1..65535")
    return host, port


def _compile_rule(index: int, text: object) -> tuple[str, bool, _Rule]:
    """(host key, is_wildcard, rule)."""
    if type(text) is not str:
        raise FetchRuleError(index, "rule must be a string")
    http = text.startswith(_HTTP_PREFIX)
    body = text[len(_HTTP_PREFIX) :] if http else text
    if not body:
        raise FetchRuleError(index, "rule is empty")
    if "://" in body or body.startswith("//") or "/" in body:
        raise FetchRuleError(index, "rule is a host (optionally *.suffix and :port), not a URL")
    host_text, port = _split_port(index, body)
    wildcard = host_text.startswith("*.")
    if wildcard:
        host_text = host_text[2:]
    if "*" in host_text:
        raise FetchRuleError(index, "'*' is allowed only as a leading '*.' label")
    if not host_text or host_text.startswith(".") or ".." in host_text:
        raise FetchRuleError(index, "host has an empty label")
    if wildcard:
        # Canonicalise the suffix as part of a host so a numeric last label cannot turn it
        # into an IPv4 address; an IP suffix can never match at a label boundary.
        result = _canonical("x." + host_text)
        if result is None or result[1] or not result[0].startswith("x."):
            raise FetchRuleError(index, "'*.' must be followed by a domain name")
        key = result[0][2:]
    else:
        result = _canonical(host_text)
        if result is None:
            raise FetchRuleError(index, "not a valid host")
        key = result[0]
    if not key or key.startswith(".") or ".." in key:
        raise FetchRuleError(index, "host has an empty label")
    return key, wildcard, _Rule(index, text, port, http)


@final
class FetchRuleSet:
    """Compiled fetch rules: `check(url)` and `check_host(host, port)` for raw connects."""

    __slots__ = ("_cache", "_exact", "_suffix", "rules")

    def __init__(self, rules: Sequence[str]) -> None:
        self.rules: tuple[str, ...] = tuple(rules)
        exact: dict[str, list[_Rule]] = {}
        suffix: dict[str, list[_Rule]] = {}
        for i, text in enumerate(self.rules):
            key, wildcard, rule = _compile_rule(i, text)
            (suffix if wildcard else exact).setdefault(key, []).append(rule)
        self._exact = {k: tuple(v) for k, v in exact.items()}
        self._suffix = {k: tuple(v) for k, v in suffix.items()}
        self._cache: dict[str, Allow | Deny] = {}

    def _select(self, host: str, is_ip: bool, port: int, http: bool) -> tuple[_Rule | None, bool]:
        """The lowest-index rule granting host:port (an `http:` rule if `http`), and whether
        any rule matched host and port at all (to tell a scheme refusal from a host one)."""
        best: _Rule | None = None
        matched = False
        bucket: tuple[_Rule, ...] | None = self._exact.get(host)
        suffix = self._suffix
        dot = -1 if is_ip or not suffix else host.find(".")
        while True:
            if bucket is not None:
                for rule in bucket:
                    if rule.port is not None and rule.port != port:
                        continue
                    matched = True
                    if (not http or rule.http) and (best is None or rule.index < best.index):
                        best = rule
            if dot < 0:
                return best, matched
            bucket = suffix.get(host[dot + 1 :])
            dot = host.find(".", dot + 1)

    def check(self, url: object) -> Allow | Deny:
        # Decisions are a pure function of (rules, url) and immutable: memoise recent short URLs.
        if type(url) is str:
            hit = self._cache.get(url)
            if hit is not None:
                return hit
            decision = self._decide(url)
            if len(url) <= _CACHED_URL_CHARS:
                if len(self._cache) >= _CACHE_ENTRIES:
                    self._cache.clear()
                self._cache[url] = decision
            return decision
        return self._decide(url)

    def _decide(self, url: object) -> Allow | Deny:
        fields = _parse_fields(url)
        if fields is None:
            return Deny(capability="fetch", reason=DenyReason.INVALID_URL)
        href, scheme, host, port, is_ip = fields
        if scheme not in {"https", "http"}:
            return Deny(capability="fetch", reason=DenyReason.SCHEME_NOT_PERMITTED)
        best, matched = self._select(host, is_ip, port, scheme == "http")
        if best is not None:
            return Allow(rule=best.text, target=href)
        if matched:
            return Deny(capability="fetch", reason=DenyReason.SCHEME_NOT_PERMITTED)
        return Deny(capability="fetch", reason=DenyReason.HOST_NOT_IN_ALLOWLIST)

    def check_host(self, host: object, port: object) -> Allow | Deny:
        if type(host) is not str or type(port) is not int or not 1 <= port <= 65535:
            return Deny(capability="fetch", reason=DenyReason.INVALID_URL)
        # A bare IPv6 address (as a socket API takes it) is bracketed like a URL host.
        result = _canonical(f"[{host}]" if ":" in host and not host.startswith("[") else host)
        if result is None:
            return Deny(capability="fetch", reason=DenyReason.INVALID_URL)
        canonical, is_ip = result
        best, _ = self._select(canonical, is_ip, port, http=False)
        if best is None:
            return Deny(capability="fetch", reason=DenyReason.HOST_NOT_IN_ALLOWLIST)
        return Allow(rule=best.text, target=f"{canonical}:{port}")
