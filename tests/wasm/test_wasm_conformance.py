"""Our own sandbox passes the WASM conformance harness, scenario by scenario and as a whole."""

from __future__ import annotations

import pytest

from suaveplan_sandbox.testing._scenarios import Scenario
from suaveplan_sandbox.testing._wasm_conformance import (
    WASM_SCENARIOS,
    MakeSandbox,
    run_wasm_sandbox_conformance,
)
from suaveplan_sandbox.wasm import create_wasm_sandbox


@pytest.mark.parametrize("scenario", WASM_SCENARIOS, ids=lambda s: s.name)
def test_scenario(scenario: Scenario[MakeSandbox]) -> None:
    scenario.run(create_wasm_sandbox)


def test_in_package_fixture_passes_run_wasm_sandbox_conformance() -> None:
    assert run_wasm_sandbox_conformance("self", create_wasm_sandbox) == len(WASM_SCENARIOS)


def test_harness_names_the_failed_scenario() -> None:
    async def broken(**kwargs: object) -> object:
        raise RuntimeError("no sandbox")

    with pytest.raises(AssertionError, match="dispose is idempotent"):
        run_wasm_sandbox_conformance("broken", broken)
