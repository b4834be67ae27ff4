"""Adapter failures are logged redaction-safe: no exception text, no secret, no frames.

Attacker's view: a plugin that can make a host adapter raise (a crafted path, a hostile
server's reply) controls the exception's text, and the secrets it already read are in the
gateway's hands. Neither may reach a log record at the default level; the operator-enabled
traceback logger gets scrubbed text only. And no record may keep the exception (its traceback
runs through the adapter's and, for WASM, the guest thread's frames), or a handler that keeps
records would keep every disposed sandbox alive.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from suaveplan_sandbox.adapters import Adapters
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.gateway import Gateway
from suaveplan_sandbox.metrics import InMemoryMetrics
from suaveplan_sandbox.permissions import PermissionChecker, PermissionPolicy
from suaveplan_sandbox.testing import RecordingAudit

KNOWN_SECRET = "sk-live-9f8e7d6c5b4a"
GUEST_TEXT = "guest-controlled-canary-3141"
TRACE_LOGGER = "suaveplan_sandbox.gateway.traceback"

MANIFEST: dict[str, Any] = {
    "name": "logs",
    "permissions": {"fs": ["./uploads/*"]},
    "secrets": [{"name": "TOKEN"}],
}


class _Keep(logging.Handler):
    """A handler that retains every record, as an in-memory log buffer or pytest's caplog."""

    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self.records: list[logging.LogRecord] = []
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def text(self) -> str:
        return "\n".join(self.format(r) for r in self.records)


@pytest.fixture
def kept() -> Iterator[_Keep]:
    handler = _Keep()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield handler
    finally:
        root.removeHandler(handler)


@pytest.fixture
def default_levels() -> Iterator[None]:
    """The levels a host has without configuring anything (root WARNING, ours unset)."""
    names = ("", "suaveplan_sandbox", "suaveplan_sandbox.gateway", TRACE_LOGGER)
    saved = {n: logging.getLogger(n).level for n in names}
    logging.getLogger().setLevel(logging.WARNING)
    for name in names[1:]:
        logging.getLogger(name).setLevel(logging.NOTSET)
    try:
        yield
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


@pytest.fixture
def tracebacks_enabled(default_levels: None) -> Iterator[None]:
    logging.getLogger(TRACE_LOGGER).setLevel(logging.DEBUG)
    yield


class _Secrets:
    def get(self, name: str) -> str:
        return KNOWN_SECRET


class _Sandbox:
    """Stands in for what a guest's frames hold (a wasmtime Store, a worker handle)."""


class _LeakyFs:
    """Raises with the secret and guest text in the message, a sandbox in its frame."""

    def __init__(self, sandbox: _Sandbox | None = None) -> None:
        self._sandbox = weakref.ref(sandbox) if sandbox is not None else None

    def _raise(self) -> None:
        held = self._sandbox() if self._sandbox is not None else None  # a frame local
        assert held is not None or self._sandbox is None
        raise OSError(f"cannot open /srv/{GUEST_TEXT} with key {KNOWN_SECRET}")

    def read_bytes(self, path: str, *, max_bytes: int) -> bytes:
        self._raise()
        return b""

    def write_bytes(self, path: str, data: bytes) -> None:
        self._raise()

    def list_dir(self, path: str) -> list[str]:
        self._raise()
        return []

    def exists(self, path: str) -> bool:
        self._raise()
        return False


def _gateway(fs: object, audit: RecordingAudit | None = None) -> Gateway:
    policy = PermissionPolicy.from_manifest(MANIFEST, root="/srv/logs")
    return Gateway(
        checker=PermissionChecker(policy, metrics=InMemoryMetrics()),
        adapters=Adapters(fs=fs, secrets=_Secrets()),  # type: ignore[arg-type]
        audit=audit,
    )


def _fail(gateway: Gateway) -> SuaveplanError:
    assert gateway.dispatch_sync("secrets", "get", {"name": "TOKEN"}) == KNOWN_SECRET
    with pytest.raises(SuaveplanError) as info:
        gateway.dispatch_sync("fs", "read_bytes", {"path": "uploads/a.txt"})
    assert info.value.code == "SAND_ADAPTER_FAILED"
    return info.value


def test_default_level_logs_type_and_correlation_never_the_text_or_a_secret(
    kept: _Keep, default_levels: None
) -> None:
    audit = RecordingAudit()
    err = _fail(_gateway(_LeakyFs(), audit))
    correlation = err.details["correlation_id"]
    assert isinstance(correlation, str) and len(correlation) == 16
    ours = [r for r in kept.records if r.name.startswith("suaveplan_sandbox.gateway")]
    assert len(ours) == 1, "exactly one warning, no traceback record at the default level"
    record = ours[0]
    assert record.levelno == logging.WARNING
    assert record.exc_info is None and record.exc_text is None
    assert record.__dict__["suaveplan"] == {
        "plugin": "logs",
        "capability": "fs",
        "operation": "read_bytes",
        "error_type": "OSError",
        "correlation_id": correlation,
    }
    text = kept.text()
    assert "OSError" in text and correlation in text
    assert KNOWN_SECRET not in text
    assert GUEST_TEXT not in text
    assert "/srv/" not in text
    # The audit row carries the same id, so the guest's error, the log and the audit line join.
    assert audit.records[-1].extra == {"correlation_id": correlation}
    assert audit.records[-1].outcome == "error:SAND_ADAPTER_FAILED"


