"""Credentials the host holds itself never reach a diagnostic, once the host has stated them.

The leak side: a host adapter holds a DSN (as `PostgresDb` does), and its driver fails with
the DSN in the exception text, as drivers do. The operator-enabled traceback log then holds
that text: the password must be `[REDACTED]` there, in every form the text gives it (a URL's
percent-encoding, a conninfo's quoting, a `repr`). The adapter states its credentials with
`redaction_values()`; the host states the rest with `Gateway(redact=...)`. An adapter that
cannot state them fails the gateway's construction rather than run unscrubbed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import pytest

from suaveplan_sandbox.adapters import Adapters, PostgresDb, QueryResult
from suaveplan_sandbox.errors import SuaveplanError, WireValue
from suaveplan_sandbox.errors._redact import REDACTED
from suaveplan_sandbox.gateway import Gateway
from suaveplan_sandbox.metrics import InMemoryMetrics
from suaveplan_sandbox.permissions import PermissionChecker, PermissionPolicy
from suaveplan_sandbox.testing import FakeDb, InMemoryFs, RecordingAudit

TRACE_LOGGER = "suaveplan_sandbox.gateway.traceback"
PASSWORD = "Pw@x y'7q"
HOST_TOKEN = "host-token-5e1f9a77"

MANIFEST: dict[str, Any] = {
    "name": "creds",
    "permissions": {"fs": ["./uploads/*"]},
    "database": {"tablePrefix": "p_"},
}

# The password as each DSN form writes it: percent-encoded in a URL, quoted in key=value.
DSNS = {
    "url": "postgresql://app:Pw%40x%20y%277q@db.internal:5432/app",
    "key-value": "host=db.internal user=app password='Pw@x y\\'7q' dbname=app",
}


class DriverFailingDb:
    """Holds a DSN as `PostgresDb` does and states its credentials through a real
    `PostgresDb`; its driver then fails with the DSN in the exception text."""

    def __init__(self, dsn: str, *, declare: bool = True) -> None:
        self._dsn = dsn
        self._declared = PostgresDb(dsn, plugin="creds", prefix="p_")
        self._declare = declare

    def redaction_values(self) -> Iterable[str]:
        return self._declared.redaction_values() if self._declare else ()

    async def query(self, sql: str, params: Sequence[WireValue]) -> QueryResult:
        raise RuntimeError(f"connection to {self._dsn} failed (dsn={self._dsn!r})")


class UndeclaredDb:
    """The same driver failure from an adapter without `redaction_values` at all."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn

    async def query(self, sql: str, params: Sequence[WireValue]) -> QueryResult:
        raise RuntimeError(f"connection to {self._dsn} failed (dsn={self._dsn!r})")


class LeakyFs:
    """Fails reads with a host-held token (and the guest's path) in the exception text."""

    async def read_bytes(self, path: str, *, max_bytes: int) -> bytes:
        raise OSError(f"the host's store refused {path} for token {HOST_TOKEN}")


def _gateway(
    *,
    db: object = None,
    fs: object = None,
    audit: object = None,
    redact: Iterable[str] = (),
) -> Gateway:
    policy = PermissionPolicy.from_manifest(MANIFEST, root="/srv/creds")
    return Gateway(
        checker=PermissionChecker(policy, metrics=InMemoryMetrics()),
        adapters=Adapters(db=db, fs=fs),  # type: ignore[arg-type]
        audit=audit,  # type: ignore[arg-type]
        redact=redact,
    )


