"""The test-only switch that turns the in-interpreter layer off cannot be reached by accident."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.vm import create_vm_sandbox, create_vm_sandbox_sync
from suaveplan_sandbox.vm._guest import PluginBundle, compile_bundle, load_plugin

ESCAPING = "import os\n\ndef f():\n    return os.getpid()\n"


def test_no_public_entry_point_takes_the_switch() -> None:
    for fn in (create_vm_sandbox, create_vm_sandbox_sync):
        names = " ".join(inspect.signature(fn).parameters)
        assert "interpreter" not in names and "layer" not in names


def test_a_checked_load_still_rejects_what_the_unchecked_one_accepts(tmp_path: Path) -> None:
    (tmp_path / "p.py").write_text(ESCAPING)
    with pytest.raises(SuaveplanError) as info:
        load_plugin(tmp_path / "p.py")
    assert info.value.code == "SAND_VM_MODULE_IMPORT_FORBIDDEN"
    unchecked = load_plugin(tmp_path / "p.py", _without_interpreter_layer=True)
    assert unchecked.interpreter_layer is False
    assert compile_bundle(unchecked).interpreter_layer is False


def test_the_flag_is_part_of_the_cache_key_and_cannot_be_flipped_on_the_wire(
    tmp_path: Path,
) -> None:
    (tmp_path / "p.py").write_text("def f():\n    return 1\n")
    checked = load_plugin(tmp_path / "p.py")
    unchecked = load_plugin(tmp_path / "p.py", _without_interpreter_layer=True)
    assert checked.digest != unchecked.digest
    wire = checked.to_wire()
    wire["interpreter_layer"] = False
    with pytest.raises(SuaveplanError):
        PluginBundle.from_wire(wire)
    flipped = unchecked.to_wire()
    flipped["interpreter_layer"] = True
    with pytest.raises(SuaveplanError):
        PluginBundle.from_wire(flipped)
    assert PluginBundle.from_wire(unchecked.to_wire()) == unchecked
