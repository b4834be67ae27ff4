"""`BudgetTracker`: turns CPU samples, memory samples and clock ticks into budget breaches.

Theory of operation: the host feeds the tracker what it observes about one guest — cumulative
CPU seconds (`sample_cpu`), resident bytes (`sample_memory`) and clock ticks (`tick`, measured
from `start_call`). `cpuPercent` is CPU time over wall time across a sliding window (one core
= 100), judged only once the window is full, so start-up bursts don't count. A breach raises
`BUDGET_EXCEEDED` with `details.budget` and increments `plugin.budget_exceeded_total` — once
per dimension for the tracker's lifetime (one guest run): the host ends the guest on the first
breach, and repeated or identical samples afterwards neither raise again nor count again.
"""

from __future__ import annotations

from collections import deque
from typing import Final, final

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.metrics import BUDGET_EXCEEDED, InMemoryMetrics, MetricsSink
from suaveplan_sandbox.permissions._clock import Clock, MonotonicClock
from suaveplan_sandbox.permissions._manifest import Budgets

WALL_CLOCK: Final = "wallClockMs"
MEMORY: Final = "memoryMb"
CPU: Final = "cpuPercent"
DEFAULT_CPU_WINDOW_S: Final = 1.0


def budget_error(budget: str, *, limit: float, observed: float) -> SuaveplanError:
    return SuaveplanError(
        "BUDGET_EXCEEDED",
        f"budget exceeded: {budget}",
        {"budget": budget, "limit": limit, "observed": round(observed, 3)},
    )


@final
class BudgetTracker:
    """Tracks one guest's budgets. Not thread-safe: feed it from one place."""

    __slots__ = (
        "_breached",
        "_budgets",
        "_call_start",
        "_clock",
        "_cpu",
        "_metrics",
        "_plugin",
        "_window",
    )

    def __init__(
        self,
        budgets: Budgets,
        *,
        plugin: str,
        metrics: MetricsSink | None = None,
        clock: Clock | None = None,
        cpu_window_s: float = DEFAULT_CPU_WINDOW_S,
    ) -> None:
        if cpu_window_s <= 0:
            raise ValueError("cpu_window_s must be positive")
        self._budgets = budgets
        self._plugin = plugin
        self._metrics: MetricsSink = metrics if metrics is not None else InMemoryMetrics()
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self._window = cpu_window_s
        self._call_start: float | None = None
        self._cpu: deque[tuple[float, float]] = deque()
        self._breached: set[str] = set()

    @property
    def budgets(self) -> Budgets:
        return self._budgets

    @property
    def breached(self) -> frozenset[str]:
        return frozenset(self._breached)

    def start_call(self) -> None:
        """Start the wall clock for one call."""
        self._call_start = self._clock.now()

    def end_call(self) -> None:
        self._call_start = None

    def elapsed_ms(self) -> float:
        if self._call_start is None:
            return 0.0
        return (self._clock.now() - self._call_start) * 1000.0

    def remaining_s(self) -> float | None:
        """Seconds until the wall-clock budget of the current call runs out (None: unlimited)."""
        limit = self._budgets.wall_clock_ms
        if limit is None:
            return None
        return max(0.0, (limit - self.elapsed_ms()) / 1000.0)

    def tick(self) -> None:
        """Check the wall clock of the current call. Breach when elapsed > wallClockMs."""
        limit = self._budgets.wall_clock_ms
        if limit is None or self._call_start is None:
            return
        elapsed = self.elapsed_ms()
        if elapsed > limit:
            self._breach(WALL_CLOCK, limit, elapsed)

    def sample_memory(self, resident_bytes: int) -> None:
        """Check resident memory (VM worker RSS, WASM linear memory) against memoryMb."""
        limit = self._budgets.memory_mb
        if limit is None:
            return
        if resident_bytes > limit * 1024 * 1024:
            self._breach(MEMORY, limit, resident_bytes / (1024 * 1024))

    def sample_cpu(self, cpu_seconds: float, *, at: float | None = None) -> None:
        """Record cumulative CPU seconds of the guest at time `at` (default: clock now)."""
        now = self._clock.now() if at is None else at
        samples = self._cpu
        if samples and (now <= samples[-1][0] or cpu_seconds < samples[-1][1]):
            # Identical, stale or out-of-order samples carry no new information.
            return
        samples.append((now, cpu_seconds))
        while len(samples) > 2 and now - samples[1][0] >= self._window:
            samples.popleft()
        limit = self._budgets.cpu_percent
        if limit is None or len(samples) < 2:
            return
        t0, c0 = samples[0]
        span = now - t0
        if span < self._window:
            return
        percent = (cpu_seconds - c0) / span * 100.0
        if percent > limit:
            self._breach(CPU, limit, percent)

    def _breach(self, budget: str, limit: float, observed: float) -> None:
        if budget in self._breached:
            return
        self._breached.add(budget)
        self._metrics.inc(BUDGET_EXCEEDED.name, {"plugin": self._plugin, "budget": budget})
        raise budget_error(budget, limit=limit, observed=observed)
