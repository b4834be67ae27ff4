"""`run` wires the host's real adapters: SQLite with migrations, HTTP, events, env secrets."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from suaveplan_sandbox.cli import main
from suaveplan_sandbox.cli._demo_runs import fake_payment_api

INVOICES = Path(__file__).parents[2] / "examples" / "invoices"


@pytest.fixture
def invoices(tmp_path: Path) -> Path:
    root = tmp_path / "invoices"
    shutil.copytree(INVOICES, root)
    (root / "reports").mkdir(exist_ok=True)
    return root


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_summarize_runs_with_a_migrated_sqlite_db_and_an_event_bus(
    invoices: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    code, out, err = _run(
        capsys,
        "run", str(invoices / "plugin.py"), "--manifest", str(invoices / "manifest.toml"),
        "--call", "summarize", "--args", '["march"]', "--data-dir", str(data), "--trace", "--json",
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out) == {"result": {"acme": 130.5, "globex": 99.99}}
    traces = [json.loads(line)["trace"] for line in err.splitlines()]
    assert [(t["capability"], t["operation"], t["allowed"]) for t in traces] == [
        ("fs", "read_bytes", True),
        ("fs", "write_bytes", True),
        ("db", "query", True),
        ("events", "publish", True),
    ]
    with sqlite3.connect(data / "invoice-summary.sqlite3") as conn:
        assert conn.execute("SELECT month, customers FROM billing_reports").fetchall() == [
            ("march", 2)
        ]


def test_reconcile_reaches_the_declared_api_with_a_secret_from_the_environment(
    invoices: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STRIPE_SECRET_KEY", "sk_test_demo")
    argv = ["run", str(invoices / "plugin.py"), "--manifest", str(invoices / "manifest.toml")]
    with fake_payment_api() as api:
        code, out, err = _run(
            capsys, *argv, "--call", "reconcile", "--args", json.dumps(["march", api]),
            "--secret", "STRIPE_SECRET_KEY", "--json",
        )  # fmt: skip
    assert code == 0, err
    # a fresh temporary database: no report rows yet
    assert json.loads(out) == {"result": {"owed": {"acme": 10.0, "globex": 49.99}, "reports": 0}}


def test_without_the_secret_the_plugin_gets_no_value(
    invoices: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STRIPE_SECRET_KEY", "sk_test_demo")  # present, but not passed on
    argv = ["run", str(invoices / "plugin.py"), "--manifest", str(invoices / "manifest.toml")]
    with fake_payment_api() as api:
        code, out, _ = _run(
            capsys, *argv, "--call", "reconcile", "--args", json.dumps(["march", api]), "--json"
        )
    assert code == 2
    assert json.loads(out)["error"]["code"] == "SAND_SECRET_UNAVAILABLE"


def test_a_secret_missing_from_the_environment_is_a_usage_error(
    invoices: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NO_SUCH_SECRET_VAR", raising=False)
    code, out, _ = _run(
        capsys,
        "run", str(invoices / "plugin.py"), "--manifest", str(invoices / "manifest.toml"),
        "--call", "summarize", "--args", '["march"]', "--secret", "NO_SUCH_SECRET_VAR", "--json",
    )  # fmt: skip
    assert code == 2
    assert json.loads(out)["error"]["code"] == "SAND_INVALID_ARGUMENT"


def test_an_undeclared_host_is_refused_before_any_connection(
    invoices: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STRIPE_SECRET_KEY", "sk_test_demo")
    code, out, _ = _run(
        capsys,
        "run", str(invoices / "plugin.py"), "--manifest", str(invoices / "manifest.toml"),
        "--call", "reconcile", "--args", '["march", "https://payments.evil.example"]',
        "--secret", "STRIPE_SECRET_KEY", "--json",
    )  # fmt: skip
    assert code == 1
    error = json.loads(out)["error"]
    assert error["code"] == "SAND_PERM_DENIED"
    assert error["details"] == {"capability": "fetch", "reason": "host-not-in-allowlist"}
