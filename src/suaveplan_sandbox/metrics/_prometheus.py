"""A sink on a `prometheus_client` registry (`plugin.permission_denied_total` is exposed as
`plugin_permission_denied_total`).

`prometheus_client` is imported when a sink is built, not with this module: importing it
costs a host that never uses it about as much as pydantic or sqlglot (~60 ms here), and
every host imports the metrics package.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, final

from suaveplan_sandbox.metrics._definitions import METRICS
from suaveplan_sandbox.metrics._sink import definition_for

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry, Counter


@final
class PrometheusMetrics:
    """Creates one `Counter` per registered metric on `registry` (the default registry if None)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        from prometheus_client import REGISTRY, Counter

        self.registry = registry if registry is not None else REGISTRY
        self._lock = threading.Lock()
        self._counters: dict[str, Counter] = {}
        for definition in METRICS:
            # prometheus_client appends `_total` itself; give it the stem.
            stem = definition.prometheus_name.removesuffix("_total")
            self._counters[definition.name] = Counter(
                stem,
                definition.description,
                labelnames=definition.labels,
                registry=self.registry,
            )

    def inc(self, name: str, labels: Mapping[str, str], amount: float = 1.0) -> None:
        definition = definition_for(name, labels)
        counter = self._counters[definition.name]
        counter.labels(**{k: labels[k] for k in definition.labels}).inc(amount)
