"""A bounded soak in CI: 8 s of mixed calls over 8 sandboxes must end flat.

The run goes through the real command line (`python -m benchmarks.soak --json`), so the JSON
contract `scripts/security_report.py` consumes is pinned here too. A second run with an
adapter that leaks one fd per call must be judged not flat: the check can fail.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from benchmarks.soak import TOLERANCES, Growth, run_soak

REPO = Path(__file__).resolve().parents[2]
KEYS = {
    "seconds",
    "sandboxes",
    "calls",
    "denied",
    "budget_breaches",
    "throughput_per_s",
    "p50_ms",
    "p99_ms",
    "growth",
    "flat",
}


def test_bounded_soak_ends_flat_with_denials_and_budget_breaches() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.soak", "--seconds", "8", "--sandboxes", "8", "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout + proc.stderr
    report = json.loads(lines[0])
    assert set(report) == KEYS
    assert set(report["growth"]) == {"fds", "processes", "threads", "rss_mb"}
    assert report["sandboxes"] == 8
    assert report["seconds"] >= 8
    assert report["calls"] > 100
    assert report["denied"] > 0  # denied capabilities really were asked for
    assert report["budget_breaches"] > 0  # and budgets really broke (sandboxes replaced)
    assert report["p50_ms"] <= report["p99_ms"]
    growth = Growth(**report["growth"])
    assert report["flat"] is True, report
    assert growth.within(TOLERANCES)
    assert proc.returncode == 0, proc.stderr


def test_flatness_check_fails_on_a_run_whose_adapter_leaks_an_fd_per_call() -> None:
    result = asyncio.run(
        run_soak(seconds=2, sandboxes=2, warmup_s=0.5, settle_s=1.0, _leak_fds=True)
    )
    assert result.calls > 0
    assert result.growth.fds > TOLERANCES.fds
    assert result.flat is False


def test_growth_beyond_any_tolerance_is_not_flat() -> None:
    assert Growth(fds=0, processes=0, threads=0, rss_mb=0.0).within(TOLERANCES)
    for leaky in (
        Growth(fds=TOLERANCES.fds + 1, processes=0, threads=0, rss_mb=0.0),
        Growth(fds=0, processes=TOLERANCES.processes + 1, threads=0, rss_mb=0.0),
        Growth(fds=0, processes=0, threads=TOLERANCES.threads + 1, rss_mb=0.0),
        Growth(fds=0, processes=0, threads=0, rss_mb=TOLERANCES.rss_mb + 0.5),
    ):
        assert not leaky.within(TOLERANCES), leaky
