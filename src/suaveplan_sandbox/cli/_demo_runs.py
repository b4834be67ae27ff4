"""Run the example plugins for real: the Python one in the VM host, the WASM one in wasmtime.

Each run works on a scratch copy of the example folder, so `make run` never changes the repo.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from rich.console import Console

from suaveplan_sandbox.adapters import (
    Adapters,
    BeneathRootFs,
    InProcessEventBus,
    SqliteDb,
    apply_migrations,
)
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.metrics import PERMISSION_DENIED, InMemoryMetrics
from suaveplan_sandbox.permissions import PermissionPolicy


async def run_python_example(folder: Path, console: Console) -> int:
    from suaveplan_sandbox.vm import create_vm_sandbox

    with tempfile.TemporaryDirectory(prefix="suaveplan-demo-") as tmp:
        root = Path(tmp) / folder.name
        shutil.copytree(folder, root)
        (root / "reports").mkdir(exist_ok=True)
        policy = PermissionPolicy.from_manifest(root / "manifest.toml", root=root)
        db = SqliteDb(Path(tmp) / "plugin.db", plugin_prefix=policy.table_prefix or "")
        migrations = policy.manifest.database.migrations if policy.manifest.database else None
        if migrations:
            await apply_migrations(db, root / migrations, plugin=policy.plugin)
        events = InProcessEventBus()
        fs = BeneathRootFs(root)
        metrics = InMemoryMetrics()
        adapters = Adapters(fs=fs, db=db, events=events)
        entry = root / (policy.manifest.entry or "plugin.py")
        try:
            async with await create_vm_sandbox(
                plugin_module_path=entry, policy=policy, proxies=adapters, metrics=metrics
            ) as sb:
                active = ", ".join(sb.hardening.active)
                console.print(f"[bold]{policy.plugin}[/]: Python worker hardened with {active}")
                totals = await sb.call("summarize", "march")
                console.print(f"  summarize('march') -> {totals}")
                report = (root / "reports" / "march.txt").read_text().strip().replace("\n", "; ")
                console.print(f"  wrote reports/march.txt: {report}")
                try:
                    await sb.call("try_to_escape")
                except SuaveplanError as exc:
                    console.print(f"  try_to_escape() refused: {exc.code} {exc.details}")
        finally:
            fs.close()
        denied = metrics.value(PERMISSION_DENIED.name)
        console.print(f"  plugin.permission_denied_total = {denied:g}\n")
    return 0


async def run_wasm_example(folder: Path, console: Console) -> int:
    from suaveplan_sandbox.wasm import create_wasm_sandbox

    with tempfile.TemporaryDirectory(prefix="suaveplan-demo-") as tmp:
        root = Path(tmp) / folder.name  # the manifest's folder is the plugin's root
        shutil.copytree(folder, root)
        policy = PermissionPolicy.from_manifest(root / "manifest.toml", root=root)
        module = root / (policy.manifest.entry or "plugin.wasm")
        async with await create_wasm_sandbox(wasm_module_path=module, policy=policy) as sb:
            result = await sb.run(argv=[policy.plugin])
            denials = len(sb.denials)
        console.print(f"[bold]{policy.plugin}[/]: WASI module exited {result.exit_code}")
        for line in result.stdout.decode(errors="replace").splitlines():
            console.print(f"  | {line}")
        written = root / "output" / "result.txt"
        if written.exists():
            console.print(f"  wrote output/result.txt: {written.read_text().strip()}")
        console.print(f"  host-side denials recorded: {denials}\n")
        return 0 if result.exit_code == 0 else 1
