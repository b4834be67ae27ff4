"""Loading a plugin an attacker packed: what the host reads must stay bounded and inside the
package, and what is checked must be exactly what runs."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path

import pytest
from test_plugin_files import _package, _refused

from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.vm import create_vm_sandbox
from suaveplan_sandbox.vm._guest import _loader, load_plugin


def _call(plugin: Path, name: str) -> object:
    policy = PermissionPolicy.from_manifest({"name": "redteam"}, root=plugin.parent)

    async def main() -> object:
        async with await create_vm_sandbox(plugin_module_path=plugin, policy=policy) as sb:
            return await sb.call(name)

    return asyncio.run(main())


@pytest.mark.timeout(60)
def test_a_package_of_endless_empty_files_is_refused_after_the_entry_bound(
    tmp_path: Path,
) -> None:
    pkg = _package(tmp_path)
    for i in range(_loader._MAX_ENTRIES + 1):
        (pkg / f"f{i}.txt").touch()
    started = time.monotonic()
    err = _refused(pkg)
    assert (err.code, err.details["reason"]) == ("SAND_INVALID_ARGUMENT", "too-many-files")
    assert time.monotonic() - started < 10


def test_the_entry_bound_counts_every_package_folder_not_just_one(tmp_path: Path) -> None:
    pkg = _package(tmp_path)
    per_folder = _loader._MAX_ENTRIES // 4 + 1
    for d in range(4):
        sub = pkg / f"sub{d}"
        sub.mkdir()
        (sub / "__init__.py").touch()
        for i in range(per_folder):
            (sub / f"m{i}.py").touch()
    err = _refused(pkg)
    assert (err.code, err.details["reason"]) == ("SAND_INVALID_ARGUMENT", "too-many-files")


def test_many_sources_under_the_file_bound_are_refused_over_the_package_bound(
    tmp_path: Path,
) -> None:
    pkg = _package(tmp_path)
    chunk = "# " + "x" * 1022 + "\n"
    each = _loader._MAX_SOURCE // 2 - 4096
    for i in range(3):  # each well under the per-file bound, together over the package's
        (pkg / f"m{i}.py").write_text(chunk * (each // len(chunk)))
    err = _refused(pkg)
    assert err.code == "SAND_VM_SYNTAX_FORBIDDEN"
    assert (err.details["reason"], err.details["file"]) == ("sources-too-large", "m2.py")


def test_a_package_nested_deeper_than_the_stack_loads_without_a_recursion_error(
    tmp_path: Path,
) -> None:
    pkg = _package(tmp_path)
    depth = 1500  # past what a recursive walk survives, within PATH_MAX
    where = pkg
    for _ in range(depth):
        where = where / "d"
        where.mkdir()
        (where / "__init__.py").touch()
    try:
        bundle = load_plugin(pkg)
        assert len(bundle.modules) == depth + 1
    finally:
        _remove_chain(pkg, tmp_path)


def _remove_chain(top: Path, scratch: Path) -> None:
    """shutil.rmtree (and pytest's cleanup) recurse per level: take the chain apart."""
    i = 0
    while (top / "d").is_dir():
        rest = scratch / f"rest{i}"
        (top / "d").rename(rest)
        shutil.rmtree(top)
        top, i = rest, i + 1
    shutil.rmtree(top)


@pytest.mark.timeout(20)
def test_a_fifo_or_socket_that_is_not_a_module_is_skipped_without_blocking(
    tmp_path: Path,
) -> None:
    pkg = _package(tmp_path, "def f():\n    return 1\n")
    os.mkfifo(pkg / "data")
    assert [m.name for m in load_plugin(pkg).modules] == ["pkg"]


def test_a_link_named_like_a_module_to_a_host_folder_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "host"
    outside.mkdir()
    (outside / "__init__.py").write_text('API_KEY = "hunter2"\n')
    pkg = _package(tmp_path)
    (pkg / "cfg.py").symlink_to(outside, target_is_directory=True)
    err = _refused(pkg)
    assert (err.details["file"], err.details["reason"]) == ("cfg.py", "symlink")


def test_a_package_folder_swapped_for_a_link_after_listing_is_not_followed(
    tmp_path: Path,
) -> None:
    # Folders are opened with O_NOFOLLOW relative to their parent: a link is no folder.
    outside = tmp_path / "host"
    outside.mkdir()
    (outside / "__init__.py").write_text('API_KEY = "hunter2"\n')
    pkg = _package(tmp_path)
    (pkg / "lib").symlink_to(outside, target_is_directory=True)
    fd = os.open(pkg, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert _loader._package_folder(fd, "lib") is None
    finally:
        os.close(fd)


def test_shipped_bytecode_is_never_a_module(tmp_path: Path) -> None:
    pkg = _package(tmp_path, "from .helper import X\n")
    (pkg / "helper.pyc").write_bytes(b"\x00" * 32)
    cache = pkg / "__pycache__"
    cache.mkdir()
    (cache / "helper.cpython-311.pyc").write_bytes(b"\x00" * 32)
    (cache / "__init__.py").write_text("import os\n")  # a hidden package is not walked
    err = _refused(pkg)
    assert (err.code, err.details["module"]) == ("SAND_VM_MODULE_IMPORT_FORBIDDEN", ".helper")


def test_an_encoding_cookie_is_ignored_so_what_is_checked_is_what_runs(tmp_path: Path) -> None:
    # Under raw_unicode_escape the comment would end at \u000a and `X = 2` would run; the
    # loader reads UTF-8 and compiles text, so the cookie changes nothing.
    plugin = tmp_path / "cookie.py"
    plugin.write_text(
        "# -*- coding: raw_unicode_escape -*-\nX = 1  #\\u000aX = 2\ndef f():\n    return X\n"
    )
    assert _call(plugin, "f") == 1


def test_a_rot13_cookie_does_not_turn_hidden_text_into_code(tmp_path: Path) -> None:
    plugin = tmp_path / "rot.py"
    plugin.write_text("# -*- coding: rot13 -*-\nvzcbeg bf\n")
    assert _refused(plugin).code == "SAND_VM_SYNTAX_FORBIDDEN"


def test_a_plugin_named_like_an_allowed_module_does_not_shadow_it(tmp_path: Path) -> None:
    plugin = tmp_path / "json.py"
    plugin.write_text("import json\n\ndef f():\n    return json.dumps([1])\n")
    assert _call(plugin, "f") == "[1]"
