"""`suaveplan-sandbox conformance`: run the three harnesses against a host's factories.

`--host MODULE:OBJECT` names the operator's own code (imported like any plugin *host*, never
guest code). OBJECT may provide `make_checker`, `make_vm_sandbox` and `make_wasm_sandbox`;
a harness whose factory is absent is reported as not provided. Without `--host`, our own
implementations are checked.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from suaveplan_sandbox.testing import (
    PERMISSIONS_SCENARIOS,
    VM_SCENARIOS,
    WASM_SCENARIOS,
    PermissionsFactory,
    make_fixture_checker,
)


@dataclass
class HarnessResult:
    name: str
    provided: bool = True
    passed: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)


FACTORY_NAMES: Final = ("make_checker", "make_vm_sandbox", "make_wasm_sandbox")


def load_host(spec: str | None) -> dict[str, Any]:
    """The factories `spec` (`MODULE:OBJECT`, or None for ours) provides, by name."""
    if spec is None:
        from suaveplan_sandbox.vm import create_vm_sandbox
        from suaveplan_sandbox.wasm import create_wasm_sandbox

        return {
            "make_checker": make_fixture_checker,
            "make_vm_sandbox": create_vm_sandbox,
            "make_wasm_sandbox": create_wasm_sandbox,
        }
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError("--host is MODULE:OBJECT")
    obj = getattr(importlib.import_module(module_name), attr)
    return {
        name: getattr(obj, name) for name in FACTORY_NAMES if callable(getattr(obj, name, None))
    }


def _run_vm_scenario(scenario: Any, make: Any) -> None:
    asyncio.run(scenario(make))


def _steps(host: dict[str, Any]) -> list[tuple[str, str, Callable[[], None]]]:
    steps: list[tuple[str, str, Callable[[], None]]] = []
    if "make_checker" in host:
        factory = PermissionsFactory(host["make_checker"])
        for sc in PERMISSIONS_SCENARIOS:
            steps.append(("permissions", sc.name, functools.partial(sc.run, factory)))
    if "make_vm_sandbox" in host:
        make_vm = host["make_vm_sandbox"]
        for name, vm_sc in VM_SCENARIOS:
            steps.append(("vm", name, functools.partial(_run_vm_scenario, vm_sc, make_vm)))
    if "make_wasm_sandbox" in host:
        make_wasm = host["make_wasm_sandbox"]
        for wsc in WASM_SCENARIOS:
            steps.append(("wasm", wsc.name, functools.partial(wsc.run, make_wasm)))
    return steps


def run_conformance(host: dict[str, Any], console: Console) -> dict[str, HarnessResult]:
    """Run each harness `host` (from `load_host`) has a factory for."""
    results = {name: HarnessResult(name) for name in ("permissions", "vm", "wasm")}
    for name, key in (
        ("permissions", "make_checker"),
        ("vm", "make_vm_sandbox"),
        ("wasm", "make_wasm_sandbox"),
    ):
        results[name].provided = key in host
    steps = _steps(host)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("conformance", total=len(steps))
        for harness, scenario, run in steps:
            progress.update(task, description=f"{harness}: {scenario}")
            try:
                run()
            except Exception as exc:  # a failed scenario is a row, not a crash
                results[harness].failed.append((scenario, f"{type(exc).__name__}: {exc}"))
            else:
                results[harness].passed.append(scenario)
            progress.advance(task)
    table = Table(title="conformance")
    for col in ("harness", "passed", "failed", "failures"):
        table.add_column(col)
    for r in results.values():
        if not r.provided:
            table.add_row(r.name, "-", "-", "factory not provided")
            continue
        failures = "; ".join(f"{n}: {why[:120]}" for n, why in r.failed)
        table.add_row(r.name, str(len(r.passed)), str(len(r.failed)), failures)
    console.print(table)
    return results
