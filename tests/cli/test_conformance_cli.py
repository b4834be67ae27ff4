"""`suaveplan-sandbox conformance`: our own host passes; a broken host's failures are listed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from suaveplan_sandbox.cli import main


def test_our_own_host_passes_every_harness(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["conformance", "--json"])
    out = capsys.readouterr().out
    results = json.loads(out)
    assert code == 0, out
    assert set(results) == {"permissions", "vm", "wasm"}
    assert all(r["provided"] and not r["failed"] and r["passed"] for r in results.values())


def test_a_broken_host_fails_with_the_scenarios_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "broken_host.py").write_text(
        "from suaveplan_sandbox.permissions import Allow\n\n"
        "class _Yes:\n"
        "    def check_fs(self, path, mode='read'):\n        return Allow()\n"
        "    def check_fetch(self, url):\n        return Allow()\n"
        "    def check_capability(self, c, p):\n        return Allow()\n\n"
        "class Host:\n"
        "    @staticmethod\n"
        "    def make_checker(manifest, metrics):\n        return _Yes()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    code = main(["conformance", "--json", "--host", "broken_host:Host"])
    results = json.loads(capsys.readouterr().out)
    assert code == 1
    assert results["vm"]["provided"] is False
    failed = {f["scenario"] for f in results["permissions"]["failed"]}
    assert "fs denial emits metric with reason" in failed
    sys.modules.pop("broken_host", None)


def test_a_bad_host_spec_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conformance", "--host", "no_colon"]) == 2
