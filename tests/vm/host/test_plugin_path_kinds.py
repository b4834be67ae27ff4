"""A path that is not a plugin at all is a host argument error, not an import decision."""

from __future__ import annotations

from pathlib import Path

import pytest

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.vm import create_vm_sandbox


@pytest.mark.parametrize("name", ["plugin.txt", "folder", "missing.py"])
async def test_a_non_plugin_path_is_an_invalid_argument_naming_the_accepted_kinds(
    tmp_path: Path, name: str
) -> None:
    target = tmp_path / name
    if name == "plugin.txt":
        target.write_text("def f():\n    return 1\n")
    elif name == "folder":
        target.mkdir()  # a folder without __init__.py is not a package plugin
    policy = PermissionPolicy.from_manifest({"name": "p"}, root=tmp_path)
    with pytest.raises(SuaveplanError) as info:
        await create_vm_sandbox(plugin_module_path=target, policy=policy)
    assert info.value.code == "SAND_INVALID_ARGUMENT"
    assert info.value.details["accepted"] == [".py file", "package folder with __init__.py"]
