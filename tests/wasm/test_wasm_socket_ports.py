"""`sock_connect` takes its port as a signed i32: one outside 1..65535 is INVAL, never shown
to the gateway (no decision, no audit record, no adapter call)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from suaveplan_sandbox.adapters import Adapters, AuditRecord
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.testing import FakeFetch
from suaveplan_sandbox.wasm import Errno, create_wasm_sandbox

CONNECT_WAT = """
(module
  (import "suaveplan" "sock_connect" (func $connect (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "api.stripe.com")
  (func (export "connect") (param $port i32) (result i32)
    (call $connect (i32.const 0) (i32.const 14) (local.get $port) (i32.const 512))))
"""


class ListAudit:
    def __init__(self) -> None:
        self.records: list[AuditRecord] = []

    def record(self, entry: AuditRecord) -> None:
        self.records.append(entry)


@pytest.mark.parametrize("port", [0, -1, -443, 65536, 2**31 - 1, -(2**31), 0xFFFF_FFFF])
async def test_a_port_outside_1_to_65535_is_inval_before_the_gateway(
    port: int, root: Path, wat: Callable[[str], Path]
) -> None:
    fetch, audit = FakeFetch(), ListAudit()
    rules = PermissionPolicy.from_manifest(
        {"name": "guest", "permissions": {"fetch": ["api.stripe.com"]}}, root=root
    )
    try:
        async with await create_wasm_sandbox(
            wasm_module_path=wat(CONNECT_WAT),
            policy=rules,
            proxies=Adapters(fetch=fetch),
            audit=audit,
        ) as sb:
            assert await sb.call("connect", port) == Errno.INVAL
            assert fetch.connects == []
            assert audit.records == []
            assert sb.denials == ()
            # The ends of the range reach the gateway (and the adapter) as they are.
            assert await sb.call("connect", 1) == Errno.SUCCESS
            assert await sb.call("connect", 65535) == Errno.SUCCESS
            assert fetch.connects == [("api.stripe.com", 1), ("api.stripe.com", 65535)]
    finally:
        fetch.close()
