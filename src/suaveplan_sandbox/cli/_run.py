"""`suaveplan-sandbox run`: run one plugin function (Python) or export / command (WASM).

The plugin gets the host's real default adapters for the manifest: files beneath the
manifest's folder (`--root` to change), nothing else unless the host wires more. `--trace`
prints every capability decision as the gateway makes it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from suaveplan_sandbox.adapters import AuditRecord, BeneathRootFs
from suaveplan_sandbox.adapters._protocols import Adapters
from suaveplan_sandbox.permissions import PermissionPolicy


class TraceAudit:
    """An audit sink that echoes each decision to stderr as it happens."""

    def __init__(self, *, as_json: bool) -> None:
        self._json = as_json

    def record(self, entry: AuditRecord) -> None:
        if self._json:
            click.echo(
                json.dumps(
                    {
                        "trace": {
                            "capability": entry.capability,
                            "operation": entry.operation,
                            "allowed": entry.allowed,
                            "reason": entry.reason,
                            "rule": entry.rule,
                            "outcome": entry.outcome,
                        }
                    }
                ),
                err=True,
            )
            return
        verdict = "allow" if entry.allowed else "deny "
        why = entry.rule if entry.allowed else entry.reason
        click.echo(f"trace {verdict} {entry.capability}.{entry.operation} ({why})", err=True)


async def run_plugin(
    plugin: Path,
    manifest: Path,
    *,
    root: Path | None,
    call: str | None,
    args: list[Any],
    argv: list[str],
    trace: bool,
    as_json: bool,
) -> Any:
    policy = PermissionPolicy.from_manifest(manifest, root=root or manifest.parent)
    audit = TraceAudit(as_json=as_json) if trace else None
    if plugin.suffix == ".wasm":
        from suaveplan_sandbox.wasm import create_wasm_sandbox

        async with await create_wasm_sandbox(
            wasm_module_path=plugin, policy=policy, audit=audit
        ) as wsb:
            if call is None:
                result = await wsb.run(argv=[policy.plugin, *argv])
                return {
                    "exit_code": result.exit_code,
                    "stdout": result.stdout.decode(errors="replace"),
                    "stderr": result.stderr.decode(errors="replace"),
                }
            return await wsb.call(call, *args)
    from suaveplan_sandbox.vm import create_vm_sandbox

    if call is None:
        raise click.UsageError("Python plugins need --call NAME")
    fs = BeneathRootFs(policy.root)
    try:
        async with await create_vm_sandbox(
            plugin_module_path=plugin, policy=policy, proxies=Adapters(fs=fs), audit=audit
        ) as sb:
            return await sb.call(call, *args)
    finally:
        fs.close()
