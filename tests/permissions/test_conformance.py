"""Our own checker passes the exported permissions conformance harness."""

from __future__ import annotations

from typing import Any

import pytest

from suaveplan_sandbox.metrics import InMemoryMetrics
from suaveplan_sandbox.permissions import Allow, Deny
from suaveplan_sandbox.testing import (
    PERMISSIONS_SCENARIOS,
    PermissionsFactory,
    Scenario,
    make_fixture_checker,
    run_permissions_conformance,
)


def test_in_package_fixture_passes_run_permissions_conformance() -> None:
    assert run_permissions_conformance("self", make_fixture_checker) == len(PERMISSIONS_SCENARIOS)


@pytest.mark.parametrize("scenario", PERMISSIONS_SCENARIOS, ids=lambda s: s.name)
def test_scenario(scenario: Scenario[PermissionsFactory]) -> None:
    scenario.run(PermissionsFactory(make_fixture_checker))


class _AllowEverything:
    def check_fs(self, path: object, mode: object = "read") -> Allow | Deny:
        return Allow()

    def check_fetch(self, url: object) -> Allow | Deny:
        return Allow()

    def check_capability(self, capability_id: object, payload: object) -> Allow | Deny:
        return Allow()


def test_harness_names_each_failed_scenario_for_a_broken_checker() -> None:
    def make(manifest: Any, metrics: InMemoryMetrics) -> _AllowEverything:
        return _AllowEverything()

    with pytest.raises(AssertionError) as info:
        run_permissions_conformance("broken", make)
    text = str(info.value)
    assert "[broken]" in text
    assert "fs denial emits metric with reason" in text
    assert "secrets denies undeclared name" in text
    # Budget scenarios use our tracker and still pass.
    assert "wall clock breach" not in text