@pytest.fixture
def traces(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    caplog.set_level(logging.DEBUG, logger=TRACE_LOGGER)
    yield caplog


def _trace_text(caplog: pytest.LogCaptureFixture) -> str:
    records = [r for r in caplog.records if r.name == TRACE_LOGGER]
    assert len(records) == 1, "one traceback record for the one failure"
    return records[0].getMessage()


async def _fail_query(gateway: Gateway) -> None:
    with pytest.raises(SuaveplanError) as info:
        await gateway.dispatch("db", "query", {"sql": "SELECT v FROM p_t", "params": []})
    assert info.value.code == "SAND_ADAPTER_FAILED"


@pytest.mark.parametrize("form", sorted(DSNS))
async def test_a_driver_error_quoting_the_dsn_reaches_the_traceback_log_scrubbed(
    traces: pytest.LogCaptureFixture, form: str
) -> None:
    await _fail_query(_gateway(db=DriverFailingDb(DSNS[form])))
    text = _trace_text(traces)
    assert "RuntimeError: connection to" in text  # the real traceback, with the driver's text
    assert REDACTED in text
    assert "db.internal" in text  # only the password goes, not the rest of the DSN
    for leaked in (PASSWORD, "Pw%40x%20y%277q", "Pw@x y\\'7q", "Pw@x y\\\\'7q", "y'7q"):
        assert leaked not in traces.text, leaked


@pytest.mark.parametrize("form", sorted(DSNS))
async def test_without_a_declaration_the_same_failure_would_log_the_password(
    traces: pytest.LogCaptureFixture, form: str
) -> None:
    """The control for the test above: what it guards against is real."""
    await _fail_query(_gateway(db=UndeclaredDb(DSNS[form])))
    text = _trace_text(traces)
    assert REDACTED not in text
    assert DSNS[form] in text


async def test_the_same_driver_failure_stated_by_the_host_with_redact_is_scrubbed(
    traces: pytest.LogCaptureFixture,
) -> None:
    await _fail_query(_gateway(db=UndeclaredDb(DSNS["url"]), redact=[PASSWORD]))
    text = _trace_text(traces)
    assert REDACTED in text
    assert "Pw%40x%20y%277q" not in traces.text and PASSWORD not in traces.text


async def test_a_redact_value_is_scrubbed_from_tracebacks_and_audit_resources(
    traces: pytest.LogCaptureFixture,
) -> None:
    audit = RecordingAudit()
    gateway = _gateway(fs=LeakyFs(), audit=audit, redact=[HOST_TOKEN])
    assert gateway.redactor.active
    # The plugin learned the token somewhere and puts it in the path it asks for.
    with pytest.raises(SuaveplanError) as info:
        await gateway.dispatch("fs", "read_bytes", {"path": f"uploads/{HOST_TOKEN}.txt"})
    assert info.value.code == "SAND_ADAPTER_FAILED"
    assert REDACTED in _trace_text(traces)
    assert HOST_TOKEN not in traces.text
    resource = audit.records[-1].resource
    assert resource is not None and REDACTED in resource and HOST_TOKEN not in resource


async def test_the_audit_sink_may_declare_credentials_too(
    traces: pytest.LogCaptureFixture,
) -> None:
    class ShippingAudit:
        """A sink that ships records with its own API token."""

        def __init__(self) -> None:
            self.records: list[object] = []

        def record(self, entry: object) -> None:
            self.records.append(entry)

        def redaction_values(self) -> list[str]:
            return [HOST_TOKEN]

    gateway = _gateway(fs=LeakyFs(), audit=ShippingAudit())
    with pytest.raises(SuaveplanError):
        await gateway.dispatch("fs", "read_bytes", {"path": "uploads/a.txt"})
    assert REDACTED in _trace_text(traces)
    assert HOST_TOKEN not in traces.text


def test_adapters_without_the_method_and_empty_values_leave_the_redactor_empty() -> None:
    class EmptyDb:
        def redaction_values(self) -> list[str]:
            return ["", ""]

        async def query(self, sql: str, params: Sequence[WireValue]) -> QueryResult:
            return QueryResult()

    assert not _gateway(db=FakeDb(), fs=InMemoryFs()).redactor.active
    assert not _gateway(db=EmptyDb(), redact=[""]).redactor.active
    assert not _gateway(db=PostgresDb("host=db user=app", plugin="c", prefix="p_")).redactor


def test_declared_and_host_values_are_all_in_the_redactor() -> None:
    gateway = _gateway(db=DriverFailingDb(DSNS["url"]), redact=iter([HOST_TOKEN]))
    scrubbed = gateway.redactor.scrub(f"{PASSWORD} {HOST_TOKEN} {DSNS['key-value']}")
    assert PASSWORD not in scrubbed and HOST_TOKEN not in scrubbed
    assert "Pw@x y\\'7q" not in scrubbed
    assert scrubbed.count(REDACTED) == 3


class _Str(str):
    __slots__ = ()


def test_a_str_subclass_in_redact_is_kept_not_ignored() -> None:
    # The redactor itself ignores anything but an exact str; the gateway must not lose it.
    gateway = _gateway(redact=[_Str(HOST_TOKEN)])
    assert gateway.redactor.scrub(f"x{HOST_TOKEN}x") == f"x{REDACTED}x"


@pytest.mark.parametrize(
    ("redact", "details"),
    [
        ([HOST_TOKEN, b"bytes-token"], {"argument": "redact", "index": 1, "type": "bytes"}),
        ([None], {"argument": "redact", "index": 0, "type": "NoneType"}),
        (HOST_TOKEN, {"argument": "redact", "type": "str"}),  # one str: not its characters
        (b"bytes-token", {"argument": "redact", "type": "bytes"}),
        (42, {"argument": "redact", "type": "int"}),
    ],
    ids=["bytes-item", "none-item", "one-str", "bytes", "int"],
)
def test_a_bad_redact_argument_is_a_coded_error_that_echoes_no_value(
    redact: Any, details: dict[str, WireValue]
) -> None:
    with pytest.raises(SuaveplanError) as info:
        _gateway(redact=redact)
    assert info.value.code == "SAND_INVALID_ARGUMENT"
    assert info.value.details == details
    shown = repr(info.value) + str(info.value.to_wire())
    assert HOST_TOKEN not in shown and "bytes-token" not in shown


class _Declares:
    """A db adapter whose `redaction_values` is whatever the test gives it."""

    def __init__(self, method: Any) -> None:
        self.redaction_values = method

    async def query(self, sql: str, params: Sequence[WireValue]) -> QueryResult:
        return QueryResult()


def _raises() -> list[str]:
    raise ValueError(f"cannot parse {DSNS['url']}")


async def _coroutine() -> list[str]:
    return [PASSWORD]


def _refuses() -> list[str]:
    raise SuaveplanError("SAND_INVALID_ARGUMENT", "the conninfo cannot be parsed")


@pytest.mark.parametrize(
    ("method", "expected"),
    [
        (_raises, {"error_type": "ValueError"}),
        (_coroutine, {"reason": "not-synchronous"}),
        (lambda: PASSWORD, {"reason": "not-an-iterable-of-str"}),
        (lambda: [PASSWORD, 7], {"reason": "not-an-iterable-of-str"}),
        (lambda: None, {"reason": "not-an-iterable-of-str"}),
    ],
    ids=["raises", "async", "one-str", "non-str-item", "none"],
)
def test_an_adapter_that_cannot_state_its_credentials_fails_the_construction(
    method: Any, expected: dict[str, WireValue]
) -> None:
    with pytest.raises(SuaveplanError) as info:
        _gateway(db=_Declares(method))
    err = info.value
    assert err.code == "SAND_ADAPTER_FAILED"
    assert err.details == {"capability": "db", "operation": "redaction_values", **expected}
    # Nothing of what it raised rides along: that text may hold the credential itself.
    assert err.cause is None and err.__context__ is None
    shown = repr(err) + str(err.to_wire())
    assert "Pw%40x" not in shown and PASSWORD not in shown


def test_an_adapters_own_coded_refusal_passes_through() -> None:
    with pytest.raises(SuaveplanError) as info:
        _gateway(db=_Declares(_refuses))
    assert info.value.code == "SAND_INVALID_ARGUMENT"


def test_a_postgres_dsn_that_cannot_be_parsed_fails_the_construction_without_its_text() -> None:
    dsn = "host=db password='never-closed"
    with pytest.raises(SuaveplanError) as info:
        _gateway(db=PostgresDb(dsn, plugin="creds", prefix="p_"))
    err = info.value
    assert err.code == "SAND_INVALID_ARGUMENT"
    assert err.cause is None
    assert "never-closed" not in repr(err) + str(err.to_wire())
