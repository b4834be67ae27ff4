"""A plugin cannot make its own exception look like a sandbox- or host-issued error.

Plugins can construct any `SuaveplanError`. What leaves the worker keeps its code only if the
host sent exactly that error (a denied proxy call, re-sent as the host sent it even if the
plugin edited the object) or the worker runtime's own guard raised it; anything else becomes
`SAND_VM_PLUGIN_ERROR` with `details.claimed_code`. The host additionally re-codes host-only
codes (BUDGET_EXCEEDED, ...) whatever the worker claims.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from suaveplan_sandbox.adapters import Adapters
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.metrics import BUDGET_EXCEEDED, PERMISSION_DENIED, InMemoryMetrics
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.testing import InMemoryFs
from suaveplan_sandbox.vm import create_vm_sandbox

PLUGIN = """
from suaveplan import SuaveplanError, fs


def forge(code):
    raise SuaveplanError(code, "forged", {"capability": "fs", "reason": "path-not-in-allowlist"})


def denied():
    return fs.read_text("/secret/key.txt")


def edit_denial_and_reraise(code):
    try:
        fs.read_text("/secret/key.txt")
    except SuaveplanError as err:
        err.code = code
        err.details["reason"] = "forged-reason"
        raise err


def forge_with_genuine_cause():
    try:
        fs.read_text("/secret/key.txt")
    except SuaveplanError as err:
        raise SuaveplanError("SAND_PERM_DENIED", "forged", {"capability": "db"}, err)


def reraise_guard_error():
    try:
        getattr(fs, "__globals__")
    except SuaveplanError as err:
        raise err


def patch_error_class():
    SuaveplanError.to_wire = lambda self: {"code": "BUDGET_EXCEEDED", "message": "x"}
"""


@pytest.fixture
def plugin(tmp_path: Path) -> tuple[Path, PermissionPolicy]:
    (tmp_path / "plugin.py").write_text(PLUGIN)
    policy = PermissionPolicy.from_manifest(
        {
            "name": "forger",
            "permissions": {"fs": ["./data/*"], "budgets": {"memoryMb": 256}},
        },
        root=tmp_path,
    )
    return tmp_path / "plugin.py", policy


async def _raised(
    plugin: tuple[Path, PermissionPolicy], name: str, *args: object
) -> tuple[SuaveplanError, InMemoryMetrics]:
    metrics = InMemoryMetrics()
    async with await create_vm_sandbox(
        plugin_module_path=plugin[0],
        policy=plugin[1],
        proxies=Adapters(fs=InMemoryFs({"data/ok.txt": b"fine"})),
        metrics=metrics,
    ) as sb:
        with pytest.raises(SuaveplanError) as info:
            await sb.call(name, *args)
        # The sandbox is still usable: a forged error is not a crash.
        with pytest.raises(SuaveplanError) as again:
            await sb.call("forge", "SAND_VM_NAME_UNAVAILABLE")
        assert again.value.details.get("claimed_code") == "SAND_VM_NAME_UNAVAILABLE"
    return info.value, metrics


@pytest.mark.parametrize(
    "code",
    [
        "BUDGET_EXCEEDED",
        "SAND_VM_WORKER_CRASHED",
        "SAND_VM_DISPOSED",
        "SAND_PERM_DENIED",
        "SAND_VM_ATTRIBUTE_FORBIDDEN",
        "SAND_VM_EVAL_REJECTED",
    ],
)
async def test_a_forged_code_becomes_the_plugins_own_error(
    plugin: tuple[Path, PermissionPolicy], code: str
) -> None:
    err, metrics = await _raised(plugin, "forge", code)
    assert err.code == "SAND_VM_PLUGIN_ERROR"
    assert err.details == {"type": "SuaveplanError", "claimed_code": code}
    assert metrics.value(BUDGET_EXCEEDED.name) == 0
    assert metrics.value(PERMISSION_DENIED.name) == 0


async def test_a_genuine_denial_reaches_the_host_with_its_code(
    plugin: tuple[Path, PermissionPolicy],
) -> None:
    err, metrics = await _raised(plugin, "denied")
    assert err.code == "SAND_PERM_DENIED"
    assert err.details == {"capability": "fs", "reason": "path-not-in-allowlist"}
    assert metrics.value(PERMISSION_DENIED.name) == 1


@pytest.mark.parametrize("code", ["BUDGET_EXCEEDED", "SAND_VM_PLUGIN_ERROR", "SAND_PERM_DENIED"])
async def test_editing_a_genuine_denial_before_reraising_it_changes_nothing(
    plugin: tuple[Path, PermissionPolicy], code: str
) -> None:
    err, _ = await _raised(plugin, "edit_denial_and_reraise", code)
    assert err.code == "SAND_PERM_DENIED"
    assert err.details == {"capability": "fs", "reason": "path-not-in-allowlist"}


async def test_a_forged_error_cannot_borrow_a_genuine_one_as_its_cause(
    plugin: tuple[Path, PermissionPolicy],
) -> None:
    err, _ = await _raised(plugin, "forge_with_genuine_cause")
    assert err.code == "SAND_VM_PLUGIN_ERROR"
    assert err.details["claimed_code"] == "SAND_PERM_DENIED"
    assert err.cause is None


async def test_a_reraised_guard_error_keeps_its_code(
    plugin: tuple[Path, PermissionPolicy],
) -> None:
    err, _ = await _raised(plugin, "reraise_guard_error")
    assert err.code == "SAND_VM_ATTRIBUTE_FORBIDDEN"


async def test_the_error_class_the_worker_serialises_with_cannot_be_patched(
    plugin: tuple[Path, PermissionPolicy],
) -> None:
    err, _ = await _raised(plugin, "patch_error_class")
    assert err.code == "SAND_VM_PLUGIN_ERROR"
    assert err.details["type"] == "TypeError"
    assert "immutable" in str(err.details["message"])
