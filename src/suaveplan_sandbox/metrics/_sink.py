"""The metrics sink protocol and the in-memory sink used by default and in tests."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Protocol, final, runtime_checkable

from suaveplan_sandbox.metrics._definitions import METRICS_BY_NAME, MetricDefinition


@runtime_checkable
class MetricsSink(Protocol):
    """Where counters go. `inc` must be cheap and must never raise into the caller."""

    def inc(self, name: str, labels: Mapping[str, str], amount: float = 1.0) -> None: ...


def definition_for(name: str, labels: Mapping[str, str]) -> MetricDefinition:
    """The registered definition; raises `KeyError`/`ValueError` for an unknown name or labels."""
    definition = METRICS_BY_NAME[name]
    if set(labels) != set(definition.labels):
        raise ValueError(f"metric {name} takes labels {definition.labels}, got {sorted(labels)}")
    return definition


@final
class InMemoryMetrics:
    """Counters held in a dict, readable with `value(name, **labels)`. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    def inc(self, name: str, labels: Mapping[str, str], amount: float = 1.0) -> None:
        key = (name, tuple(sorted(labels.items())))
        with self._lock:
            count = self._counters.get(key)
            if count is None:  # a new series: its name and label names are checked once
                definition_for(name, labels)
                count = 0.0
            self._counters[key] = count + amount

    def value(self, name: str, **labels: str) -> float:
        """The counter's value; labels not given match any value (their sum is returned)."""
        with self._lock:
            total = 0.0
            for (metric, key_labels), count in self._counters.items():
                if metric != name:
                    continue
                as_dict = dict(key_labels)
                if all(as_dict.get(k) == v for k, v in labels.items()):
                    total += count
            return total

    def samples(self) -> list[tuple[str, dict[str, str], float]]:
        with self._lock:
            return [(n, dict(lbl), v) for (n, lbl), v in sorted(self._counters.items())]

    def reset(self) -> None:
        with self._lock:
            self._counters.clear()


@final
class FanOutMetrics:
    """Send every increment to several sinks (e.g. in-memory for tests plus Prometheus)."""

    def __init__(self, *sinks: MetricsSink) -> None:
        self._sinks = sinks

    def inc(self, name: str, labels: Mapping[str, str], amount: float = 1.0) -> None:
        for sink in self._sinks:
            sink.inc(name, labels, amount)
