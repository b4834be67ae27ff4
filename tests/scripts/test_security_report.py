"""The security report aggregates evidence honestly: any escape, lost fault or leak shows."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "security_report.py"


@pytest.fixture(scope="module")
def sr() -> ModuleType:
    spec = importlib.util.spec_from_file_location("security_report", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["security_report"] = module  # dataclasses resolve annotations through it
    spec.loader.exec_module(module)
    return module


def _soak(flat: bool) -> dict[str, object]:
    return {
        "seconds": 60.0,
        "sandboxes": 16,
        "calls": 1000,
        "denied": 10,
        "budget_breaches": 2,
        "throughput_per_s": 16.6,
        "p50_ms": 1.5,
        "p99_ms": 9.0,
        "growth": {"fds": 0, "processes": 0, "threads": 0, "rss_mb": 1.0},
        "flat": flat,
    }


def test_all_contained_evidence_renders_green_with_per_family_totals(sr: ModuleType) -> None:
    report = sr.Report()
    sr.add_escapes(
        report,
        [
            {"family": "import", "technique": "import_os", "layer": "both", "contained": True},
            {
                "family": "import",
                "technique": "import_os",
                "layer": "process-only",
                "contained": True,
            },
            {"family": "gc", "technique": "gc_walk", "layer": "both", "contained": True},
        ],
    )
    sr.add_faults(report, [{"kind": "worker-sigkill", "injected": 5, "survived": 5}])
    sr.add_fuzz(report, {"targets": {"frames": {"executions": 900, "crashes": 0, "seconds": 5}}})
    sr.add_soak(report, _soak(flat=True))
    text = sr.render(report)
    assert report.problems == []
    cells = {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
        for line in text.splitlines()
        if line.startswith("| ")
    }
    assert cells["family"] == ["both", "process-only"]
    assert cells["import"] == ["1/1", "1/1"]
    assert cells["gc"] == ["1/1", "-"]
    assert cells["**all**"] == ["2/2", "1/1"]
    assert "worker-sigkill" in text and "5/5" in text
    assert "900" in text
    assert text.rstrip().endswith("Result: all contained")


@pytest.mark.parametrize(
    "feed, problem",
    [
        (
            lambda sr, r: sr.add_escapes(
                r, [{"family": "x", "technique": "t", "contained": False}]
            ),
            "escape t",
        ),
        (
            lambda sr, r: sr.add_faults(r, [{"kind": "oom", "injected": 3, "survived": 2}]),
            "fault oom: 1 not survived",
        ),
        (
            lambda sr, r: sr.add_fuzz(r, {"targets": {"sql": {"executions": 5, "crashes": 1}}}),
            "fuzz sql: 1 crash",
        ),
        (
            lambda sr, r: sr.add_fuzz(r, {"targets": {"sql": {"executions": 0, "crashes": 0}}}),
            "fuzz sql: no executions",
        ),
        (lambda sr, r: sr.add_fuzz(r, {"targets": {}}), "fuzz: no targets ran"),
        (lambda sr, r: sr.add_soak(r, _soak(flat=False)), "soak: resource growth not flat"),
    ],
)
def test_any_bad_input_makes_the_report_fail(sr: ModuleType, feed: object, problem: str) -> None:
    report = sr.Report()
    feed(sr, report)  # type: ignore[operator]
    assert any(p.startswith(problem) for p in report.problems), report.problems
    assert "Result: PROBLEMS" in sr.render(report)


def test_the_machine_line_names_interpreter_kernel_and_hardening(sr: ModuleType) -> None:
    facts = sr.machine_facts()
    assert set(facts) == {"python", "kernel", "hardening"}
    text = sr.render(sr.Report(machine=facts))
    assert text.startswith("Machine: python ")


def test_rows_file_rejects_non_object_lines(sr: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "escapes.jsonl"
    path.write_text(json.dumps({"family": "a"}) + "\n\n" + json.dumps([1]) + "\n")
    with pytest.raises(ValueError, match=r"escapes\.jsonl:3"):
        sr.read_rows(path)
    assert sr.read_rows(tmp_path / "missing.jsonl") == []


def test_suite_fixture_writes_rows_only_when_the_report_dir_is_set(
    security_record: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sr: ModuleType
) -> None:
    monkeypatch.delenv(sr.REPORT_DIR_ENV, raising=False)
    security_record("faults", kind="k", injected=1, survived=1)  # type: ignore[operator]
    assert not any(tmp_path.iterdir())
    monkeypatch.setenv(sr.REPORT_DIR_ENV, str(tmp_path))
    security_record("faults", kind="k", injected=2, survived=2)  # type: ignore[operator]
    assert sr.read_rows(tmp_path / "faults.jsonl") == [{"injected": 2, "kind": "k", "survived": 2}]
