"""Independent reference models shared by the hypothesis properties and the atheris targets.

Deliberately slow and simple: each model restates the settled semantics in DESIGN.md with a
different algorithm from the implementation (a segment stack for paths, `fnmatch` for fs rules,
a linear `endswith` scan over every rule for fetch hosts, ada's high-level `URL` object instead
of its C API), so a bug has to be made twice to go unnoticed.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Final

import ada_url

__all__ = [
    "FetchVerdict",
    "reference_allows",
    "reference_fetch",
    "reference_host_matches",
    "reference_normalise",
]

_DEFAULT_PORTS: Final = {"https": 443, "http": 80}
_IP_TYPES: Final = (int(ada_url.HostType.IPV4), int(ada_url.HostType.IPV6))


def reference_normalise(path: str) -> str | None:
    """Segment-stack resolution; None when the path climbs above the root."""
    stack: list[str] = []
    for segment in path.split("/"):
        if segment in ("", "."):
            continue
        if segment == "..":
            if not stack:
                return None
            stack.pop()
        else:
            stack.append(segment)
    return "/".join(stack) or "."


def reference_allows(rule: str, target: str) -> bool:
    """Whether fs `rule` grants the normalised `target` (no `?` or `[` in either: fnmatch)."""
    body = rule.removeprefix("rw:")
    pattern = "/".join(s for s in body.split("/") if s not in ("", ".")) or "."
    if fnmatch.fnmatchcase(target, pattern):
        return True
    if pattern == "*":
        return True
    # `dir/*` also grants `dir` itself; with a `*` in `dir`, every directory it names.
    return pattern.endswith("/*") and fnmatch.fnmatchcase(target, pattern[:-2])


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchVerdict:
    """What the reference expects: `allow` with the rule and href, or a deny reason value."""

    outcome: str
    rule: str | None = None
    href: str | None = None


def _host_of(text: str) -> str | None:
    try:
        host = ada_url.URL("https://" + text + "/").hostname
    except ValueError:
        return None
    return host[:-1] if host.endswith(".") else host


def _split_rule(rule: str) -> tuple[bool, bool, str, int | None]:
    """(http, wildcard, host text, port) of an already-validated rule."""
    http = rule.startswith("http:")
    body = rule[5:] if http else rule
    port: int | None = None
    if body.startswith("["):
        close = body.index("]")
        host, rest = body[: close + 1], body[close + 1 :]
        if rest:
            port = int(rest[1:])
    elif ":" in body:
        host, _, port_text = body.rpartition(":")
        port = int(port_text)
    else:
        host = body
    wildcard = host.startswith("*.")
    return http, wildcard, host[2:] if wildcard else host, port


def reference_host_matches(
    rules: list[str], host: str, *, is_ip: bool, port: int
) -> list[tuple[str, bool]]:
    """(rule, has `http:`) for every rule whose host and port admit a canonical `host`."""
    matches: list[tuple[str, bool]] = []
    for rule in rules:
        http, wildcard, rule_host, rule_port = _split_rule(rule)
        canonical = _host_of(rule_host)
        if canonical is None or (rule_port is not None and rule_port != port):
            continue
        hit = (not is_ip and host.endswith("." + canonical)) if wildcard else host == canonical
        if hit:
            matches.append((rule, http))
    return matches


def reference_fetch(rules: list[str], url: str) -> FetchVerdict:
    """The fetch decision for `url` under already-valid `rules`, by a linear scan."""
    try:
        url.encode("utf-8")
        parsed = ada_url.URL(url)
    except (UnicodeEncodeError, ValueError):
        return FetchVerdict(outcome="invalid-url")
    if parsed.port == "0":  # explicit port 0 (`:0`, `:0000`): no destination, any scheme
        return FetchVerdict(outcome="invalid-url")
    scheme = parsed.protocol[:-1]
    if scheme not in _DEFAULT_PORTS:
        return FetchVerdict(outcome="scheme-not-permitted")
    host = parsed.hostname
    host = host[:-1] if host.endswith(".") else host
    port = int(parsed.port) if parsed.port else _DEFAULT_PORTS[scheme]
    is_ip = int(parsed.host_type) in _IP_TYPES
    matches = reference_host_matches(rules, host, is_ip=is_ip, port=port)
    if not matches:
        return FetchVerdict(outcome="host-not-in-allowlist")
    if scheme == "http":
        matches = [m for m in matches if m[1]]
        if not matches:
            return FetchVerdict(outcome="scheme-not-permitted")
    return FetchVerdict(outcome="allow", rule=matches[0][0], href=parsed.href)
