"""A WASM sandbox keeps the host's own credentials out of its traceback log too.

The leak side: the guest asks for a secret and the host's vault client fails with its own
login token and a host-held value in the exception text; the operator's traceback log shows
`[REDACTED]` for both, one stated by the adapter (`redaction_values()`), the other by the host
(`create_wasm_sandbox(redact=...)`). A bad `redact=` refuses the creation with a code.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Final

import pytest

from suaveplan_sandbox.adapters import Adapters
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.errors._redact import REDACTED
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.wasm import create_wasm_sandbox

TRACE_LOGGER = "suaveplan_sandbox.gateway.traceback"
VAULT_TOKEN = "hvs.vault-login-0c4e7b"
HOST_VALUE = "host-held-value-71d2"

SECRET_WAT: Final = """
(module
  (import "suaveplan" "secrets_get" (func $sg (param i32 i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "TOKEN")
  (func (export "get") (result i32)
    (call $sg (i32.const 0) (i32.const 5) (i32.const 256) (i32.const 64) (i32.const 512))))
"""


class FailingVault:
    """A secrets backend logged in with its own token; its client fails quoting it."""

    def redaction_values(self) -> list[str]:
        return [VAULT_TOKEN]

    def get(self, name: str) -> str:
        raise RuntimeError(f"vault login {VAULT_TOKEN!r} for {HOST_VALUE} failed on {name}")


def _policy(root: Path) -> PermissionPolicy:
    return PermissionPolicy.from_manifest(
        {"name": "guest", "secrets": [{"name": "TOKEN"}]}, root=root
    )


async def test_host_credentials_are_scrubbed_from_a_wasm_guests_traceback_log(
    root: Path, wat: Callable[[str], Path], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=TRACE_LOGGER)
    sb = await create_wasm_sandbox(
        wasm_module_path=wat(SECRET_WAT),
        policy=_policy(root),
        proxies=Adapters(secrets=FailingVault()),
        redact=[HOST_VALUE],
    )
    try:
        assert await sb.call("get") != 0  # an errno: the host call failed
    finally:
        await sb.dispose()
    traces = [r.getMessage() for r in caplog.records if r.name == TRACE_LOGGER]
    assert len(traces) == 1
    assert "RuntimeError: vault login" in traces[0]
    assert traces[0].count(REDACTED) == 2
    assert VAULT_TOKEN not in caplog.text and HOST_VALUE not in caplog.text


@pytest.mark.parametrize("redact", [[HOST_VALUE, 7], HOST_VALUE], ids=["int-item", "one-str"])
async def test_a_bad_redact_refuses_a_wasm_sandbox(
    root: Path, wat: Callable[[str], Path], redact: object
) -> None:
    with pytest.raises(SuaveplanError) as info:
        await create_wasm_sandbox(
            wasm_module_path=wat(SECRET_WAT),
            policy=_policy(root),
            redact=redact,  # type: ignore[arg-type]
        )
    assert info.value.code == "SAND_INVALID_ARGUMENT"
    assert info.value.details["argument"] == "redact"
    assert HOST_VALUE not in repr(info.value.to_wire())
