"""The standard adapters that hold credentials state them (`redaction_values()`).

Judged from the leak side: a redactor given what the adapter states must leave no form of
the password in the DSN or URL text the adapter holds (as written, and as a `repr` shows
it), whichever way the host wrote it. No server is needed: neither adapter connects before
its first request.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from psycopg.conninfo import make_conninfo

from suaveplan_sandbox.adapters import PostgresDb, RedisEventBus
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.errors._redact import REDACTED, SecretRedactor


def _scrubbed(values: tuple[str, ...], text: str) -> list[str]:
    redactor = SecretRedactor()
    for value in values:
        redactor.add(value)
    return [redactor.scrub(text), redactor.scrub(repr(text)), redactor.scrub(repr([text]))]


def _postgres(conninfo: str) -> PostgresDb:
    return PostgresDb(conninfo, plugin="creds", prefix="p_")


@pytest.mark.parametrize(
    ("conninfo", "password"),
    [
        ("postgresql://app:hunter2@db.internal:5432/app", "hunter2"),
        ("postgres://app:p%40ss%20w0rd@db.internal/app", "p@ss w0rd"),
        ("postgresql://app:pw-1@h1:5432,h2:5433/app?sslmode=require", "pw-1"),
        ("postgresql:///app?host=/run/pg&password=q%26r", "q&r"),
        ("host=db.internal user=app password=hunter2 dbname=app", "hunter2"),
        ("host=db.internal password='a b\\'c\\\\d' user=app", "a b'c\\d"),
    ],
    ids=["url", "url-encoded", "url-multihost", "url-query", "kv", "kv-quoted"],
)
def test_postgres_states_the_password_of_either_dsn_form(conninfo: str, password: str) -> None:
    values = tuple(_postgres(conninfo).redaction_values())
    assert password in values
    for text in _scrubbed(values, conninfo):
        assert REDACTED in text
        assert password not in text
        assert "db.internal" in text or "h1" in text or "/run/pg" in text


@pytest.mark.parametrize("password", ["Pw x'q7", "back\\slash", "plain-9", "é=ü&;"])
def test_postgres_states_the_password_of_a_conninfo_made_as_provisioning_makes_it(
    password: str,
) -> None:
    # `provision_postgres_plugin` returns `make_conninfo(...)` text, which quotes the password.
    conninfo = make_conninfo(host="db.internal", user="suaveplan_creds", password=password)
    values = tuple(_postgres(conninfo).redaction_values())
    for text in _scrubbed(values, conninfo):
        assert REDACTED in text and "db.internal" in text
        assert password not in text
        assert password.replace("'", "\\'") not in text


def test_postgres_states_every_password_the_url_shows_not_only_the_one_libpq_uses() -> None:
    conninfo = "postgresql://app:userinfo-pw@db.internal/app?password=query-pw"
    values = tuple(_postgres(conninfo).redaction_values())
    assert {"userinfo-pw", "query-pw"} <= set(values)
    for text in _scrubbed(values, conninfo):
        assert "userinfo-pw" not in text and "query-pw" not in text


@pytest.mark.parametrize(
    "conninfo",
    ["host=db.internal user=app dbname=app", "postgresql://app@db.internal/app", ""],
)
def test_postgres_without_a_password_states_nothing(conninfo: str) -> None:
    assert tuple(_postgres(conninfo).redaction_values()) == ()


def test_an_unparseable_postgres_dsn_is_a_coded_error_that_does_not_quote_it() -> None:
    db = _postgres("host=db.internal password='s3cret-unclosed")
    with pytest.raises(SuaveplanError) as info:
        db.redaction_values()
    err = info.value
    assert err.code == "SAND_INVALID_ARGUMENT"
    assert err.cause is None and err.__context__ is None  # libpq's message quotes the DSN
    assert "s3cret" not in str(err) + repr(err) + str(err.to_wire())


@pytest.fixture
async def buses() -> AsyncIterator[list[RedisEventBus]]:
    made: list[RedisEventBus] = []
    yield made
    for bus in made:
        await bus.aclose()


@pytest.mark.parametrize(
    ("url", "passwords"),
    [
        ("redis://:hunter2@cache.internal:6379/0", {"hunter2"}),
        ("redis://events:p%40ss%20w0rd@cache.internal/0", {"p@ss w0rd"}),
        ("rediss://events:tls-pw@cache.internal:6380", {"tls-pw"}),
        ("unix:///run/redis.sock?password=sock-pw&db=2", {"sock-pw"}),
        ("redis://events:userinfo-pw@cache.internal/0?password=query-pw", None),
    ],
    ids=["password-only", "encoded", "tls", "unix-query", "both"],
)
async def test_redis_states_the_password_of_its_url_and_not_the_username(
    buses: list[RedisEventBus], url: str, passwords: set[str] | None
) -> None:
    bus = RedisEventBus(url)
    buses.append(bus)
    values = tuple(bus.redaction_values())
    expected = passwords if passwords is not None else {"userinfo-pw", "query-pw"}
    assert set(values) == expected
    assert "events" not in values
    for text in _scrubbed(values, url):
        assert REDACTED in text
        assert "cache.internal" in text or "/run/redis.sock" in text
        assert not any(p in text for p in expected)


async def test_redis_without_a_password_states_nothing(buses: list[RedisEventBus]) -> None:
    bus = RedisEventBus("redis://events@cache.internal:6379/0")
    buses.append(bus)
    assert tuple(bus.redaction_values()) == ()
