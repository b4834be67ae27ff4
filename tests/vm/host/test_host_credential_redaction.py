"""A real VM sandbox keeps the host's own credentials out of what it writes.

The leak side: the sandbox's db adapter holds a DSN and its driver fails with the DSN in the
exception text; the operator's traceback log must show `[REDACTED]` where the password was.
And a value the host stated with `redact=` that reaches the plugin some other way is scrubbed
from the plugin's error and its log lines (in `logs` and the host's `logging`), while the
plugin's own result is its data and is left alone. A bad `redact=`, or an adapter that cannot
state its credentials, refuses the creation and leaves nothing open.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest

from suaveplan_sandbox.adapters import Adapters, PostgresDb, QueryResult
from suaveplan_sandbox.errors import SuaveplanError, WireValue
from suaveplan_sandbox.errors._redact import REDACTED
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.vm import create_vm_sandbox

TRACE_LOGGER = "suaveplan_sandbox.gateway.traceback"
PASSWORD = "Pw@x y'7q"
DSN = "postgresql://app:Pw%40x%20y%277q@db.internal:5432/app"
HOST_TOKEN = "host-token-5e1f9a77"

PLUGIN = """
from suaveplan import db, fetch, fs, log


def query():
    db.query("SELECT v FROM p_t")
    return "no error?"


def leak(value):
    print("token", value)
    log.error("token=%s", value)
    raise ValueError("the token " + value + " was refused")


def echo(value):
    return value


def probe(guess):
    # A guess at a host credential, in requests whose refusals the plugin reads back.
    seen = []
    for call in (
        lambda: db.query("SELECT '" + guess + "' FROM p_t"),
        lambda: fs.read_bytes("./" + guess),
        lambda: fetch("https://" + guess + ".example.com/"),
    ):
        try:
            call()
        except Exception as exc:
            seen.append(repr(exc) + repr(getattr(exc, "details", None)))
    return seen
"""


class DriverFailingDb:
    """Holds a DSN as `PostgresDb` does (and states it through one); its driver fails with
    the DSN in the exception text."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._declared = PostgresDb(dsn, plugin="creds", prefix="p_")

    def redaction_values(self) -> Iterable[str]:
        return self._declared.redaction_values()

    async def query(self, sql: str, params: Sequence[WireValue]) -> QueryResult:
        raise RuntimeError(f"connection to {self._dsn} failed (dsn={self._dsn!r})")


class CannotStateDb:
    def redaction_values(self) -> Iterable[str]:
        raise LookupError(f"no password in {DSN}")

    async def query(self, sql: str, params: Sequence[WireValue]) -> QueryResult:
        raise AssertionError("never called")


def _policy(root: Path, **permissions: object) -> PermissionPolicy:
    return PermissionPolicy.from_manifest(
        {"name": "creds", "permissions": permissions, "database": {"tablePrefix": "p_"}},
        root=root,
    )


def _plugin(root: Path) -> Path:
    path = root / "p.py"
    path.write_text(PLUGIN)
    return path


async def test_a_driver_error_quoting_the_dsn_is_scrubbed_in_the_traceback_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=TRACE_LOGGER)
    async with await create_vm_sandbox(
        plugin_module_path=_plugin(tmp_path),
        policy=_policy(tmp_path),
        proxies=Adapters(db=DriverFailingDb(DSN)),
    ) as sb:
        with pytest.raises(SuaveplanError) as info:
            await sb.call("query")
    assert info.value.code == "SAND_ADAPTER_FAILED"
    traces = [r.getMessage() for r in caplog.records if r.name == TRACE_LOGGER]
    assert len(traces) == 1
    assert str(info.value.details["correlation_id"]) in traces[0]
    assert "RuntimeError: connection to" in traces[0] and "db.internal" in traces[0]
    assert REDACTED in traces[0]
    everything = caplog.text + "".join(repr(r.__dict__) for r in caplog.records)
    for leaked in (PASSWORD, "Pw%40x%20y%277q", "y'7q"):
        assert leaked not in everything, leaked
    assert DSN not in str(info.value) + repr(info.value.to_wire())


