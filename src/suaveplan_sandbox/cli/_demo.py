"""`make run`: for every example, show what its manifest allows and refuses, and why.

Each plugin example folder holds `manifest.toml` and `requests.json` — a list of
`{"capability", "payload"}` requests a plugin might make; the demo prints each decision, the
reason and the matching rule, so a newcomer sees the permission model at work, then runs the
plugin. A host example (`app.py`, no manifest) is started on loopback and sent the `/run`
bodies in its `requests.json`. `demo --json` prints the same as one document: per example, the
decisions and what the run did (results, refusals with code and reason, files written).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import cast

import click
from rich.console import Console
from rich.table import Table

from suaveplan_sandbox._printable import printable
from suaveplan_sandbox.cli._demo_runs import (
    Record,
    refusal,
    run_asgi_example,
    run_python_example,
    run_wasm_example,
)
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.metrics import PERMISSION_DENIED, InMemoryMetrics
from suaveplan_sandbox.permissions import Allow, PermissionChecker, PermissionPolicy


def _describe(capability: str, payload: dict[str, object]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in payload.items()) or capability


def _decisions(folder: Path, checker: PermissionChecker) -> list[dict[str, object]]:
    """The example's `requests.json`, each with its decision and the rule or reason."""
    requests_file = folder / "requests.json"
    rows: list[dict[str, object]] = []
    for item in json.loads(requests_file.read_text()) if requests_file.exists() else []:
        decision = checker.check_capability(item["capability"], item["payload"])
        row: dict[str, object] = {"capability": item["capability"], "payload": item["payload"]}
        if isinstance(decision, Allow):
            row.update(decision="allow", rule=decision.rule)
        else:
            row.update(decision="deny", reason=decision.reason.value)
        rows.append(row)
    return rows


def run_example(folder: Path, console: Console) -> tuple[int, Record]:
    """Print the decision table, then run the plugin; returns its status and record."""
    manifest = folder / "manifest.toml"
    policy = PermissionPolicy.from_manifest(manifest, root=folder)
    metrics = InMemoryMetrics()
    rows = _decisions(folder, PermissionChecker(policy, metrics=metrics))
    table = Table(title=f"{folder.name}: {policy.plugin} under {manifest.name}")
    for col in ("capability", "request", "decision", "reason / rule"):
        table.add_column(col)
    for row in rows:
        capability, payload = str(row["capability"]), cast(dict[str, object], row["payload"])
        verdict = "[green]allow" if row["decision"] == "allow" else "[red]deny"
        why = str(row.get("rule") if row["decision"] == "allow" else row.get("reason"))
        table.add_row(capability, _describe(capability, payload), verdict, why)
    console.print(table)
    denied = metrics.value(PERMISSION_DENIED.name)
    console.print(f"plugin.permission_denied_total after checking these requests: {denied:g}\n")
    record: Record = {
        "plugin": policy.plugin,
        "kind": policy.manifest.kind,
        "decisions": rows,
        "decisions_denied_total": denied,
    }
    status = 0
    if policy.manifest.kind == "python":
        status, record["run"] = asyncio.run(run_python_example(folder, console))
    elif policy.manifest.kind == "wasm":
        status, record["run"] = asyncio.run(run_wasm_example(folder, console))
    return status, record


def demo_report(examples: Path, console: Console) -> tuple[int, dict[str, Record]]:
    """Run every example; returns the combined status and one record per example folder.

    A plugin example's record holds its `decisions` (the table) and its `run` (what each
    call returned or why it was refused); a host example's holds the requests it was sent.
    """
    status = 0
    records: dict[str, Record] = {}
    folders = sorted(p.parent for p in examples.glob("*/manifest.toml"))
    for folder in folders:
        try:
            code, records[folder.name] = run_example(folder, console)
            status |= code
        except SuaveplanError as exc:
            line = printable(f"{folder.name}: {exc.code}: {exc.message}")
            console.print(line, style="red", markup=False)
            records[folder.name] = {"error": refusal(exc)}
            status = 2
    # Host examples: an `app.py` serving plugins, with the requests to post in `requests.json`.
    for app in sorted(examples.glob("*/app.py")):
        if (app.parent / "requests.json").exists():
            code, records[app.parent.name] = run_asgi_example(app.parent, console)
            status |= code
    return status, records


def run_demo(examples: Path, *, as_json: bool = False) -> int:
    """`make run` / `demo`: tables and runs for people, or (`as_json`) one JSON document."""
    # Long result lines stay whole (tables still fit); in JSON mode the console says nothing.
    console = Console(soft_wrap=True, quiet=as_json)
    if not any(examples.glob("*/manifest.toml")):
        message = f"no examples with a manifest.toml under {examples}"
        if as_json:
            click.echo(json.dumps({"error": {"code": "SAND_INVALID_ARGUMENT", "message": message}}))
        else:
            console.print(message)
        return 2
    status, records = demo_report(examples, console)
    if as_json:
        click.echo(json.dumps({"status": status, "examples": records}, sort_keys=True))
    return status
