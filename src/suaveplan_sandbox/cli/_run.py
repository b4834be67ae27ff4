"""`suaveplan-sandbox run`: run one plugin function (Python) or export / command (WASM).

The plugin gets the host's standard adapters for its manifest (`open_standard_adapters`): files
beneath the manifest's folder (`--root` to change; WASM sees them as preopens), outbound HTTP
through `HttpxFetch` (private addresses refused), SQLite in `--data-dir DIR` (default a
temporary one) with the manifest's migrations applied, an in-process event bus, and only the
secrets named with `--secret NAME`, read from the environment variable of the same name (never
from the command line). `--trace` prints every capability decision as the gateway makes it.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import click

from suaveplan_sandbox._printable import printable
from suaveplan_sandbox.adapters import Adapters, AuditRecord, AuditSink, open_standard_adapters
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import PermissionPolicy

ACCEPTED_PLUGIN_KINDS = (".py file", "package folder with __init__.py", ".wasm module")


def plugin_kind(plugin: Path) -> str:
    """`python` or `wasm`; anything else is `SAND_INVALID_ARGUMENT` naming the accepted kinds."""
    if plugin.is_file() and plugin.suffix == ".wasm":
        return "wasm"
    if (plugin.is_file() and plugin.suffix == ".py") or (plugin / "__init__.py").is_file():
        return "python"
    what = "folder without __init__.py" if plugin.is_dir() else f"{plugin.suffix or 'no'} suffix"
    raise SuaveplanError(
        "SAND_INVALID_ARGUMENT",
        f"cannot run {plugin} ({what}): a plugin is a .py file, a package folder with "
        "__init__.py or a .wasm module",
        {"plugin": str(plugin), "accepted": list(ACCEPTED_PLUGIN_KINDS)},
    )


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
        line = f"trace {verdict} {entry.capability}.{entry.operation} ({why})"
        click.echo(printable(line), err=True)


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
    data_dir: Path | None = None,
    secret_names: tuple[str, ...] = (),
    environ: Mapping[str, str] | None = None,
) -> Any:
    kind = plugin_kind(plugin)
    if kind == "python" and call is None:
        raise click.UsageError("Python plugins need --call NAME")
    policy = PermissionPolicy.from_manifest(manifest, root=root or manifest.parent)
    audit: AuditSink | None = TraceAudit(as_json=as_json) if trace else None
    env = os.environ if environ is None else environ
    missing = [name for name in secret_names if name not in env]
    if missing:
        raise click.UsageError(f"--secret {missing[0]}: no environment variable of that name")
    async with AsyncExitStack() as stack:
        if data_dir is None and policy.table_prefix:
            data_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="suaveplan-")))
        standard = await stack.enter_async_context(
            await open_standard_adapters(
                policy,
                data_dir=data_dir,
                secrets={name: env[name] for name in secret_names},
            )
        )
        adapters = standard.adapters
        audit = audit if audit is not None else standard.audit
        if kind == "wasm":
            from suaveplan_sandbox.wasm import create_wasm_sandbox

            wasm_adapters = Adapters(
                fetch=adapters.fetch,
                db=adapters.db,
                secrets=adapters.secrets,
                events=adapters.events,
            )
            wsb = await stack.enter_async_context(
                await create_wasm_sandbox(
                    wasm_module_path=plugin, policy=policy, proxies=wasm_adapters, audit=audit
                )
            )
            if call is None:
                result = await wsb.run(argv=[policy.plugin, *argv])
                return {
                    "exit_code": result.exit_code,
                    "stdout": result.stdout.decode(errors="replace"),
                    "stderr": result.stderr.decode(errors="replace"),
                }
            return await wsb.call(call, *args)
        from suaveplan_sandbox.vm import create_vm_sandbox

        assert call is not None  # checked above, before any adapter was opened
        sb = await stack.enter_async_context(
            await create_vm_sandbox(
                plugin_module_path=plugin, policy=policy, proxies=adapters, audit=audit
            )
        )
        return await sb.call(call, *args)
