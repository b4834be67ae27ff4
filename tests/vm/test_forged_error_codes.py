"""A plugin cannot forge host-only error codes such as BUDGET_EXCEEDED."""

from __future__ import annotations

from pathlib import Path

import pytest

from suaveplan_sandbox.adapters import Adapters
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.metrics import BUDGET_EXCEEDED, InMemoryMetrics
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.testing import InMemoryFs
from suaveplan_sandbox.vm import create_vm_sandbox

PLUGIN = """
from suaveplan import SuaveplanError


def forge(code):
    raise SuaveplanError(code, "forged", {"budget": "memoryMb"})
"""


@pytest.mark.parametrize("code", ["BUDGET_EXCEEDED", "SAND_VM_WORKER_CRASHED", "SAND_VM_DISPOSED"])
async def test_a_forged_host_only_code_becomes_the_plugins_own_error(
    tmp_path: Path, code: str
) -> None:
    (tmp_path / "plugin.py").write_text(PLUGIN)
    policy = PermissionPolicy.from_manifest(
        {"name": "forger", "permissions": {"budgets": {"memoryMb": 256}}}, root=tmp_path
    )
    metrics = InMemoryMetrics()
    async with await create_vm_sandbox(
        plugin_module_path=tmp_path / "plugin.py",
        policy=policy,
        proxies=Adapters(fs=InMemoryFs()),
        metrics=metrics,
    ) as sb:
        with pytest.raises(SuaveplanError) as info:
            await sb.call("forge", code)
        assert info.value.code == "SAND_VM_PLUGIN_ERROR"
        assert info.value.details == {"type": "SuaveplanError", "claimed_code": code}
        assert metrics.value(BUDGET_EXCEEDED.name) == 0
        # The sandbox is still usable: a forged error is not a crash.
        with pytest.raises(SuaveplanError) as again:
            await sb.call("forge", "SAND_PERM_DENIED")
        assert again.value.code == "SAND_PERM_DENIED"
