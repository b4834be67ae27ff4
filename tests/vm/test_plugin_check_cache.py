"""The memory of checked bundles (the fork server's compiled bundles, by digest), from a
plugin author's side: whatever changed since a bundle passed (a file's source, a new module,
a renamed file, the interpreter-layer option) is checked again. The host remembers nothing
but which digests the fork server holds; that memory's bounds are in
`test_fork_server_bundle_cache`."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.vm import create_vm_sandbox
from suaveplan_sandbox.vm._guest._loader import PluginModule, _digest, load_plugin
from suaveplan_sandbox.vm._zygote import fork_server


def _refused(path: Path) -> SuaveplanError:
    with pytest.raises(SuaveplanError) as info:
        load_plugin(path)
    return info.value


def _compiles() -> int:
    """Compile children the process-wide fork server forked so far."""
    server = fork_server()
    server.ping()
    return server.compiles


def test_a_plugin_edited_after_a_successful_create_to_import_os_is_refused_on_the_next(
    tmp_path: Path,
) -> None:
    plugin = tmp_path / "plugin.py"
    plugin.write_text("def f():\n    return 1\n")
    policy = PermissionPolicy.from_manifest({"name": "edited"}, root=tmp_path)

    async def main() -> SuaveplanError:
        async with await create_vm_sandbox(plugin_module_path=plugin, policy=policy) as sb:
            assert await sb.call("f") == 1
        # Same length, same name, same mtime resolution: only the bytes differ.
        plugin.write_text("import os\n\ndef f():\n    return os\n")
        with pytest.raises(SuaveplanError) as info:
            await create_vm_sandbox(plugin_module_path=plugin, policy=policy)
        return info.value

    err = asyncio.run(main())
    assert err.code == "SAND_VM_MODULE_IMPORT_FORBIDDEN"
    assert err.details["module"] == "os"


def test_a_package_gaining_a_module_nobody_imports_is_still_checked(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("def f():\n    return 1\n")
    load_plugin(pkg)
    (pkg / "later.py").write_text("import socket\n")
    err = _refused(pkg)
    assert err.code == "SAND_VM_MODULE_IMPORT_FORBIDDEN"
    assert (err.details["module"], err.details["file"]) == ("socket", "later.py")


def test_a_module_gaining_a_forbidden_import_deep_in_a_package_is_refused(
    tmp_path: Path,
) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .sub import tool\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "tool.py").write_text("X = 1\n")
    load_plugin(pkg)
    (pkg / "sub" / "tool.py").write_text("import ctypes\nX = 1\n")
    err = _refused(pkg)
    assert (err.code, err.details["module"]) == ("SAND_VM_MODULE_IMPORT_FORBIDDEN", "ctypes")


def test_a_renamed_file_is_checked_again(tmp_path: Path) -> None:
    # Same sources in the same order; only a file name (and so a module name) changed, which
    # turns the package's relative import into one of a module that does not exist.
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .helper import X\n")
    (pkg / "helper.py").write_text("X = 1\n")
    assert {m.name for m in load_plugin(pkg).modules} == {"pkg", "pkg.helper"}
    (pkg / "helper.py").rename(pkg / "tool.py")
    err = _refused(pkg)
    assert (err.code, err.details["module"]) == ("SAND_VM_MODULE_IMPORT_FORBIDDEN", ".helper")


def test_a_bundle_passed_without_the_interpreter_layer_is_checked_when_loaded_with_it(
    tmp_path: Path,
) -> None:
    plugin = tmp_path / "plugin.py"
    plugin.write_text("import os\n\ndef f():\n    return os.getpid()\n")
    lax = load_plugin(plugin, _without_interpreter_layer=True)
    assert lax.interpreter_layer is False
    err = _refused(plugin)
    assert (err.code, err.details["module"]) == ("SAND_VM_MODULE_IMPORT_FORBIDDEN", "os")


def test_a_checked_bundle_is_not_handed_out_for_a_load_without_the_layer(tmp_path: Path) -> None:
    plugin = tmp_path / "plugin.py"
    plugin.write_text("def f():\n    return 1\n")
    strict = load_plugin(plugin)
    lax = load_plugin(plugin, _without_interpreter_layer=True)
    assert (strict.interpreter_layer, lax.interpreter_layer) == (True, False)
    assert strict.digest != lax.digest
    assert fork_server().holds(strict.digest)
    assert not fork_server().holds(lax.digest)
    assert load_plugin(plugin) == strict


def test_an_unchanged_plugin_is_checked_once_and_a_refused_one_is_remembered(
    tmp_path: Path,
) -> None:
    good, bad = tmp_path / "good.py", tmp_path / "bad.py"
    good.write_text("def f():\n    return 1\n")
    bad.write_text("import os\n")
    before = _compiles()
    first = load_plugin(good)
    assert load_plugin(good) == first
    assert _compiles() == before + 1
    for _ in range(2):
        assert _refused(bad).code == "SAND_VM_MODULE_IMPORT_FORBIDDEN"
    # A refusal for its source alone is the fork server's to remember: no second child.
    assert _compiles() == before + 2


def _module(name: str, filename: str, source: str) -> PluginModule:
    return PluginModule(name=name, filename=filename, source=source, is_package=False)


def test_fields_shifted_across_their_boundaries_never_share_a_digest() -> None:
    # Concatenated, both read "pp.pyimport os": only the field boundaries differ.
    a = (_module("p", "p.py", "import os"),)
    b = (_module("p", "p.pyimport", " os"),)
    c = (_module("pp.py", "", "import os"),)
    assert len({_digest(a), _digest(b), _digest(c)}) == 3
    # Nor a module's fields moved into its neighbour.
    d = (_module("p", "p.py", "X = 1"), _module("p.q", "q.py", ""))
    e = (_module("p", "p.py", ""), _module("p.q", "q.py", "X = 1"))
    assert _digest(d) != _digest(e)
    pkg = PluginModule(name="p", filename="p.py", source="", is_package=True)
    assert _digest((pkg,)) != _digest((_module("p", "p.py", ""),))
