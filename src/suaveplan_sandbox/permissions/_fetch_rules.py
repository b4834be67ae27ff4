"""Fetch rules: WHATWG URL parsing (ada-url) and host matching.

Pure code. A rule is `[http:]host[:port]` or `[http:]*.suffix[:port]`; hosts in rules are
normalised exactly like URL hosts (the WHATWG host parser: lower-case, IDNA, IPv4 canonical,
IPv6 bracketed) and a single trailing dot is ignored. Exact hosts live in a dict and
`*.suffix` rules are found by walking the host's label suffixes into a second dict, so a check
costs O(labels), not O(rules).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, final

import ada_url

from suaveplan_sandbox.permissions import _accel
from suaveplan_sandbox.permissions._decision import (
    Allow,
    Deny,
    DenyReason,
    _new_object,
    _set_rule,
    _set_target,
    new_allow,
)

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
_SPECIAL_SCHEMES: Final = frozenset({"http", "https", "ws", "wss", "ftp"})
_ada_parse: Final = _lib.ada_parse
_ada_get_href: Final = _lib.ada_get_href
_ada_get_components: Final = _lib.ada_get_components
_ada_get_host_type: Final = _lib.ada_get_host_type
_ada_free: Final = _lib.ada_free
_unpack: Final = _ffi.unpack
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
    component offsets (`ada_get_components`), and read the port from the same struct. For an
    invalid URL ada's href is empty (a valid one never is), which saves an `ada_is_valid`
    call. For the special schemes the host type follows from the serialised host itself
    (see `_is_ip_host`); other schemes ask ada. `tests/permissions/test_fetch_rules.py`
    checks all of this against the wrapper's attributes for every URL vector and for
    generated URLs.
    """
    if type(url) is not str:
        return None
    try:
        raw = url.encode()
    except UnicodeEncodeError:
        return None
    handle = _ada_parse(raw, len(raw))
    try:
        value = _ada_get_href(handle)
        if not value.length:
            return None
        href = _unpack(value.data, value.length).decode()
        parts = _ada_get_components(handle)
        scheme = href[: parts.protocol_end - 1]  # `protocol_end` counts the ":"
        host_start = parts.host_start
        host_end = parts.host_end
        port_value = parts.port
        host_type = -1 if scheme in _SPECIAL_SCHEMES else _ada_get_host_type(handle)
    finally:
        _ada_free(handle)
    # With credentials, `host_start` points at the "@" that ends them; "@" can never be part
    # of a host (it is a forbidden host code point), so dropping it is exact.
    host = href[host_start:host_end]
    if host[:1] == "@":
        host = host[1:]
    if host[-1:] == ".":
        host = host[:-1]
    port = _DEFAULT_PORTS.get(scheme, 0) if port_value == _PORT_OMITTED else int(port_value)
    if host_type >= 0:
        is_ip = host_type in (_IPV4, _IPV6)
    else:
        # Special schemes (WHATWG): a host whose last label is a number goes to the IPv4
        # parser (the URL fails if that does not parse) and an IPv4 address serialises as
        # four decimal labels; IPv6 serialises in brackets. A domain never ends in an
        # all-decimal label, and most end in a letter, which settles it in one comparison.
        last = host[-1:]
        is_ip = (last == "]") or ("0" <= last <= "9" and _ends_in_decimal_label(host))
    return href, scheme, host, port, is_ip


def _ends_in_decimal_label(host: str) -> bool:
    label = host.rpartition(".")[2]
    return label.isascii() and label.isdecimal()


def parse_url(url: object) -> ParsedUrl | None:
    """Parse `url` per WHATWG, or None if it does not parse."""
    fields = _parse_fields(url)
    if fields is None:
        return None
    href, scheme, host, port, is_ip = fields
    return ParsedUrl(href=href, scheme=scheme, host=host, port=port, is_ip=is_ip)


_IPV6_TEXT_CHARS: Final = frozenset("0123456789abcdefABCDEF:.")


