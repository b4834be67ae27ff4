"""Plugin bytes that are not UTF-8 (a source, a file or folder name) are refused with a
code, never an escaping UnicodeError."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.vm import create_vm_sandbox
from suaveplan_sandbox.vm._guest import load_plugin


def _refused(path: Path | bytes) -> SuaveplanError:
    with pytest.raises(SuaveplanError) as info:
        load_plugin(os.fsdecode(path))
    return info.value


def test_a_source_that_is_not_utf8_is_a_syntax_refusal_naming_its_line(tmp_path: Path) -> None:
    (tmp_path / "plugin.py").write_bytes(b"X = 1\nY = '\xff'\n")
    err = _refused(tmp_path / "plugin.py")
    assert err.code == "SAND_VM_SYNTAX_FORBIDDEN"
    assert (err.details["file"], err.details["line"]) == ("plugin.py", 2)


def test_a_package_module_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "latin1.py").write_bytes(b"# caf\xe9\n")
    err = _refused(pkg)
    assert (err.code, err.details["file"]) == ("SAND_VM_SYNTAX_FORBIDDEN", "latin1.py")


def test_a_package_file_name_that_is_not_utf8_is_an_invalid_argument(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / os.fsdecode(b"caf\xe9.py")).write_text("X = 1\n")
    err = _refused(pkg)
    assert err.code == "SAND_INVALID_ARGUMENT"
    assert err.details["file"] == "caf\ufffd.py"
    err.to_wire()  # the details encode


def test_a_plugin_folder_or_file_named_with_undecodable_bytes_is_an_invalid_argument(
    tmp_path: Path,
) -> None:
    pkg = os.path.join(os.fsencode(tmp_path), b"p\xff")
    os.mkdir(pkg)
    with open(os.path.join(pkg, b"__init__.py"), "w") as f:
        f.write("")
    assert _refused(pkg).code == "SAND_INVALID_ARGUMENT"
    single = os.path.join(os.fsencode(tmp_path), b"q\xff.py")
    with open(single, "w") as f:
        f.write("X = 1\n")
    assert _refused(single).code == "SAND_INVALID_ARGUMENT"


def test_create_vm_sandbox_reports_a_non_utf8_plugin_with_a_code(tmp_path: Path) -> None:
    (tmp_path / "plugin.py").write_bytes(b"def f():\n    return '\xff'\n")
    policy = PermissionPolicy.from_manifest({"name": "enc"}, root=tmp_path)

    async def main() -> str:
        with pytest.raises(SuaveplanError) as info:
            await create_vm_sandbox(plugin_module_path=tmp_path / "plugin.py", policy=policy)
        return info.value.code

    assert asyncio.run(main()) == "SAND_VM_SYNTAX_FORBIDDEN"
