"""The api-sandbox-vm scenarios, each its own test, through a real hardened worker."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from suaveplan_sandbox.testing._vm_conformance import (
    VM_SCENARIOS,
    Scenario,
    run_vm_sandbox_conformance,
)
from suaveplan_sandbox.vm import create_vm_sandbox

SCENARIOS = dict(VM_SCENARIOS)


def run(name: str) -> None:
    scenario: Scenario = SCENARIOS[name]
    asyncio.run(scenario(create_vm_sandbox))


def test_process_global_is_unreachable() -> None:
    run("process global is unreachable")


def test_builtins_are_frozen() -> None:
    run("builtins are frozen")


def test_direct_eval_is_rejected() -> None:
    run("direct eval is rejected")


def test_indirect_eval_is_rejected() -> None:
    run("indirect eval is rejected")


def test_allowed_fs_read_reaches_the_adapter_exactly_once() -> None:
    run("allowed fs read reaches the adapter once")


def test_denied_fetch_never_reaches_the_adapter_and_counts_a_denial() -> None:
    run("denied fetch never reaches the adapter")


def test_import_os_is_rejected_at_create() -> None:
    run("built-in module import is rejected at create")


def test_dispose_twice_is_a_noop_and_cancels_in_flight_adapter_calls() -> None:
    run("dispose twice is a no-op")


def test_events_reach_subscribers_only_as_declared() -> None:
    run("events reach subscribers only as declared")


def test_in_package_sandbox_passes_the_conformance_harness() -> None:
    run_vm_sandbox_conformance("self", create_vm_sandbox)


def test_harness_names_the_failed_scenario() -> None:
    async def broken(**kwargs: Any) -> Any:
        raise AssertionError("no sandbox")

    with pytest.raises(AssertionError, match="process global is unreachable"):
        run_vm_sandbox_conformance("broken", broken)
