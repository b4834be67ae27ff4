"""A writable WASI preopen cannot be held to the fs adapter's disk quota (its writes go
through WASI, never through the adapter), so a host that set one gets a refusal, not a
quota that silently does not apply."""

from __future__ import annotations

from pathlib import Path

import pytest

from suaveplan_sandbox.adapters import Adapters, BeneathRootFs
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.metrics import InMemoryMetrics
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.wasm import create_wasm_sandbox

FSPROBE = Path(__file__).parent / "fixtures" / "fsprobe.wasm"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "uploads").mkdir(parents=True)
    (root / "uploads" / "a.txt").write_text("a")
    return root


def _policy(root: Path, *rules: str) -> PermissionPolicy:
    return PermissionPolicy.from_manifest(
        {"name": "guest", "permissions": {"fs": list(rules)}}, root=root
    )


async def test_a_writable_preopen_under_a_quota_is_refused_at_creation(root: Path) -> None:
    fs = BeneathRootFs(root, max_root_bytes=4096)
    metrics = InMemoryMetrics()
    try:
        with pytest.raises(SuaveplanError) as info:
            await create_wasm_sandbox(
                wasm_module_path=FSPROBE,
                policy=_policy(root, "./uploads/*", "rw:./uploads/*"),
                proxies=Adapters(fs=fs),
                metrics=metrics,
            )
    finally:
        fs.close()
    assert info.value.code == "SAND_WASM_PREOPEN_DENIED"
    assert info.value.details == {
        "capability": "fs",
        "reason": "quota-unenforceable",
        "guest_path": "/uploads",
    }
    # A host configuration the manifest cannot satisfy, not a plugin's denied request.
    assert metrics.value("plugin.permission_denied_total") == 0


async def test_read_only_preopens_under_a_quota_and_writable_ones_without_one_run(
    root: Path,
) -> None:
    quota = BeneathRootFs(root, max_root_bytes=4096)
    plain = BeneathRootFs(root)
    try:
        async with await create_wasm_sandbox(
            wasm_module_path=FSPROBE,
            policy=_policy(root, "./uploads/*"),
            proxies=Adapters(fs=quota),
        ) as sb:
            res = await sb.run(argv=["fsprobe", "read", "/uploads/a.txt"])
            assert (res.exit_code, res.stdout) == (0, b"ok a\n")
            wrote = await sb.run(argv=["fsprobe", "write", "/uploads/new.txt", "hi"])
            assert wrote.exit_code == 1  # read-only preopen: WASI refuses the write
        async with await create_wasm_sandbox(
            wasm_module_path=FSPROBE,
            policy=_policy(root, "rw:./uploads/*"),
            proxies=Adapters(fs=plain),
        ) as sb:
            wrote = await sb.run(argv=["fsprobe", "write", "/uploads/new.txt", "hi"])
            assert wrote.exit_code == 0
    finally:
        quota.close()
        plain.close()
    assert (root / "uploads" / "new.txt").read_text() == "hi"