def test_operator_enabled_traceback_is_scrubbed_text_without_exc_info(
    kept: _Keep, tracebacks_enabled: None
) -> None:
    err = _fail(_gateway(_LeakyFs()))
    traces = [r for r in kept.records if r.name == TRACE_LOGGER]
    assert len(traces) == 1
    trace = traces[0]
    assert trace.levelno == logging.DEBUG and trace.exc_info is None
    message = trace.getMessage()
    assert str(err.details["correlation_id"]) in message
    assert "in _raise" in message and "OSError" in message  # a real traceback...
    assert "[REDACTED]" in message
    assert KNOWN_SECRET not in kept.text()  # ...with the secret the gateway handed out scrubbed


def test_traceback_stays_off_below_debug(kept: _Keep, default_levels: None) -> None:
    """INFO on the gateway logger (e.g. to see audit-adjacent detail) emits no traceback."""
    logging.getLogger("suaveplan_sandbox.gateway").setLevel(logging.INFO)
    _fail(_gateway(_LeakyFs()))
    assert [r for r in kept.records if r.name == TRACE_LOGGER] == []


def _disposed_sandbox_is_collectable(run: Any) -> None:
    sandbox = _Sandbox()
    alive = weakref.ref(sandbox)
    errors: list[SuaveplanError] = []
    run(_gateway(_LeakyFs(sandbox)), errors)
    assert errors and errors[0].code == "SAND_ADAPTER_FAILED"
    del sandbox
    gc.collect()
    assert alive() is None, "a retained log record or the error keeps the sandbox's frames alive"


def test_disposed_sandbox_is_collectable_while_records_are_kept_sync_thread(
    kept: _Keep, tracebacks_enabled: None
) -> None:
    def run(gateway: Gateway, errors: list[SuaveplanError]) -> None:
        def guest_thread() -> None:  # as the WASM host calls the gateway from its guest thread
            try:
                gateway.dispatch_sync("fs", "read_bytes", {"path": "uploads/a.txt"})
            except SuaveplanError as exc:
                errors.append(exc)

        thread = threading.Thread(target=guest_thread)
        thread.start()
        thread.join()

    _disposed_sandbox_is_collectable(run)
    assert [r for r in kept.records if r.name == TRACE_LOGGER], "the traceback was logged"


def test_disposed_sandbox_is_collectable_while_records_are_kept_async(
    kept: _Keep, tracebacks_enabled: None
) -> None:
    def run(gateway: Gateway, errors: list[SuaveplanError]) -> None:
        async def main() -> None:
            try:
                await gateway.dispatch("fs", "read_bytes", {"path": "uploads/a.txt"})
            except SuaveplanError as exc:
                errors.append(exc)
            await gateway.close()

        asyncio.run(main())

    _disposed_sandbox_is_collectable(run)
    assert len([r for r in kept.records if r.name == TRACE_LOGGER]) == 1


_SECRET_WAT = """
(module
  (import "suaveplan" "secrets_get" (func $sg (param i32 i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "TOKEN")
  (func (export "secret") (result i32)
    (call $sg (i32.const 0) (i32.const 5) (i32.const 256) (i32.const 64) (i32.const 512))))
"""


async def test_a_disposed_wasm_sandbox_is_collectable_while_failure_records_are_kept(
    tmp_path: Path, kept: _Keep, tracebacks_enabled: None
) -> None:
    """The real case: the adapter runs on the WASM guest thread, whose frames hold the Store."""
    import wasmtime

    from suaveplan_sandbox.wasm import Errno, create_wasm_sandbox

    class Exploding:
        def get(self, name: str) -> str:  # plain def: called inline on the guest thread
            raise RuntimeError(f"vault refused {GUEST_TEXT}")

    module = tmp_path / "secret.wasm"
    module.write_bytes(wasmtime.wat2wasm(_SECRET_WAT))
    policy = PermissionPolicy.from_manifest(
        {"name": "logs", "secrets": [{"name": "TOKEN"}]}, root=tmp_path
    )
    sb = await create_wasm_sandbox(
        wasm_module_path=module, policy=policy, proxies=Adapters(secrets=Exploding())
    )
    alive = weakref.ref(sb)
    for _ in range(3):
        assert await sb.call("secret") == Errno.IO
    await sb.dispose()
    del sb
    for _ in range(50):  # the guest thread may take a moment to let go after dispose
        gc.collect()
        if alive() is None:
            break
        await asyncio.sleep(0.02)
    assert alive() is None, "a kept log record holds the disposed WASM sandbox"
    ours = [r for r in kept.records if r.name.startswith("suaveplan_sandbox.gateway")]
    assert len([r for r in ours if r.name == TRACE_LOGGER]) == 3
    assert all(r.exc_info is None for r in ours)
    assert GUEST_TEXT in kept.text()  # the operator-enabled traceback text is there...
    assert all(GUEST_TEXT not in r.getMessage() for r in ours if r.name != TRACE_LOGGER)
