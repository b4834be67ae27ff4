"""What the guest red-team pass tests share: a sandbox of one plugin source, and a call's
outcome as data (its value, or the code of its refusal)."""

from __future__ import annotations

from pathlib import Path

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.vm import VmSandbox, create_vm_sandbox


async def create_plugin(tmp_path: Path, source: str, *, name: str) -> VmSandbox:
    """A sandbox of `source` as `plugin.py`, under a manifest granting nothing."""
    (tmp_path / "plugin.py").write_text(source)
    policy = PermissionPolicy.from_manifest({"name": name}, root=tmp_path)
    return await create_vm_sandbox(plugin_module_path=tmp_path / "plugin.py", policy=policy)


async def outcome(sb: VmSandbox, name: str) -> object:
    """`("ok", value)` of calling `name`, or the code it was refused with."""
    try:
        return ("ok", await sb.call(name))
    except SuaveplanError as err:
        return err.code
