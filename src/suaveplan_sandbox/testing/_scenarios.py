"""A tiny scenario runner shared by the conformance harnesses (works with or without pytest)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar, final

F = TypeVar("F")


@final
@dataclass(frozen=True, slots=True)
class Scenario(Generic[F]):
    """One named behaviour the harness checks against a factory of type `F`."""

    name: str
    check: Callable[[F], None]

    def run(self, factory: F) -> None:
        self.check(factory)


def run_scenarios(label: str, scenarios: Sequence[Scenario[F]], factory: F) -> int:
    """Run every scenario; raise one `AssertionError` naming each failed one. Returns the count."""
    failures: list[str] = []
    for scenario in scenarios:
        try:
            scenario.run(factory)
        except Exception as exc:  # report every failure, not just the first
            failures.append(f"{scenario.name}: {type(exc).__name__}: {exc}")
    if failures:
        listing = "\n  ".join(failures)
        raise AssertionError(
            f"[{label}] {len(failures)} of {len(scenarios)} scenarios failed:\n  {listing}"
        )
    return len(scenarios)
