"""What the guest red-team pass tests share: a sandbox of one plugin source, and a call's
outcome as data (its value, or the code of its refusal)."""

from __future__ import annotations

from pathlib import Path

import pytest

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.vm import VmSandbox, create_vm_sandbox
from suaveplan_sandbox.vm import _sandbox as vm_sandbox_module
from suaveplan_sandbox.vm._guest import PluginBundle, load_plugin


async def create_plugin(tmp_path: Path, source: str, *, name: str) -> VmSandbox:
    """A sandbox of `source` as `plugin.py`, under a manifest granting nothing."""
    (tmp_path / "plugin.py").write_text(source)
    policy = PermissionPolicy.from_manifest({"name": name}, root=tmp_path)
    return await create_vm_sandbox(plugin_module_path=tmp_path / "plugin.py", policy=policy)


async def create_plugin_without_the_layer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, *, name: str
) -> VmSandbox:
    """`create_plugin` with the in-interpreter layer off for this plugin (the escape corpus's
    private switch), for sweeps that read code objects; the process layer stays on."""

    def unchecked(path: str | Path) -> PluginBundle:
        return load_plugin(path, _without_interpreter_layer=True)

    monkeypatch.setattr(vm_sandbox_module, "load_plugin", unchecked)
    return await create_plugin(tmp_path, source, name=name)


async def outcome(sb: VmSandbox, name: str) -> object:
    """`("ok", value)` of calling `name`, or the code it was refused with."""
    try:
        return ("ok", await sb.call(name))
    except SuaveplanError as err:
        return err.code
