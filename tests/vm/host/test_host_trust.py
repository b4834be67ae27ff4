"""The host believes a worker's permission denial only if its gateway denied that call.

These tests play a worker that escaped the interpreter layer: they write frames into the
host's channel directly (as such a worker could), bypassing the guest runtime's own vetting.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from suaveplan_sandbox.adapters import Adapters
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.protocol import Failure, encode
from suaveplan_sandbox.testing import FakeFetch, InMemoryFs
from suaveplan_sandbox.vm import VmSandbox, create_vm_sandbox

SOURCE = """
from suaveplan import SuaveplanError, fetch, fs


def spin():
    while True:
        pass


def denied_fetch_then_spin():
    try:
        fetch("https://evil.example/")
    except SuaveplanError:
        pass
    while True:
        pass


def denied_read():
    return fs.read_bytes("/etc/passwd")
"""


async def _sandbox(tmp: Path) -> VmSandbox:
    (tmp / "p.py").write_text(SOURCE)
    policy = PermissionPolicy.from_manifest(
        {"name": "trust", "permissions": {"fs": ["./data/*"], "fetch": ["api.example.com"]}},
        root=tmp,
    )
    return await create_vm_sandbox(
        plugin_module_path=tmp / "p.py",
        policy=policy,
        proxies=Adapters(fs=InMemoryFs(), fetch=FakeFetch()),
    )


def _forge_denial(sb: VmSandbox, capability: str, reason: str) -> None:
    job = sb._job
    assert job is not None
    err = SuaveplanError(
        "SAND_PERM_DENIED", "permission denied", {"capability": capability, "reason": reason}
    )
    sb._on_readable_data(encode(Failure(id=job.id, error=err.to_wire())))  # type: ignore[arg-type]


async def _wait_for_denials(sb: VmSandbox, n: int) -> None:
    for _ in range(500):
        if len(sb.denials) >= n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the plugin's request was never denied")


async def _raised(call: asyncio.Future[object]) -> SuaveplanError:
    with pytest.raises(SuaveplanError) as info:
        await call
    return info.value


async def test_a_denial_no_request_of_the_call_received_is_recoded(tmp_path: Path) -> None:
    async with await _sandbox(tmp_path) as sb:
        call = asyncio.ensure_future(sb.call("spin"))
        await asyncio.sleep(0.05)
        _forge_denial(sb, "fs", "path-not-in-allowlist")
        err = await _raised(call)
        assert err.code == "SAND_VM_PLUGIN_ERROR"
        assert err.details["claimed_code"] == "SAND_PERM_DENIED"
        assert sb.denials == []


async def test_a_denial_of_another_capability_does_not_vouch_for_the_claim(tmp_path: Path) -> None:
    async with await _sandbox(tmp_path) as sb:
        call = asyncio.ensure_future(sb.call("denied_fetch_then_spin"))
        await _wait_for_denials(sb, 1)
        _forge_denial(sb, "fs", "path-not-in-allowlist")
        err = await _raised(call)
        assert err.code == "SAND_VM_PLUGIN_ERROR"
        assert err.details["claimed_code"] == "SAND_PERM_DENIED"


async def test_a_denial_matching_one_the_gateway_made_in_the_call_is_believed(
    tmp_path: Path,
) -> None:
    async with await _sandbox(tmp_path) as sb:
        call = asyncio.ensure_future(sb.call("denied_fetch_then_spin"))
        await _wait_for_denials(sb, 1)
        _forge_denial(sb, "fetch", "host-not-in-allowlist")
        err = await _raised(call)
        assert err.code == "SAND_PERM_DENIED"
        assert err.details == {"capability": "fetch", "reason": "host-not-in-allowlist"}


async def test_a_denial_in_an_earlier_call_does_not_vouch_for_a_later_one(tmp_path: Path) -> None:
    async with await _sandbox(tmp_path) as sb:
        genuine = await _raised(asyncio.ensure_future(sb.call("denied_read")))
        assert genuine.code == "SAND_PERM_DENIED"
        call = asyncio.ensure_future(sb.call("spin"))
        await asyncio.sleep(0.05)
        _forge_denial(sb, "fs", "path-not-in-allowlist")
        err = await _raised(call)
        assert err.code == "SAND_VM_PLUGIN_ERROR"
        assert err.details["claimed_code"] == "SAND_PERM_DENIED"


async def test_a_worker_that_stops_reading_cannot_stall_the_host_loop(tmp_path: Path) -> None:
    from suaveplan_sandbox.vm._sandbox import MAX_OUTBOUND_BYTES

    async with await _sandbox(tmp_path) as sb:
        call = asyncio.ensure_future(sb.call("spin"))  # busy: it reads nothing meanwhile
        await asyncio.sleep(0.05)
        chunk = b"\0" * (4 * 1024 * 1024)
        # With a blocking send this loop would hang the host (the test would time out).
        for _ in range(MAX_OUTBOUND_BYTES // len(chunk) + 2):
            sb._write(chunk)  # what the host does for replies
            if sb.state == "crashed":
                break
        err = await _raised(call)
        assert err.code == "SAND_VM_WORKER_CRASHED"
        assert err.details["why"] == "backpressure"
