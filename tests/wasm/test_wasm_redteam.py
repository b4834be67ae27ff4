"""Hostile guests against the WASM host: preopens wider than their rule, and memory beside memoryMb.

Each case is a small WAT guest; each refusal is a coded error, and a fresh sandbox answers
afterwards.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.metrics import InMemoryMetrics
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.wasm import Errno, create_wasm_sandbox

WASI_NOENT = 44  # WASI preview 1 `errno::noent`

# fd 3 is the first preopen, fd 4 the second (wasi-libc numbering; the host passes them in
# rule order). `open_secret` opens `s.txt` read-only beneath fd 4 and returns the errno;
# `plant` replaces the directory `link` beneath fd 3 with a symlink to `../private`.
PREOPEN_WAT = """
(module
  (import "wasi_snapshot_preview1" "path_open"
    (func $open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "path_symlink"
    (func $symlink (param i32 i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "path_remove_directory"
    (func $rmdir (param i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "../private")
  (data (i32.const 32) "link")
  (data (i32.const 64) "s.txt")
  (data (i32.const 96) "a.txt")
  (func $open_at (param $fd i32) (param $path i32) (param $len i32) (result i32)
    (call $open (local.get $fd) (i32.const 0) (local.get $path) (local.get $len)
      (i32.const 0) (i64.const 2) (i64.const 0) (i32.const 0) (i32.const 128)))
  (func (export "open_upload") (result i32) (call $open_at (i32.const 3) (i32.const 96) (i32.const 5)))
  (func (export "open_secret") (result i32) (call $open_at (i32.const 4) (i32.const 64) (i32.const 5)))
  (func (export "plant") (result i32) (local $e i32)
    (local.set $e (call $rmdir (i32.const 3) (i32.const 32) (i32.const 4)))
    (if (local.get $e) (then (return (local.get $e))))
    (call $symlink (i32.const 0) (i32.const 10) (i32.const 3) (i32.const 32) (i32.const 4)))
  (func (export "_start")
    (call $exit (call $open_at (i32.const 4) (i32.const 64) (i32.const 5)))))
"""


def policy(root: Path, **permissions: object) -> PermissionPolicy:
    return PermissionPolicy.from_manifest({"name": "guest", "permissions": permissions}, root=root)


async def _fresh_sandbox_answers(root: Path, wat: Callable[[str], Path]) -> None:
    path = wat('(module (func (export "f") (result i32) (i32.const 7)))')
    async with await create_wasm_sandbox(wasm_module_path=path, policy=policy(root)) as sb:
        assert await sb.call("f") == 7


async def test_an_exact_directory_rule_is_not_widened_to_the_files_beneath_it(
    root: Path, wat: Callable[[str], Path]
) -> None:
    # `./uploads/` grants exactly the path `uploads` (the checker denies `uploads/a.txt`);
    # a preopen of `uploads` would hand the guest every file beneath it.
    rules = policy(root, fs=["./uploads/"])
    assert not rules.fs.check("uploads/a.txt").allowed
    metrics = InMemoryMetrics()
    with pytest.raises(SuaveplanError) as info:
        sb = await create_wasm_sandbox(
            wasm_module_path=wat(PREOPEN_WAT), policy=rules, metrics=metrics
        )
        try:  # what the guest would get without the refusal
            assert await sb.call("open_upload") != Errno.SUCCESS
        finally:
            await sb.dispose()
    assert info.value.code == "SAND_WASM_PREOPEN_DENIED"
    assert info.value.details["rule"] == "./uploads/"
    assert (
        metrics.value(
            "plugin.permission_denied_total",
            plugin="guest",
            capability="fs",
            reason="path-not-in-allowlist",
        )
        == 1
    )
    await _fresh_sandbox_answers(root, wat)


@pytest.mark.parametrize("rule", ["./uploads/*", "uploads//*", "rw:./uploads/*", "./*", "*"])
async def test_subtree_rules_still_become_preopens(
    root: Path, wat: Callable[[str], Path], rule: str
) -> None:
    path = wat('(module (func (export "f") (result i32) (i32.const 7)))')
    async with await create_wasm_sandbox(
        wasm_module_path=path, policy=policy(root, fs=[rule])
    ) as sb:
        assert len(sb.preopens) == 1


def _link_policy(root: Path) -> PermissionPolicy:
    # The guest may write `data/`; `data/link/*` is a (redundant) read-only rule inside it.
    # Neither grants anything under `private/`.
    (root / "data" / "link").mkdir(parents=True)
    rules = policy(root, fs=["rw:./data/*", "./data/link/*"])
    assert not rules.fs.check("private/s.txt").allowed
    return rules


async def test_a_symlink_the_guest_planted_is_not_followed_by_a_later_run(
    root: Path, wat: Callable[[str], Path]
) -> None:
    rules = _link_policy(root)
    async with await create_wasm_sandbox(wasm_module_path=wat(PREOPEN_WAT), policy=rules) as sb:
        assert await sb.call("plant") == Errno.SUCCESS
        assert os.readlink(root / "data" / "link") == "../private"
        # Each run makes a new WASI context: its preopens must be the directories vetted at
        # create, not whatever the paths name now.
        res = await sb.run()
        assert res.exit_code != Errno.SUCCESS
        assert sb.state == "ready"


async def test_a_symlink_the_guest_planted_does_not_become_a_preopen_at_create(
    root: Path, wat: Callable[[str], Path]
) -> None:
    rules = _link_policy(root)
    async with await create_wasm_sandbox(wasm_module_path=wat(PREOPEN_WAT), policy=rules) as sb:
        assert await sb.call("plant") == Errno.SUCCESS
    metrics = InMemoryMetrics()
    with pytest.raises(SuaveplanError) as info:
        sb = await create_wasm_sandbox(
            wasm_module_path=wat(PREOPEN_WAT), policy=rules, metrics=metrics
        )
        try:  # what the guest would get without the refusal: private/s.txt
            assert await sb.call("open_secret") != Errno.SUCCESS
        finally:
            await sb.dispose()
    assert info.value.code == "SAND_WASM_PREOPEN_DENIED"
    assert metrics.value("plugin.permission_denied_total", plugin="guest", capability="fs") == 1
    await _fresh_sandbox_answers(root, wat)


async def test_a_preopen_the_guest_removed_leaves_run_answering_with_a_coded_result(
    root: Path, wat: Callable[[str], Path]
) -> None:
    # Removing a preopened directory used to make the next run's WASI context fail with a
    # raw wasmtime error; the run now keeps the directory vetted at create.
    rules = _link_policy(root)
    rmdir_only = PREOPEN_WAT.replace(
        "(call $symlink (i32.const 0) (i32.const 10) (i32.const 3) (i32.const 32) (i32.const 4))",
        "(i32.const 0)",
    )
    async with await create_wasm_sandbox(wasm_module_path=wat(rmdir_only), policy=rules) as sb:
        assert await sb.call("plant") == Errno.SUCCESS
        assert not (root / "data" / "link").exists()
        res = await sb.run()
        assert res.exit_code == WASI_NOENT


async def test_dispose_closes_the_preopen_descriptors(
    root: Path, wat: Callable[[str], Path]
) -> None:
    before = set(os.listdir("/proc/self/fd"))
    sb = await create_wasm_sandbox(
        wasm_module_path=wat(PREOPEN_WAT), policy=policy(root, fs=["./uploads/*"])
    )
    await sb.dispose()
    await sb.dispose()
    assert set(os.listdir("/proc/self/fd")) <= before


GC_WAT = """
(module
  (memory (export "memory") 60)
  (type $bytes (array (mut i8)))
  (global $keep (mut (ref null $bytes)) (ref.null $bytes))
  (func (export "hold") (param $n i32) (result i32)
    (global.set $keep (array.new_default $bytes (local.get $n)))
    (array.len (global.get $keep))))
"""


async def test_gc_objects_cannot_hold_memory_beside_memory_mb(
    root: Path, wat: Callable[[str], Path]
) -> None:
    # 60 pages (3.75 MiB) of linear memory fit a 4 MiB budget; a GC heap is a second pool of
    # up to memoryMb that the store's one-memory limit does not count.
    rules = PermissionPolicy.from_manifest(
        {"name": "guest", "permissions": {"budgets": {"memoryMb": 4}}}, root=root
    )
    with pytest.raises(SuaveplanError) as info:
        sb = await create_wasm_sandbox(wasm_module_path=wat(GC_WAT), policy=rules)
        try:
            await sb.call("hold", 3 * 1024 * 1024)
        finally:
            await sb.dispose()
    assert info.value.code == "SAND_WASM_INSTANTIATION_FAILED"
    await _fresh_sandbox_answers(root, wat)
