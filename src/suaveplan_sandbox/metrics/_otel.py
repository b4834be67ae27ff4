"""A sink on an OpenTelemetry `Meter` (install the `otel` extra)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, final

from suaveplan_sandbox.metrics._definitions import METRICS
from suaveplan_sandbox.metrics._sink import definition_for


@final
class OpenTelemetryMetrics:
    """One OTel counter per registered metric on `meter` (the global meter provider if None)."""

    def __init__(self, meter: Any | None = None) -> None:
        try:
            from opentelemetry import metrics as otel_metrics
        except ImportError as exc:  # pragma: no cover - exercised only without the extra
            from suaveplan_sandbox.errors import SuaveplanError

            raise SuaveplanError(
                "SAND_INVALID_ARGUMENT",
                "OpenTelemetry is not installed: pip install 'suaveplan-sandbox[otel]'",
                cause=exc,
            ) from exc
        self._meter = meter if meter is not None else otel_metrics.get_meter("suaveplan_sandbox")
        self._counters: dict[str, Any] = {
            d.name: self._meter.create_counter(d.name, description=d.description) for d in METRICS
        }

    def inc(self, name: str, labels: Mapping[str, str], amount: float = 1.0) -> None:
        definition = definition_for(name, labels)
        self._counters[definition.name].add(amount, attributes=dict(labels))
