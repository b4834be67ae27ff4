"""`make run`: for every example, show what its manifest allows and refuses, and why.

Each plugin example folder holds `manifest.toml` and `requests.json` — a list of
`{"capability", "payload"}` requests a plugin might make; the demo prints each decision, the
reason and the matching rule, so a newcomer sees the permission model at work, then runs the
plugin. A host example (`app.py`, no manifest) is started on loopback and sent the `/run`
bodies in its `requests.json`.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.metrics import PERMISSION_DENIED, InMemoryMetrics
from suaveplan_sandbox.permissions import Allow, PermissionChecker, PermissionPolicy


def _describe(capability: str, payload: dict[str, object]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in payload.items()) or capability


def demo_decisions(examples: Path) -> dict[str, list[dict[str, object]]]:
    """`demo --json`: each example's requests with their decisions (no plugin is run)."""
    out: dict[str, list[dict[str, object]]] = {}
    for manifest in sorted(examples.glob("*/manifest.toml")):
        folder = manifest.parent
        checker = PermissionChecker(PermissionPolicy.from_manifest(manifest, root=folder))
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
        out[folder.name] = rows
    return out


def run_example(folder: Path, console: Console) -> int:
    manifest = folder / "manifest.toml"
    requests_file = folder / "requests.json"
    policy = PermissionPolicy.from_manifest(manifest, root=folder)
    metrics = InMemoryMetrics()
    checker = PermissionChecker(policy, metrics=metrics)
    table = Table(title=f"{folder.name}: {policy.plugin} under {manifest.name}")
    for col in ("capability", "request", "decision", "reason / rule"):
        table.add_column(col)
    requests = json.loads(requests_file.read_text()) if requests_file.exists() else []
    for item in requests:
        capability, payload = item["capability"], item["payload"]
        decision = checker.check_capability(capability, payload)
        if isinstance(decision, Allow):
            table.add_row(capability, _describe(capability, payload), "[green]allow", decision.rule)
        else:
            table.add_row(
                capability, _describe(capability, payload), "[red]deny", decision.reason.value
            )
    console.print(table)
    denied = metrics.value(PERMISSION_DENIED.name)
    console.print(f"plugin.permission_denied_total for {policy.plugin}: {denied:g}\n")
    from suaveplan_sandbox.cli._demo_runs import run_python_example, run_wasm_example

    if policy.manifest.kind == "python":
        return asyncio.run(run_python_example(folder, console))
    if policy.manifest.kind == "wasm":
        return asyncio.run(run_wasm_example(folder, console))
    return 0


def run_demo(examples: Path) -> int:
    console = Console(soft_wrap=True)  # long result lines stay whole (tables still fit)
    status = 0
    folders = sorted(p.parent for p in examples.glob("*/manifest.toml"))
    if not folders:
        console.print(f"no examples with a manifest.toml under {examples}")
        return 2
    for folder in folders:
        try:
            status |= run_example(folder, console)
        except SuaveplanError as exc:
            console.print(f"[red]{folder.name}: {exc.code}: {exc.message}")
            status = 2
    from suaveplan_sandbox.cli._demo_runs import run_asgi_example

    # Host examples: an `app.py` serving plugins, with the requests to post in `requests.json`.
    for app in sorted(examples.glob("*/app.py")):
        if (app.parent / "requests.json").exists():
            status |= run_asgi_example(app.parent, console)
    return status
