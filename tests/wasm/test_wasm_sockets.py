"""`suaveplan.sock_*` through the gateway: an allowed round trip, a denied connect audited."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from suaveplan_sandbox.adapters import Adapters, AuditRecord
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.metrics import InMemoryMetrics
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.testing import FakeFetch
from suaveplan_sandbox.wasm import Errno, create_wasm_sandbox
from suaveplan_sandbox.wasm._imports import MAX_SOCKETS

# Memory map: 0 host "api.stripe.com", 32 host "evil.example.com", 64 "ping", 512 fd out,
# 516 sent out, 520 received length out, 1024 receive buffer (64 bytes).
SOCKET_WAT = """
(module
  (import "suaveplan" "sock_connect" (func $connect (param i32 i32 i32 i32) (result i32)))
  (import "suaveplan" "sock_send" (func $send (param i32 i32 i32 i32) (result i32)))
  (import "suaveplan" "sock_recv" (func $recv (param i32 i32 i32 i32) (result i32)))
  (import "suaveplan" "sock_close" (func $close (param i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "api.stripe.com")
  (data (i32.const 32) "evil.example.com")
  (data (i32.const 64) "ping")
  (func (export "connect") (param $host i32) (param $len i32) (result i32)
    (call $connect (local.get $host) (local.get $len) (i32.const 443) (i32.const 512)))
  (func (export "send") (result i32)
    (call $send (i32.load (i32.const 512)) (i32.const 64) (i32.const 4) (i32.const 516)))
  (func (export "recv") (result i32)
    (call $recv (i32.load (i32.const 512)) (i32.const 1024) (i32.const 64) (i32.const 520)))
  (func (export "close") (result i32) (call $close (i32.load (i32.const 512))))
  (func (export "load") (param i32) (result i32) (i32.load (local.get 0)))
  (func (export "load8") (param i32) (result i32) (i32.load8_u (local.get 0))))
"""


class ListAudit:
    def __init__(self) -> None:
        self.records: list[AuditRecord] = []

    def record(self, entry: AuditRecord) -> None:
        self.records.append(entry)


def policy(root: Path) -> PermissionPolicy:
    return PermissionPolicy.from_manifest(
        {"name": "guest", "permissions": {"fetch": ["api.stripe.com"]}}, root=root
    )


async def test_allowed_connect_send_recv_round_trip_goes_through_the_gateway(
    root: Path, wat: Callable[[str], Path]
) -> None:
    fetch = FakeFetch()
    metrics = InMemoryMetrics()
    try:
        async with await create_wasm_sandbox(
            wasm_module_path=wat(SOCKET_WAT),
            policy=policy(root),
            proxies=Adapters(fetch=fetch),
            metrics=metrics,
        ) as sb:
            assert await sb.call("connect", 0, 14) == Errno.SUCCESS
            assert fetch.connects == [("api.stripe.com", 443)]
            [peer] = fetch.peers
            assert await sb.call("send") == Errno.SUCCESS
            assert await sb.call("load", 516) == 4
            assert await asyncio.to_thread(peer.recv, 64) == b"ping"
            await asyncio.to_thread(peer.sendall, b"pong!")
            assert await sb.call("recv") == Errno.SUCCESS
            assert await sb.call("load", 520) == 5
            got = bytes([await sb.call("load8", 1024 + i) for i in range(5)])
            assert got == b"pong!"
            assert await sb.call("close") == Errno.SUCCESS
            assert await sb.call("send") == Errno.BADF  # closed descriptors are gone
            assert sb.denials == ()
            assert (
                metrics.value(
                    "plugin.capability_calls_total",
                    plugin="guest",
                    capability="fetch",
                    outcome="ok",
                )
                == 1
            )
    finally:
        fetch.close()


async def test_denied_connect_is_recorded_on_denials_and_in_the_audit_sink(
    root: Path, wat: Callable[[str], Path]
) -> None:
    fetch = FakeFetch()
    audit = ListAudit()
    async with await create_wasm_sandbox(
        wasm_module_path=wat(SOCKET_WAT),
        policy=policy(root),
        proxies=Adapters(fetch=fetch),
        audit=audit,
    ) as sb:
        assert await sb.call("connect", 32, 16) == Errno.ACCES
        assert fetch.connects == []
        assert [d.code for d in sb.denials] == ["SAND_WASM_OUTBOUND_DENIED"]
    outbound = [r for r in audit.records if "SAND_WASM_OUTBOUND_DENIED" in r.outcome]
    assert len(outbound) == 1
    entry = outbound[0]
    assert (entry.plugin, entry.capability, entry.operation) == ("guest", "fetch", "connect")
    assert entry.allowed is False
    assert entry.reason == "host-not-in-allowlist"


async def test_a_recv_from_a_silent_peer_blocks_no_longer_than_the_wall_clock_budget(
    root: Path, wat: Callable[[str], Path]
) -> None:
    fetch = FakeFetch()
    metrics = InMemoryMetrics()
    manifest = {
        "name": "guest",
        "permissions": {"fetch": ["api.stripe.com"], "budgets": {"wallClockMs": 150}},
    }
    try:
        sb = await create_wasm_sandbox(
            wasm_module_path=wat(SOCKET_WAT),
            policy=PermissionPolicy.from_manifest(manifest, root=root),
            proxies=Adapters(fetch=fetch),
            metrics=metrics,
        )
        try:
            assert await sb.call("connect", 0, 14) == Errno.SUCCESS
            with pytest.raises(SuaveplanError) as info:
                await asyncio.wait_for(sb.call("recv"), 10)  # the peer never sends
            assert info.value.code == "BUDGET_EXCEEDED"
            assert info.value.details["budget"] == "wallClockMs"
            assert metrics.value("plugin.budget_exceeded_total", plugin="guest") == 1
            # The guest thread unwound by itself (the recv timed out at the deadline); it
            # is not left blocked for the socket's own 30 s timeout. A liveness guard well
            # under those 30 s, not a timing assertion: on a loaded machine the breach may be
            # answered (`_abandon`) before the thread, woken at the deadline, has unwound.
            assert sb._executor is not None
            free = asyncio.wrap_future(sb._executor.submit(lambda: "free"))
            assert await asyncio.wait_for(free, 10) == "free"
        finally:
            await sb.dispose()
    finally:
        fetch.close()


async def test_a_guest_holds_at_most_max_sockets_and_the_adapter_is_not_asked_for_more(
    root: Path, wat: Callable[[str], Path]
) -> None:
    fetch = FakeFetch()
    try:
        async with await create_wasm_sandbox(
            wasm_module_path=wat(SOCKET_WAT), policy=policy(root), proxies=Adapters(fetch=fetch)
        ) as sb:
            answers = [await sb.call("connect", 0, 14) for _ in range(MAX_SOCKETS)]
            assert answers == [Errno.SUCCESS] * MAX_SOCKETS
            assert await sb.call("close") == Errno.SUCCESS  # frees one place
            assert await sb.call("connect", 0, 14) == Errno.SUCCESS
            refused = [await sb.call("connect", 0, 14) for _ in range(10)]
            assert refused == [Errno.MFILE] * 10
            assert await sb.call("load", 512) == 0  # no descriptor handed out
            assert len(fetch.connects) == MAX_SOCKETS + 1  # no socket made past the limit
    finally:
        fetch.close()


# A host whose SIGPIPE has its default action (as an embedded interpreter starts, and as many
# programs restore it): a guest sending on a socket whose remote end closed must cost the host
# an errno, never its life.
_SIGPIPE_HOST = """
import asyncio, json, signal, sys
signal.signal(signal.SIGPIPE, signal.SIG_DFL)
from pathlib import Path
from suaveplan_sandbox.adapters import Adapters
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.testing import FakeFetch
from suaveplan_sandbox.wasm import create_wasm_sandbox

async def main() -> None:
    root, module = Path(sys.argv[1]), Path(sys.argv[2])
    policy = PermissionPolicy.from_manifest(
        {"name": "guest", "permissions": {"fetch": ["api.stripe.com"]}}, root=root
    )
    fetch = FakeFetch()
    async with await create_wasm_sandbox(
        wasm_module_path=module, policy=policy, proxies=Adapters(fetch=fetch)
    ) as sb:
        results = [await sb.call("connect", 0, 14)]
        fetch.peers[0].close()
        for _ in range(3):
            results.append(await sb.call("send"))
    print(json.dumps(results))

asyncio.run(main())
"""


def test_a_send_to_a_closed_remote_cannot_sigpipe_the_host(
    root: Path, wat: Callable[[str], Path]
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SIGPIPE_HOST, str(root), str(wat(SOCKET_WAT))],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    connected, *sends = json.loads(done.stdout)
    assert connected == Errno.SUCCESS
    assert sends[-1] != Errno.SUCCESS  # the guest learns of the broken connection
