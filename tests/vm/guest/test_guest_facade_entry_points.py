"""No module facade offers a module's command-line entry point: `base64.main()` and
`base64.test()` read `sys.argv`, open files with the real `open`, import `getopt` and print to
the worker's stdout (the host's), all as trusted code on the plugin's behalf."""

from __future__ import annotations

import asyncio
import importlib
from pathlib import Path

import pytest

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.vm import create_vm_sandbox
from suaveplan_sandbox.vm._guest._policy import ALLOWED_MODULES
from suaveplan_sandbox.vm._guest._runtime import module_facade

ENTRY_POINTS = ("main", "test")


def test_an_allowed_module_has_an_entry_point_on_this_python() -> None:
    # What the next test guards against is real here: base64 has `main` on 3.11-3.13.
    assert callable(importlib.import_module("base64").main)


@pytest.mark.parametrize("name", sorted(ALLOWED_MODULES - {"suaveplan"}))
def test_no_facade_offers_an_entry_point(name: str) -> None:
    facade = module_facade(name)
    for attr in ENTRY_POINTS:
        assert getattr(facade, attr, None) is None, f"{name}.{attr}"


def test_a_plugin_calling_base64_main_gets_an_error_not_the_hosts_stdout(tmp_path: Path) -> None:
    (tmp_path / "p.py").write_text("import base64\n\ndef run():\n    return base64.main()\n")
    policy = PermissionPolicy.from_manifest({"name": "entry"}, root=tmp_path)

    async def main() -> object:
        async with await create_vm_sandbox(
            plugin_module_path=tmp_path / "p.py", policy=policy
        ) as sb:
            return await sb.call("run")

    with pytest.raises(SuaveplanError) as info:
        asyncio.run(main())
    # The name is not there (without the exclusion, `main` ran, and failed only because
    # Landlock kept its `getopt` import from loading).
    assert info.value.code == "SAND_VM_PLUGIN_ERROR"
    assert info.value.details["type"] == "AttributeError"