def _canonical(text: str) -> tuple[str, bool] | None:
    """(canonical host, is an IP) for a bare host, parsed as the host of an https URL."""
    if type(text) is not str or not text:
        return None
    if text[0] == "[" and text[-1] == "]":
        inner = text[1:-1]
        if not inner or not _IPV6_TEXT_CHARS.issuperset(inner):
            return None
    elif not _FORBIDDEN_HOST_CHARS.isdisjoint(text):
        return None
    # With no delimiter or credential character left in `text`, the URL's host is `text`
    # itself, canonicalised (IDNA, IPv4 notations, case, trailing dot) and nothing else.
    fields = _parse_fields("https://" + text + "/")
    if fields is None or not fields[2]:
        return None
    return fields[2], fields[4]


def canonical_host(text: str) -> str | None:
    """Normalise a host exactly as a URL host is normalised, or None if it is not a host."""
    result = _canonical(text)
    return None if result is None else result[0]


def _canonical_connect(host: str) -> tuple[str, bool] | None:
    # A bare IPv6 address (as a socket API takes it) is bracketed like a URL host.
    return _canonical(f"[{host}]" if ":" in host and not host.startswith("[") else host)


def canonical_connect_host(host: object) -> str | None:
    """The host `check_host` judges for a raw connect to `host`, or None if it is not one.

    The adapter must dial this, never the plugin's own spelling: `getaddrinfo` reads a
    Unicode name with Python's IDNA 2003 codec, which maps `straße.de` to `strasse.de`
    (another domain than the WHATWG/UTS #46 `xn--strae-oqa.de` the rules matched)."""
    if type(host) is not str:
        return None
    result = _canonical_connect(host)
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


# (index, port or None, http, verbatim text): tuples keep the matching loop cheap.
_Entry = tuple[int, int | None, bool, str]


def _entry(rule: _Rule) -> _Entry:
    return (rule.index, rule.port, rule.http, rule.text)


# Denials carry no request data, so each reason needs exactly one instance.
_DENY_INVALID: Final = Deny(capability="fetch", reason=DenyReason.INVALID_URL)
_DENY_SCHEME: Final = Deny(capability="fetch", reason=DenyReason.SCHEME_NOT_PERMITTED)
_DENY_HOST: Final = Deny(capability="fetch", reason=DenyReason.HOST_NOT_IN_ALLOWLIST)


