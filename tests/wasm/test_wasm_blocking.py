"""The blocking facade runs the same sandbox for scripts, and the public names are pinned."""

from __future__ import annotations

from pathlib import Path

import suaveplan_sandbox.wasm as wasm_pkg
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.wasm import create_wasm_sandbox_blocking

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
        "Errno",
        "PreopenSpec",
        "RunResult",
        "WasmSandbox",
        "create_wasm_sandbox",
        "create_wasm_sandbox_blocking",
    ]
