"""`suaveplan-sandbox run`: run one plugin function (Python) or export / command (WASM).

The plugin gets the host's real adapters for its manifest: files beneath the manifest's folder
(`--root` to change; WASM sees them as preopens), outbound HTTP through `HttpxFetch` (private
addresses refused), a SQLite database for its table prefix (`--db FILE`, default a temporary
one, with the manifest's migrations applied), an in-process event bus, and the secrets named
with `--secret NAME`, read from the environment variable of the same name (never from the
command line). `--trace` prints every capability decision as the gateway makes it.
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

from suaveplan_sandbox.adapters import (
    Adapters,
    AuditRecord,
    BeneathRootFs,
    HttpxFetch,
    InProcessEventBus,
    SqliteDb,
    StaticSecrets,
    apply_migrations,
)
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
    db_path: Path | None = None,
    secret_names: tuple[str, ...] = (),
    environ: Mapping[str, str] | None = None,
) -> Any:
    policy = PermissionPolicy.from_manifest(manifest, root=root or manifest.parent)
    audit = TraceAudit(as_json=as_json) if trace else None
    env = os.environ if environ is None else environ
    missing = [name for name in secret_names if name not in env]
    if missing:
        raise click.UsageError(f"--secret {missing[0]}: no environment variable of that name")
    async with AsyncExitStack() as stack:
        adapters = await _adapters(
            policy,
            manifest,
            db_path=db_path,
            secret_names=secret_names,
            env=env,
            stack=stack,
        )
        if plugin.suffix == ".wasm":
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

        if call is None:
            raise click.UsageError("Python plugins need --call NAME")
        sb = await stack.enter_async_context(
            await create_vm_sandbox(
                plugin_module_path=plugin, policy=policy, proxies=adapters, audit=audit
            )
        )
        return await sb.call(call, *args)


async def _adapters(
    policy: PermissionPolicy,
    manifest: Path,
    *,
    db_path: Path | None,
    secret_names: tuple[str, ...],
    env: Mapping[str, str],
    stack: AsyncExitStack,
) -> Adapters:
    """The real adapters `run` wires; everything is closed when `stack` unwinds."""
    fs = BeneathRootFs(policy.root)
    stack.callback(fs.close)
    fetch = HttpxFetch()
    stack.push_async_callback(fetch.aclose)
    db: SqliteDb | None = None
    prefix = policy.table_prefix
    if prefix:
        if db_path is None:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="suaveplan-run-"))
            db_path = Path(tmp) / "plugin.db"
        db = SqliteDb(db_path, plugin_prefix=prefix)
        stack.callback(db.close)
        database = policy.manifest.database
        if database is not None and database.migrations:
            await apply_migrations(db, manifest.parent / database.migrations, plugin=policy.plugin)
    secrets = StaticSecrets({name: env[name] for name in secret_names})
    return Adapters(fs=fs, fetch=fetch, db=db, secrets=secrets, events=InProcessEventBus())
