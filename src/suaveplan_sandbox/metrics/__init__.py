"""Counters for denials, budget breaches and crashes, with in-memory, Prometheus and OTel sinks."""

from suaveplan_sandbox.metrics._definitions import (
    AUDIT_DENIALS_SUPPRESSED,
    BUDGET_EXCEEDED,
    CAPABILITY_CALLS,
    EVENTS_DROPPED,
    LOG_LINES_SUPPRESSED,
    METRICS,
    PERMISSION_DENIED,
    WORKER_CRASHED,
    MetricDefinition,
)
from suaveplan_sandbox.metrics._otel import OpenTelemetryMetrics
from suaveplan_sandbox.metrics._prometheus import PrometheusMetrics
from suaveplan_sandbox.metrics._sink import FanOutMetrics, InMemoryMetrics, MetricsSink

__all__ = [
    "AUDIT_DENIALS_SUPPRESSED",
    "BUDGET_EXCEEDED",
    "CAPABILITY_CALLS",
    "EVENTS_DROPPED",
    "LOG_LINES_SUPPRESSED",
    "METRICS",
    "PERMISSION_DENIED",
    "WORKER_CRASHED",
    "FanOutMetrics",
    "InMemoryMetrics",
    "MetricDefinition",
    "MetricsSink",
    "OpenTelemetryMetrics",
    "PrometheusMetrics",
]
