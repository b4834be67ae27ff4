"""Test support for hosts: `FakeClock`, in-memory adapters, and the conformance harnesses."""

from suaveplan_sandbox.testing._clock import FakeClock
from suaveplan_sandbox.testing._fakes import (
    DictSecrets,
    FakeDb,
    FakeFetch,
    InMemoryEvents,
    InMemoryFs,
    RecordingAudit,
)
from suaveplan_sandbox.testing._permissions_conformance import (
    PERMISSIONS_SCENARIOS,
    PermissionsFactory,
    make_fixture_checker,
    run_permissions_conformance,
)
from suaveplan_sandbox.testing._scenarios import Scenario, run_scenarios
from suaveplan_sandbox.testing._vm_conformance import VM_SCENARIOS, run_vm_sandbox_conformance
from suaveplan_sandbox.testing._wasm_conformance import (
    WASM_SCENARIOS,
    run_wasm_sandbox_conformance,
)

__all__ = [
    "PERMISSIONS_SCENARIOS",
    "VM_SCENARIOS",
    "WASM_SCENARIOS",
    "DictSecrets",
    "FakeClock",
    "FakeDb",
    "FakeFetch",
    "InMemoryEvents",
    "InMemoryFs",
    "PermissionsFactory",
    "RecordingAudit",
    "Scenario",
    "make_fixture_checker",
    "run_permissions_conformance",
    "run_scenarios",
    "run_vm_sandbox_conformance",
    "run_wasm_sandbox_conformance",
]
