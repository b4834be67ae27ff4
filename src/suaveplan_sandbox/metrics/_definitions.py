"""The metrics this library emits. `docs/reference/metrics.md` is generated from this table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, final


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class MetricDefinition:
    name: str
    labels: tuple[str, ...]
    description: str

    @property
    def prometheus_name(self) -> str:
        return self.name.replace(".", "_")


PERMISSION_DENIED: Final = MetricDefinition(
    name="plugin.permission_denied_total",
    labels=("plugin", "capability", "reason"),
    description="Capability requests denied by the permission checker.",
)
BUDGET_EXCEEDED: Final = MetricDefinition(
    name="plugin.budget_exceeded_total",
    labels=("plugin", "budget"),
    description="Budget breaches (one per dimension per guest run); the guest is ended.",
)
CAPABILITY_CALLS: Final = MetricDefinition(
    name="plugin.capability_calls_total",
    labels=("plugin", "capability", "outcome"),
    description="Capability requests that reached the gateway, by outcome (allow, deny, error).",
)
WORKER_CRASHED: Final = MetricDefinition(
    name="plugin.worker_crashed_total",
    labels=("plugin", "cause"),
    description="Guest workers that died or broke protocol.",
)

EVENTS_DROPPED: Final = MetricDefinition(
    name="plugin.events_dropped_total",
    labels=("plugin", "reason"),
    description=(
        "Event deliveries dropped: by a VM sandbox past the hop depth (event-depth) or with its"
        " queue full (event-queue-full); by a Redis subscription for a message that is not a"
        " well-formed event (event-malformed)."
    ),
)
LOG_LINES_SUPPRESSED: Final = MetricDefinition(
    name="plugin.log_lines_suppressed_total",
    labels=("plugin",),
    description="Plugin log lines kept from the host's logging by the per-sandbox rate.",
)
AUDIT_DENIALS_SUPPRESSED: Final = MetricDefinition(
    name="plugin.audit_denials_suppressed_total",
    labels=("plugin", "capability"),
    description=(
        "Denials the audit log folded into summary lines (their `suppressed` counts) over the"
        " per-plugin rate."
    ),
)

METRICS: Final[tuple[MetricDefinition, ...]] = (
    PERMISSION_DENIED,
    BUDGET_EXCEEDED,
    CAPABILITY_CALLS,
    WORKER_CRASHED,
    EVENTS_DROPPED,
    LOG_LINES_SUPPRESSED,
    AUDIT_DENIALS_SUPPRESSED,
)
METRICS_BY_NAME: Final = {m.name: m for m in METRICS}
