"""What the loader reads, from a plugin author's side: a package's contents are the
author's, so a link in it must not make the host read one of its own files into the
plugin, and a FIFO, device or endless file must not hang or exhaust the host."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.vm import create_vm_sandbox
from suaveplan_sandbox.vm._guest import load_plugin

# A host file that happens to be valid Python: a settings module, or a quoted .env.
HOST_SECRET = 'API_KEY = "hunter2"\n'
LEAKER = "from .cfg import API_KEY\n\ndef leak():\n    return API_KEY\n"


def _package(tmp_path: Path, init: str = "") -> Path:
    pkg = tmp_path / "plugins" / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(init)
    return pkg


def _refused(path: Path) -> SuaveplanError:
    with pytest.raises(SuaveplanError) as info:
        load_plugin(path)
    return info.value


def test_a_package_module_linked_to_a_host_file_is_refused_and_its_values_never_reach_a_call(
    tmp_path: Path,
) -> None:
    secret = tmp_path / "host" / "settings.py"
    secret.parent.mkdir()
    secret.write_text(HOST_SECRET)
    pkg = _package(tmp_path, LEAKER)
    (pkg / "cfg.py").symlink_to(secret)
    err = _refused(pkg)
    assert err.code == "SAND_INVALID_ARGUMENT"
    assert (err.details["file"], err.details["reason"]) == ("cfg.py", "symlink")
    assert "hunter2" not in str(err.to_wire())
    policy = PermissionPolicy.from_manifest({"name": "pkg"}, root=pkg)

    async def main() -> str:
        with pytest.raises(SuaveplanError) as info:
            async with await create_vm_sandbox(plugin_module_path=pkg, policy=policy) as sb:
                await sb.call("leak")
        return info.value.code

    assert asyncio.run(main()) == "SAND_INVALID_ARGUMENT"


def test_a_link_inside_a_package_to_its_own_file_is_refused_too(tmp_path: Path) -> None:
    pkg = _package(tmp_path)
    (pkg / "real.py").write_text("X = 1\n")
    (pkg / "alias.py").symlink_to(pkg / "real.py")
    err = _refused(pkg)
    assert (err.details["file"], err.details["reason"]) == ("alias.py", "symlink")


def test_a_linked_folder_inside_a_package_contributes_no_module(tmp_path: Path) -> None:
    outside = tmp_path / "host" / "lib"
    outside.mkdir(parents=True)
    (outside / "__init__.py").write_text("")
    (outside / "cfg.py").write_text(HOST_SECRET)
    pkg = _package(tmp_path, "from .lib.cfg import API_KEY\n")
    (pkg / "lib").symlink_to(outside, target_is_directory=True)
    err = _refused(pkg)
    # Never walked into: the import names a module the bundle does not have.
    assert (err.code, err.details["module"]) == ("SAND_VM_MODULE_IMPORT_FORBIDDEN", ".lib.cfg")


@pytest.mark.timeout(20)
def test_a_fifo_named_like_a_module_is_refused_without_blocking(tmp_path: Path) -> None:
    pkg = _package(tmp_path)
    os.mkfifo(pkg / "pipe.py")  # nobody ever opens its write end
    err = _refused(pkg)
    assert (err.code, err.details["reason"]) == ("SAND_INVALID_ARGUMENT", "not-a-regular-file")


@pytest.mark.timeout(20)
def test_an_endless_source_is_refused_after_the_size_bound_not_read_to_the_end(
    tmp_path: Path,
) -> None:
    pkg = _package(tmp_path)
    with open(pkg / "huge.py", "wb") as f:
        f.truncate(1 << 40)  # sparse: a terabyte of zeros the host must not try to hold
    err = _refused(pkg)
    assert (err.code, err.details["file"]) == ("SAND_VM_SYNTAX_FORBIDDEN", "huge.py")


def test_the_plugin_path_the_host_names_may_itself_be_a_link(tmp_path: Path) -> None:
    real = tmp_path / "releases" / "v2"
    real.mkdir(parents=True)
    (real / "plugin.py").write_text("def f():\n    return 2\n")
    (real / "pkg").mkdir()
    (real / "pkg" / "__init__.py").write_text("def f():\n    return 3\n")
    (tmp_path / "plugin.py").symlink_to(real / "plugin.py")
    (tmp_path / "pkg").symlink_to(real / "pkg", target_is_directory=True)
    assert [m.name for m in load_plugin(tmp_path / "plugin.py").modules] == ["plugin"]
    assert [m.name for m in load_plugin(tmp_path / "pkg").modules] == ["pkg"]


def test_a_link_swapped_in_after_the_walk_is_still_not_followed(tmp_path: Path) -> None:
    # The walk checks for links, then reads; the read itself refuses a link (O_NOFOLLOW),
    # so replacing a checked file by a link in between gains nothing.
    from suaveplan_sandbox.vm._guest import _loader

    secret = tmp_path / "settings.py"
    secret.write_text(HOST_SECRET)
    (tmp_path / "cfg.py").symlink_to(secret)
    with pytest.raises(SuaveplanError) as info:
        _loader._read(tmp_path / "cfg.py", "cfg.py", follow=False)
    assert (info.value.code, info.value.details["reason"]) == ("SAND_INVALID_ARGUMENT", "symlink")
