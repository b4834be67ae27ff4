"""Fuzz target: the URL check (`PermissionChecker.check_fetch`) against the reference model.

Input layout: byte 0 says how many of the following newline-separated lines are fetch rules
(0-3); the remainder, newlines and all, is the URL. Properties checked for every input:

* compiling the rules raises only `FetchRuleError` (a `SAND_MANIFEST_INVALID` upstream);
* `check_fetch` on the URL never raises and never takes its fail-closed exception path;
* its decision (reason, matching rule, serialised href) equals `fuzz._reference.reference_fetch`;
* `check_connect` to the URL's canonical host and effective port (a WASM guest's raw socket)
  is allowed exactly when the reference finds a host/port match, naming the same first rule.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator

import ada_url
import atheris

with atheris.instrument_imports(include=["suaveplan_sandbox"]):
    from suaveplan_sandbox.metrics import InMemoryMetrics
    from suaveplan_sandbox.permissions import Allow, Deny, PermissionChecker, PermissionPolicy
    from suaveplan_sandbox.permissions._fetch_rules import FetchRuleError, FetchRuleSet

from fuzz._reference import reference_fetch, reference_host_matches
from fuzz._target import Finding, run_target, vector_cases


class _FailClosedAlarm(logging.Handler):
    """Turns the checker's "check failed; denying" log into a finding: it means a matcher bug."""

    def emit(self, record: logging.LogRecord) -> None:
        raise Finding(f"fail-closed path taken: {record.getMessage()}")


logging.getLogger("suaveplan_sandbox.permissions").addHandler(_FailClosedAlarm(logging.ERROR))
logging.getLogger("suaveplan_sandbox.permissions").propagate = False
logging.raiseExceptions = True


def _split(data: bytes) -> tuple[list[str], str]:
    count = data[0] % 4 if data else 0
    text = data[1:].decode("utf-8", "surrogateescape")
    parts = text.split("\n", count)
    if len(parts) <= count:
        return parts, ""
    return parts[:count], parts[count]


def _checker(rules: list[str]) -> PermissionChecker | None:
    try:
        FetchRuleSet(rules)
    except FetchRuleError:
        return None
    manifest = {"name": "fuzz", "permissions": {"fetch": rules}}
    policy = PermissionPolicy.from_manifest(manifest, root="/srv/fuzz")
    return PermissionChecker(policy, metrics=InMemoryMetrics())


def test_one_input(data: bytes) -> None:
    rules, url = _split(data)
    checker = _checker(rules)
    if checker is None:
        return
    decision = checker.check_fetch(url)
    expected = reference_fetch(rules, url)
    if isinstance(decision, Allow):
        got = ("allow", decision.rule, decision.target)
    elif isinstance(decision, Deny):
        got = (decision.reason.value, None, None)
    else:
        raise Finding(f"check_fetch returned {type(decision).__name__}")
    if got != (expected.outcome, expected.rule, expected.href):
        raise Finding(f"{rules!r} {url!r}: checker {got!r}, reference {expected!r}")
    _check_connect_agrees(checker, rules, url)


def _check_connect_agrees(checker: PermissionChecker, rules: list[str], url: str) -> None:
    """A raw connect (WASM sockets) to a URL's canonical host:port follows the same host rules."""
    try:
        parsed = ada_url.URL(url)
    except ValueError:
        return
    if parsed.protocol not in ("https:", "http:") or not parsed.hostname:
        return
    raw = parsed.hostname
    host = raw.removesuffix(".")
    port = int(parsed.port) if parsed.port else (443 if parsed.protocol == "https:" else 80)
    is_ip = int(parsed.host_type) in (int(ada_url.HostType.IPV4), int(ada_url.HostType.IPV6))
    socket_host = raw[1:-1] if raw.startswith("[") else raw  # as a socket API takes it
    decision = checker.check_connect(socket_host, port)
    expected = reference_host_matches(rules, host, is_ip=is_ip, port=port)
    if "*" in host or port == 0:
        # WHATWG lets `*` into a domain (so fetch judges `https://*.com/` by labels) and
        # accepts port 0; a raw connect refuses both outright, the stricter side.
        expected = []
    if decision.allowed != bool(expected) or (
        isinstance(decision, Allow) and decision.rule != expected[0][0]
    ):
        raise Finding(f"{rules!r} connect {socket_host!r}:{port}: {decision!r} vs {expected!r}")


def seeds() -> Iterator[bytes]:
    for case in vector_cases("urls"):
        rules: list[str] = case["rules"]
        url = case["input"]
        if type(url) is str and len(rules) <= 3 and all("\n" not in r for r in rules):
            text = "\n".join([*rules, url])
            yield bytes([len(rules)]) + text.encode("utf-8", "surrogateescape")


if __name__ == "__main__":
    run_target(test_one_input, seeds)
    sys.exit(0)
