"""`suaveplan-sandbox check / explain / validate`: decisions, reasons, rules, exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from suaveplan_sandbox.cli import main

EXAMPLE = Path(__file__).parents[2] / "examples" / "invoices" / "manifest.toml"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_check_fs_allow_prints_the_rule_and_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "check", "--manifest", str(EXAMPLE), "fs", "./uploads/a.csv")
    assert code == 0
    assert "allow" in out and "./uploads/*" in out


def test_check_deny_prints_the_reason_and_exits_one(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(
        capsys, "check", "--json", "--manifest", str(EXAMPLE), "fetch", "http://api.stripe.com/"
    )
    assert code == 1
    assert json.loads(out) == {
        "decision": "deny",
        "capability": "fetch",
        "reason": "scheme-not-permitted",
    }


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["fs", "./reports/x", "--mode", "write"], 0),
        (["fs", "./uploads/x", "--mode", "write"], 1),
        (["db", "--sql", "SELECT * FROM billing_invoices"], 0),
        (["db", "--sql", "SELECT * FROM users"], 1),
        (["db", "billing_invoices"], 0),
        (["secret", "AWS_KEY"], 1),
        (["publish", "invoice.summarised"], 0),
        (["subscribe", "invoice.summarised"], 1),
    ],
)
def test_check_covers_every_capability(
    capsys: pytest.CaptureFixture[str], argv: list[str], expected: int
) -> None:
    assert _run(capsys, "explain", "--manifest", str(EXAMPLE), *argv)[0] == expected


def test_invalid_manifest_is_one_coded_line_and_exit_two(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "m.json"
    bad.write_text(json.dumps({"name": "p", "permissions": {"fs": ["/etc/*"]}}))
    code, _, err = _run(capsys, "check", "--manifest", str(bad), "fs", "x")
    assert code == 2
    assert "SAND_MANIFEST_INVALID" in err
    assert "Traceback" not in err


def test_validate_reports_field_paths_and_broad_grant_warnings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broad = tmp_path / "m.json"
    broad.write_text(json.dumps({"name": "p", "permissions": {"fs": ["./*"], "fetch": ["*.com"]}}))
    code, out, _ = _run(capsys, "validate", "--json", str(broad))
    assert code == 0
    warnings = json.loads(out)["warnings"]
    assert any("permissions.fs[0]" in w for w in warnings)
    assert any("permissions.fetch[0]" in w for w in warnings)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "p", "permissions": {"fetch": ["ok.com", "bad/path"]}}))
    code, _, err = _run(capsys, "validate", str(bad))
    assert code == 2
    assert "permissions.fetch[1]" in err


def test_usage_errors_exit_two(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(capsys, "check", "--manifest", str(EXAMPLE), "db")[0] == 2


def test_demo_explains_the_examples(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "demo", str(EXAMPLE.parents[1]))
    assert code == 0
    assert "invoice-summary" in out
    assert "path-not-in-allowlist" in out
    # each example really ran: the VM plugin, the WASI module and the web host
    assert "try_to_escape() refused: SAND_PERM_DENIED" in out
    assert "WASI module exited 0" in out and "read private: refused" in out
    assert "-> 200 result 7" in out
    assert "-> 403 SAND_PERM_DENIED" in out
    assert "-> 429 BUDGET_EXCEEDED" in out
    assert "-> 400 SAND_MANIFEST_INVALID at permissions.fs[0]" in out
    assert 'plugin_budget_exceeded_total{budget="wallClockMs",plugin="word-count"} 1.0' in out


def test_run_calls_a_python_plugin_and_prints_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "uploads").mkdir()
    (tmp_path / "uploads" / "n.txt").write_text("41")
    (tmp_path / "plugin.py").write_text(
        "from suaveplan import fs\n\n"
        "def add(k):\n    return int(fs.read_text('/uploads/n.txt')) + k\n\n"
        "def sneak():\n    return fs.read_text('/plugin.py')\n"
    )
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps({"name": "p", "permissions": {"fs": ["./uploads/*"]}}))
    code, out, err = _run(
        capsys,
        "run",
        str(tmp_path / "plugin.py"),
        "--manifest",
        str(manifest),
        "--call",
        "add",
        "--args",
        "[1]",
        "--json",
        "--trace",
    )
    assert code == 0, err
    assert json.loads(out) == {"result": 42}
    assert '"allowed": true' in err
    code, out, err = _run(
        capsys, "run", str(tmp_path / "plugin.py"), "--manifest", str(manifest), "--call", "sneak"
    )
    assert code == 1
    assert "SAND_PERM_DENIED" in err and "path-not-in-allowlist" in err


def test_run_executes_the_wasm_example_with_the_manifests_folder_as_root(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    example = tmp_path / "wasm"
    shutil.copytree(EXAMPLE.parents[1] / "wasm", example)
    (example / "output" / "result.txt").unlink(missing_ok=True)
    code, out, err = _run(
        capsys,
        "run",
        str(example / "report.wasm"),
        "--manifest",
        str(example / "manifest.toml"),
        "--json",
    )
    assert code == 0, err
    result = json.loads(out)["result"]
    assert result["exit_code"] == 0
    assert "read private: refused" in result["stdout"]
    assert (example / "output" / "result.txt").read_text() == "sum=12\n"


def test_run_root_overrides_the_manifests_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    example = EXAMPLE.parents[1] / "wasm"
    (tmp_path / "input").mkdir()
    (tmp_path / "input" / "numbers.txt").write_text("40 2\n")
    (tmp_path / "output").mkdir()
    code, out, err = _run(
        capsys,
        "run",
        str(example / "report.wasm"),
        "--manifest",
        str(example / "manifest.toml"),
        "--root",
        str(tmp_path),
        "--json",
    )
    assert code == 0, err
    assert json.loads(out)["result"]["exit_code"] == 0
    assert (tmp_path / "output" / "result.txt").read_text() == "sum=42\n"
    assert not (example / "output" / "result.txt").exists()
