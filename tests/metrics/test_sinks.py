"""Metric sinks: in-memory for tests, Prometheus and OpenTelemetry for production."""

from __future__ import annotations

import subprocess
import sys

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry, generate_latest

from suaveplan_sandbox.metrics import (
    BUDGET_EXCEEDED,
    METRICS,
    PERMISSION_DENIED,
    FanOutMetrics,
    InMemoryMetrics,
    OpenTelemetryMetrics,
    PrometheusMetrics,
)

LABELS = {"plugin": "p", "capability": "fs", "reason": "path-not-in-allowlist"}


def test_in_memory_sink_counts_by_label_set() -> None:
    sink = InMemoryMetrics()
    sink.inc(PERMISSION_DENIED.name, LABELS)
    sink.inc(PERMISSION_DENIED.name, LABELS)
    sink.inc(PERMISSION_DENIED.name, {**LABELS, "capability": "fetch"})
    assert sink.value(PERMISSION_DENIED.name, **LABELS) == 2
    assert sink.value(PERMISSION_DENIED.name, plugin="p") == 3
    sink.reset()
    assert sink.value(PERMISSION_DENIED.name, **LABELS) == 0


def test_sinks_refuse_undeclared_metrics_and_wrong_labels() -> None:
    sink = InMemoryMetrics()
    with pytest.raises(KeyError):
        sink.inc("plugin.made_up_total", {})
    with pytest.raises(ValueError):
        sink.inc(PERMISSION_DENIED.name, {"plugin": "p"})
    # A series already counted does not let a different label set through, nor record it.
    sink.inc(PERMISSION_DENIED.name, LABELS)
    with pytest.raises(ValueError):
        sink.inc(PERMISSION_DENIED.name, {**LABELS, "extra": "x"})
    assert sink.samples() == [(PERMISSION_DENIED.name, dict(LABELS), 1.0)]


def test_prometheus_sink_exposes_plugin_permission_denied_total() -> None:
    registry = CollectorRegistry()
    sink = PrometheusMetrics(registry)
    sink.inc(PERMISSION_DENIED.name, LABELS)
    sink.inc(BUDGET_EXCEEDED.name, {"plugin": "p", "budget": "wallClockMs"})
    text = generate_latest(registry).decode()
    assert (
        'plugin_permission_denied_total{capability="fs",plugin="p",'
        'reason="path-not-in-allowlist"} 1.0' in text
    )
    assert 'plugin_budget_exceeded_total{budget="wallClockMs",plugin="p"} 1.0' in text
    for definition in METRICS:
        assert f"# TYPE {definition.prometheus_name} counter" in text


def test_opentelemetry_sink_records_counters() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    sink = OpenTelemetryMetrics(provider.get_meter("suaveplan-test"))
    sink.inc(PERMISSION_DENIED.name, LABELS)
    data = reader.get_metrics_data()
    assert data is not None
    points = [
        (metric.name, dict(point.attributes or {}), getattr(point, "value", None))
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
        for point in metric.data.data_points
    ]
    assert (PERMISSION_DENIED.name, LABELS, 1) in points


def test_fan_out_sends_to_every_sink() -> None:
    a, b = InMemoryMetrics(), InMemoryMetrics()
    FanOutMetrics(a, b).inc(PERMISSION_DENIED.name, LABELS)
    assert (
        a.value(PERMISSION_DENIED.name, **LABELS) == b.value(PERMISSION_DENIED.name, **LABELS) == 1
    )


def test_hosts_that_never_build_an_exporter_do_not_import_its_library() -> None:
    # The metrics package is imported by every host; prometheus_client and OpenTelemetry
    # are loaded only when their sink is built.
    code = (
        "import sys, suaveplan_sandbox.metrics, suaveplan_sandbox.vm, suaveplan_sandbox.wasm\n"
        "print(sorted(m for m in ('prometheus_client', 'opentelemetry') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
