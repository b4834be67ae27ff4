"""Escape corpus: each plugin under `plugins/` tries one technique inside a real VM sandbox.

Every case must end contained: a `SuaveplanError` coded `SAND_*` or `BUDGET_EXCEEDED`
(at create or at call), or a harmless return value; and the canaries must hold: a secret
file outside the policy root, a secret host environment variable, and a path the plugin
must not create; and no plugin may print the escape marker, which the ones that reach
forbidden objects print before touching the OS.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.vm import create_vm_sandbox

PLUGINS = Path(__file__).parent / "plugins"
CASES = sorted(p for p in PLUGINS.glob("*.py") if not p.name.startswith("_"))
ENV_NAME = "SUAVEPLAN_ESCAPE_CANARY"
# A plugin that reaches something it must not (e.g. the real builtins) prints this marker.
ESCAPE_MARKER = "SANDBOX-" + "ESCAPED"


def test_corpus_is_not_empty() -> None:
    assert len(CASES) >= 40


def _contained_code(code: str) -> bool:
    return code.startswith("SAND_") or code == "BUDGET_EXCEEDED"


@pytest.mark.parametrize("plugin", CASES, ids=[p.stem for p in CASES])
async def test_escape_is_contained(
    plugin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    file_secret = "FILECANARY-" + secrets.token_hex(8)
    env_secret = "ENVCANARY-" + secrets.token_hex(8)
    secret_file = tmp_path / "outside" / "secret.txt"
    secret_file.parent.mkdir()
    secret_file.write_text(file_secret)
    forbidden = tmp_path / "outside" / "pwned"
    monkeypatch.setenv(ENV_NAME, env_secret)

    root = tmp_path / "root"
    (root / "data").mkdir(parents=True)
    (root / "data" / "ok.txt").write_text("fine")
    target = root / "plugin.py"
    target.write_text(plugin.read_text())
    manifest: dict[str, object] = {
        "name": "escape",
        "version": "1.0.0",
        "permissions": {
            "fs": ["./data/*"],
            "budgets": {"wallClockMs": 2000, "memoryMb": 256},
        },
    }
    policy = PermissionPolicy.from_manifest(manifest, root=root)

    outcome: list[str] = []
    try:
        sb = await create_vm_sandbox(plugin_module_path=str(target), policy=policy)
    except SuaveplanError as err:
        assert _contained_code(err.code), (err.code, err.message)
        outcome.append(repr((err.code, err.message, err.details)))
    else:
        try:
            try:
                result = await sb.call("attack", str(secret_file), str(forbidden))
            except SuaveplanError as err:
                assert _contained_code(err.code), (err.code, err.message, err.details)
                outcome.append(repr((err.code, err.message, err.details)))
            else:
                outcome.append(repr(result))
            outcome.extend(repr(entry) for entry in sb.logs)
            outcome.extend(repr(deny) for deny in sb.denials)
        finally:
            await sb.dispose()

    text = "\n".join(outcome)
    assert file_secret not in text
    assert env_secret not in text
    assert ESCAPE_MARKER not in text
    assert not forbidden.exists()