@final
class FetchRuleSet:
    """Compiled fetch rules: `check(url)` and `check_host(host, port)` for raw connects."""

    __slots__ = (
        "_cache",
        "_exact",
        "_matcher",
        "_suffix",
        "_suffix_labels",
        "_suffix_most",
        "rules",
    )

    def __init__(self, rules: Sequence[str]) -> None:
        self.rules: tuple[str, ...] = tuple(rules)
        exact: dict[str, list[_Rule]] = {}
        suffix: dict[str, list[_Rule]] = {}
        for i, text in enumerate(self.rules):
            key, wildcard, rule = _compile_rule(i, text)
            (suffix if wildcard else exact).setdefault(key, []).append(rule)
        self._exact = {k: tuple(_entry(r) for r in v) for k, v in exact.items()}
        self._suffix = {k: tuple(_entry(r) for r in v) for k, v in suffix.items()}
        # A `*.suffix` rule matches a host with more labels than the suffix, so a host's
        # suffixes are looked up only at the label counts some rule has, up to the largest.
        self._suffix_labels = frozenset(k.count(".") + 1 for k in self._suffix)
        self._suffix_most = max(self._suffix_labels, default=0)
        self._cache: dict[str, Allow | Deny] = {}
        # The C twin of `check` over these same tables and memo, when it is built.
        matcher = _accel.fetch_matcher()
        self._matcher = (
            None
            if matcher is None
            else matcher(
                exact=self._exact,
                suffix=self._suffix,
                suffix_labels=self._suffix_labels,
                cache=self._cache,
                deny_invalid=_DENY_INVALID,
                deny_scheme=_DENY_SCHEME,
                deny_host=_DENY_HOST,
                allow_type=Allow,
                cache_entries=_CACHE_ENTRIES,
                cached_chars=_CACHED_URL_CHARS,
            )
        )

    @property
    def fast_check(self) -> Callable[[object], Allow | Deny]:
        """`check`, in C when the accelerator is built (same decisions, same memo)."""
        return self.check if self._matcher is None else self._matcher.check

    def _select(self, host: str, is_ip: bool, port: int, http: bool) -> _Entry | bool:
        """The lowest-index rule granting host:port (an `http:` rule if `http`); else whether
        any rule matched host and port at all (to tell a scheme refusal from a host one)."""
        best: _Entry | None = None
        matched = False
        exact = self._exact
        bucket: tuple[_Entry, ...] | None = exact.get(host) if exact else None
        # `*.suffix` buckets: only label counts some suffix rule has are looked up, walking
        # the host's dots from the right (`stripe.com` is the 2-label suffix).
        counts = self._suffix_labels
        most = 0 if is_ip else self._suffix_most
        labels = 0
        dot = len(host)
        while True:
            if bucket is not None:
                for entry in bucket:
                    rule_port = entry[1]
                    if rule_port is not None and rule_port != port:
                        continue
                    matched = True
                    if (not http or entry[2]) and (best is None or entry[0] < best[0]):
                        best = entry
                bucket = None
            if labels >= most:
                return matched if best is None else best
            dot = host.rfind(".", 0, dot)
            if dot < 0:
                return matched if best is None else best
            labels += 1
            if labels in counts:
                bucket = self._suffix.get(host[dot + 1 :])

    def check(self, url: object) -> Allow | Deny:
        """The decision for `url`. This is the reference implementation; `fast_check` is the
        same decision, in C when available."""
        # Decisions are a pure function of (rules, url) and immutable: memoise recent short URLs.
        if type(url) is not str:
            return _DENY_INVALID
        cache = self._cache
        hit = cache.get(url)
        if hit is not None:
            return hit
        decision = self._decide(url)
        if len(url) <= _CACHED_URL_CHARS:
            if len(cache) >= _CACHE_ENTRIES:
                cache.clear()
            cache[url] = decision
        return decision

    def _decide(self, url: object) -> Allow | Deny:
        """`_parse_fields` specialised to what a fetch decision needs, inline: on an uncached
        check the parse is most of the cost, and a call plus a tuple of fields would add a
        tenth of it. An explicit port 0 is `invalid-url` (checked with the parse, before the
        scheme). Only `https:`/`http:` go on, so the host type follows from the host text
        (see `_parse_fields`); the URL vectors pin the decisions."""
        if type(url) is not str:
            return _DENY_INVALID
        try:
            raw = url.encode()
        except UnicodeEncodeError:
            return _DENY_INVALID
        handle = _ada_parse(raw, len(raw))
        try:
            value = _ada_get_href(handle)
            length = value.length
            if not length:
                return _DENY_INVALID
            href = _unpack(value.data, length).decode()
            parts = _ada_get_components(handle)
            host_start = parts.host_start
            host_end = parts.host_end
            port_value = parts.port
        finally:
            _ada_free(handle)
        if port_value == 0:
            # WHATWG accepts `:0` (and `:00`, `:0000`), but port 0 names no destination
            # (nothing can listen on it): a malformed URL, whatever its scheme, refused with
            # the parse, as `check_host` refuses port 0. `_speedups.c` does the same.
            return _DENY_INVALID
        # The serialised scheme is lower-case and ends at the first ":".
        if href[:6] == "https:":
            http = False
        elif href[:5] == "http:":
            http = True
        else:
            return _DENY_SCHEME
        host = href[host_start:host_end]
        if host[:1] == "@":
            host = host[1:]
        last = host[-1:]
        if last == ".":
            host = host[:-1]
            last = host[-1:]
        port = (80 if http else 443) if port_value == _PORT_OMITTED else int(port_value)
        is_ip = (last == "]") or ("0" <= last <= "9" and _ends_in_decimal_label(host))
        best = self._select(host, is_ip, port, http)
        if best is True:
            return _DENY_SCHEME
        if best is False:
            return _DENY_HOST
        allow: Allow = _new_object(Allow)  # `new_allow`, inline
        _set_rule(allow, best[3])
        _set_target(allow, href)
        return allow

    def check_host(self, host: object, port: object) -> Allow | Deny:
        if type(host) is not str or type(port) is not int or not 1 <= port <= 65535:
            return _DENY_INVALID
        result = _canonical_connect(host)
        if result is None:
            return _DENY_INVALID
        canonical, is_ip = result
        best = self._select(canonical, is_ip, port, http=False)
        if type(best) is bool:
            return _DENY_HOST
        return new_allow(best[3], f"{canonical}:{port}")
