"""The passwords a connection URL shows, for the adapters that state their credentials to the
redactor (`redaction_values()`): its userinfo's and every `?password=` in its query. A
client uses one of them; the text shows all, so all are stated."""

from __future__ import annotations

from urllib.parse import parse_qsl, unquote, urlsplit


def url_passwords(url: str) -> list[str]:
    """The userinfo password (percent-decoded) and the query's `password` values, in that
    order; empty ones included (the caller drops them)."""
    parts = urlsplit(url)
    found = [unquote(parts.password or "")]
    found += [v for k, v in parse_qsl(parts.query, keep_blank_values=True) if k == "password"]
    return found