async def test_a_redact_value_is_scrubbed_from_the_plugins_error_and_log_lines(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with await create_vm_sandbox(
        plugin_module_path=_plugin(tmp_path),
        policy=_policy(tmp_path),
        proxies=Adapters(),
        redact=[HOST_TOKEN],
        log_lines_per_s=None,
    ) as sb:
        # Its data channel is untouched: what it returns is its own.
        assert await sb.call("echo", HOST_TOKEN) == HOST_TOKEN
        with pytest.raises(SuaveplanError) as info:
            await sb.call("leak", HOST_TOKEN)
        logs = list(sb.logs)
    err = info.value
    assert err.code == "SAND_VM_PLUGIN_ERROR"
    assert err.details["message"] == f"the token {REDACTED} was refused"
    assert len(logs) == 2 and all(REDACTED in text for _, text in logs)
    shown = str(err) + repr(err.to_wire()) + repr(logs) + caplog.text
    shown += "".join(r.getMessage() + repr(r.__dict__) for r in caplog.records)
    assert HOST_TOKEN not in shown


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize(
    ("redact", "proxies", "code"),
    [
        ([HOST_TOKEN, b"bytes"], None, "SAND_INVALID_ARGUMENT"),
        (HOST_TOKEN, None, "SAND_INVALID_ARGUMENT"),
        ((), Adapters(db=CannotStateDb()), "SAND_ADAPTER_FAILED"),
    ],
    ids=["bytes-item", "one-str", "adapter-raises"],
)
async def test_a_creation_refused_over_credentials_is_coded_and_leaves_nothing_open(
    tmp_path: Path, redact: object, proxies: Adapters | None, code: str
) -> None:
    (tmp_path / "data").mkdir()
    policy = _policy(tmp_path, fs=["./data/*"])  # the default set opens the root: an fd

    async def create() -> SuaveplanError:
        with pytest.raises(SuaveplanError) as info:
            await create_vm_sandbox(
                plugin_module_path=_plugin(tmp_path),
                policy=policy,
                proxies=proxies,
                # Only for the default set: with `proxies=` it is refused (nothing uses it).
                data_dir=tmp_path / "state" if proxies is None else None,
                redact=redact,  # type: ignore[arg-type]
            )
        return info.value

    await create()  # once first: whatever is opened once per process is opened now
    before = _open_fds()
    err = await create()
    assert err.code == code
    assert HOST_TOKEN not in repr(err.to_wire()) and "Pw%40x" not in repr(err.to_wire())
    assert _open_fds() == before


class EchoingDb:
    """A driver whose errors quote the statement, as real ones do."""

    async def query(self, sql: str, params: Sequence[WireValue]) -> QueryResult:
        raise SuaveplanError("SAND_DB_ERROR", f"syntax error at or near {sql!r}")


async def test_the_plugin_never_sees_a_stated_value_scrubbed_so_it_cannot_test_guesses(
    tmp_path: Path,
) -> None:
    # What reaches the guest (the host's answers to its requests, denials included) is never
    # scrubbed: were it, a plugin could put guesses in requests whose errors echo them and
    # watch for `[REDACTED]`, an oracle for the host's credentials inside the sandbox.
    async with await create_vm_sandbox(
        plugin_module_path=_plugin(tmp_path),
        policy=_policy(tmp_path, fs=["./data/*"]),
        proxies=Adapters(db=EchoingDb()),
        redact=[HOST_TOKEN],
    ) as sb:
        seen = await sb.call("probe", HOST_TOKEN)
    assert isinstance(seen, list) and len(seen) == 3
    assert all(REDACTED not in text for text in seen)
    assert HOST_TOKEN in seen[0]  # the driver's own echo of the statement, unchanged
