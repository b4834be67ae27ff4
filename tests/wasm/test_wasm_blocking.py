"""The blocking facade runs the same sandbox for scripts, and the public names are pinned."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import suaveplan_sandbox.wasm as wasm_pkg
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.wasm import Errno, create_wasm_sandbox_blocking

FSPROBE = Path(__file__).parent / "fixtures" / "fsprobe.wasm"


def test_blocking_facade_runs_a_command_and_disposes_twice(root: Path) -> None:
    policy = PermissionPolicy.from_manifest(
        {"name": "guest", "permissions": {"fs": ["./uploads/*"]}}, root=root
    )
    with create_wasm_sandbox_blocking(wasm_module_path=FSPROBE, policy=policy) as sb:
        res = sb.run(argv=["fsprobe", "read", "/uploads/a.txt"])
        assert (res.exit_code, res.stdout) == (0, b"ok hello\n")
        sb.dispose()
    sb.dispose()


def test_public_names_are_pinned() -> None:
    assert wasm_pkg.__all__ == [
        "BlockingWasmSandbox",
        "CompileLimits",
        "Errno",
        "PreopenSpec",
        "RunResult",
        "WasmSandbox",
        "create_wasm_sandbox",
        "create_wasm_sandbox_blocking",
    ]


def test_blocking_facade_reports_an_ended_guest_and_counts_denials(
    root: Path, wat: Callable[[str], Path]
) -> None:
    guest = wat(
        """(module
          (import "suaveplan" "secrets_get" (func $sg (param i32 i32 i32 i32 i32) (result i32)))
          (memory (export "memory") 1)
          (func (export "denied") (result i32)
            (call $sg (i32.const 0) (i32.const 3) (i32.const 64) (i32.const 8) (i32.const 128)))
          (func (export "spin") (loop (br 0))))"""
    )
    policy = PermissionPolicy.from_manifest(
        {"name": "guest", "permissions": {"budgets": {"wallClockMs": 50}}}, root=root
    )
    with create_wasm_sandbox_blocking(wasm_module_path=guest, policy=policy) as sb:
        assert sb.call("denied") == Errno.ACCES
        assert (sb.denials_total, len(sb.denials), sb.state) == (1, 1, "ready")
        with pytest.raises(SuaveplanError) as info:
            sb.call("spin")
        assert info.value.code == "BUDGET_EXCEEDED"
        assert sb.state == "ended"
        with pytest.raises(SuaveplanError) as later:
            sb.call("denied")
        assert later.value.code == "SAND_WASM_ENDED"
    assert sb.state == "disposed"
