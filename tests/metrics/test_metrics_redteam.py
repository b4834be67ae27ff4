"""Red-team checks on metrics: what a hostile plugin controls never becomes a label value,
and label values are escaped in the Prometheus exposition."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from suaveplan_sandbox.adapters import Adapters, InProcessEventBus, JsonLinesAudit, StaticSecrets
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.gateway import Gateway
from suaveplan_sandbox.metrics import PERMISSION_DENIED, InMemoryMetrics, PrometheusMetrics
from suaveplan_sandbox.permissions import PermissionChecker, PermissionPolicy


def test_prometheus_escapes_quotes_backslashes_and_newlines_in_label_values() -> None:
    registry = CollectorRegistry()
    sink = PrometheusMetrics(registry)
    hostile = 'p"} 1\nplugin_permission_denied_total{plugin="forged\\'
    sink.inc(
        PERMISSION_DENIED.name,
        {"plugin": hostile, "capability": "fs", "reason": "path-not-in-allowlist"},
    )
    text = generate_latest(registry).decode()
    samples = [
        s
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "plugin_permission_denied_total"
    ]
    assert [s.labels["plugin"] for s in samples] == [hostile]


async def test_names_a_plugin_makes_up_add_no_metric_series() -> None:
    policy = PermissionPolicy.from_manifest(
        {
            "name": "churn",
            "permissions": {},
            "secrets": [{"name": "API_KEY"}],
            "events": {"publishes": ["churn.*"], "subscribes": ["other.*"]},
        },
        root="/srv/churn",
    )
    metrics = InMemoryMetrics()
    gateway = Gateway(
        checker=PermissionChecker(policy, metrics=metrics),
        adapters=Adapters(events=InProcessEventBus(), secrets=StaticSecrets({"API_KEY": "v"})),
        audit=JsonLinesAudit(),
    )

    async def handler(topic: str, payload: object) -> None:
        return None

    async def churn(i: int) -> None:
        attempts: list[tuple[str, str, dict[str, object]]] = [
            ("events", "publish", {"topic": f"x{i}.y", "payload": None}),
            ("events", "subscribe", {"topic": f"z{i}.*"}),
            ("secrets", "get", {"name": f"NAME_{i}"}),
            (f"cap{i}", f"op{i}", {}),
            ("events", f"op{i}", {"topic": "churn.a"}),
        ]
        for cap, op, args in attempts:
            with pytest.raises(SuaveplanError):
                await gateway.dispatch(cap, op, args, handler=handler)
        await gateway.dispatch("events", "publish", {"topic": f"churn.{i}", "payload": i})

    await churn(0)
    series = len(metrics.samples())
    for i in range(1, 50):
        await churn(i)
    assert len(metrics.samples()) == series
    for _, labels, _ in metrics.samples():
        assert not any(str(i) in v for v in labels.values() for i in range(50)), labels
