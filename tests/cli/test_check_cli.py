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
        "near_miss": {
            "rule": "api.stripe.com",
            "why": "the rule allows https; http needs an http: rule",
        },
    }


@pytest.mark.parametrize(
    ("argv", "near_miss"),
    [
        (["fs", "./uploads/a.csv", "--mode", "write"], {"rule": "./uploads/*"}),
        (["fs", "./config/secrets.env"], None),
        (["fetch", "https://evil.example/"], None),
        (["db", "--sql", "SELECT * FROM users"], {}),
        (["secret", "AWS_KEY"], None),
    ],
)
def test_explain_names_the_rule_a_denial_nearly_matched(
    capsys: pytest.CaptureFixture[str], argv: list[str], near_miss: dict[str, str] | None
) -> None:
    code, out, _ = _run(capsys, "explain", "--json", "--manifest", str(EXAMPLE), *argv)
    assert code == 1
    data = json.loads(out)
    if near_miss is None:
        assert "near_miss" not in data
    else:
        assert near_miss.items() <= data["near_miss"].items()
        assert data["near_miss"]["why"]


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
    assert [(w["path"], w["rule"]) for w in warnings] == [
        ("permissions.fs[0]", "./*"),
        ("permissions.fetch[0]", "*.com"),
    ]
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
    assert "-> {'owed': {'acme': 10.0, 'globex': 49.99}, 'reports': 1}" in out
    assert (
        "refused: SAND_PERM_DENIED {'capability': 'fetch', 'reason': 'host-not-in-allowlist'}"
        in out
    )
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
    # The README's `run` example writes the repo's output/result.txt (git ignores it): this run
    # must leave whatever is there untouched.
    in_repo = example / "output" / "result.txt"
    before = in_repo.stat().st_mtime_ns if in_repo.exists() else None
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
    assert (in_repo.stat().st_mtime_ns if in_repo.exists() else None) == before


@pytest.mark.parametrize(
    ("section", "rule", "message"),
    [
        ("fs", "./*", "grants the whole plugin root"),
        ("fs", "rw:./*", "grants the whole plugin root"),
        ("fs", "*", "grants the whole plugin root"),
        ("fs", "./**", "grants the whole plugin root"),
        ("fs", "./*.json", "matches files anywhere beneath the plugin root"),
        ("fs", "./uploads/*", None),
        ("fs", "./config.json", None),
        ("fetch", "*.com", "grants every host under a public suffix"),
        ("fetch", "*.co.uk", "grants every host under a public suffix"),
        ("fetch", "*.example.co.uk", None),
        ("fetch", "*.example.com", None),
        ("fetch", "http:api.example.com", "allows unencrypted http"),
        ("fetch", "10.0.0.7", "names a private or loopback address"),
        ("fetch", "[::1]:8080", "names a private or loopback address"),
        ("fetch", "93.184.216.34", None),
        ("fetch", "api.stripe.com", None),
        ("publishes", "*", "grants every topic"),
        ("subscribes", "*.*", "grants every topic"),
        ("subscribes", "payment.*", None),
    ],
)
def test_validate_warns_about_broad_grants_and_only_those(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], section: str, rule: str, message: str | None
) -> None:
    manifest: dict[str, object] = {"name": "p"}
    if section in ("fs", "fetch"):
        manifest["permissions"] = {section: [rule]}
        path = f"permissions.{section}[0]"
    else:
        manifest["events"] = {section: [rule]}
        path = f"events.{section}[0]"
    file = tmp_path / "m.json"
    file.write_text(json.dumps(manifest))
    code, out, _ = _run(capsys, "validate", "--json", str(file))
    assert code == 0, out
    warnings = json.loads(out)["warnings"]
    if message is None:
        assert warnings == []
    else:
        assert [w["path"] for w in warnings] == [path]
        assert warnings[0]["rule"] == rule
        assert warnings[0]["message"].startswith(message)


def test_an_empty_table_prefix_is_an_error_not_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = tmp_path / "m.json"
    file.write_text(json.dumps({"name": "p", "database": {"tablePrefix": ""}}))
    code, out, _ = _run(capsys, "validate", "--json", str(file))
    assert code == 2
    errors = json.loads(out)["error"]["details"]["errors"]
    assert [e["path"] for e in errors] == ["database.tablePrefix"]


@pytest.mark.parametrize(
    "argv",
    [
        ["check", "--json", "--manifest", str(EXAMPLE), "fs"],
        ["run", str(EXAMPLE.parent / "plugin.py"), "--manifest", str(EXAMPLE), "--json"],
        [
            "run",
            str(EXAMPLE.parent / "plugin.py"),
            "--manifest",
            str(EXAMPLE),
            "--call",
            "x",
            "--args",
            "{",
            "--json",
        ],
        ["validate", "--json", "--no-such-option", str(EXAMPLE)],
        ["conformance", "--host", "no_such_module_here:X", "--json"],
    ],
)
def test_usage_errors_are_json_under_json(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    code, out, _ = _run(capsys, *argv)
    assert code == 2
    error = json.loads(out)["error"]
    assert error["code"] == "SAND_INVALID_ARGUMENT"
    assert error["message"]


def test_debug_shows_the_traceback_of_a_coded_error_and_plain_mode_does_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "m.toml"
    bad.write_text("not toml [")
    code, _, err = _run(capsys, "check", "--manifest", str(bad), "fs", "x")
    assert code == 2
    assert err.strip().splitlines() == [err.strip()]  # one line
    assert err.startswith("error SAND_MANIFEST_INVALID:")
    code, _, err = _run(capsys, "--debug", "check", "--manifest", str(bad), "fs", "x")
    assert code == 2
    assert "Traceback (most recent call last)" in err
    assert "load_manifest" in err
    assert err.strip().splitlines()[-1].startswith("error SAND_MANIFEST_INVALID:")


def test_an_internal_error_is_one_line_and_exit_three_unless_debug(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from suaveplan_sandbox.cli import _main

    def explode(*_args: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(_main, "_decide", explode)
    argv = ["check", "--manifest", str(EXAMPLE), "fs", "./uploads/a.csv"]
    code, _, err = _run(capsys, *argv)
    assert code == 3
    assert err.strip() == "internal error: RuntimeError: boom (rerun with --debug)"
    code, out, _ = _run(capsys, *argv, "--json")
    assert code == 3
    assert json.loads(out) == {"internal_error": {"type": "RuntimeError", "message": "boom"}}
    with pytest.raises(RuntimeError, match="boom"):
        main(["--debug", *argv])


def test_reference_check_reports_stale_pages_and_writing_fixes_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(capsys, "reference", "--check", "--json", str(tmp_path))
    assert code == 1
    assert sorted(Path(p).name for p in json.loads(out)["stale"]) == [
        "error-codes.md",
        "metrics.md",
    ]
    code, out, _ = _run(capsys, "reference", "--json", str(tmp_path))
    assert code == 0
    assert len(json.loads(out)["written"]) == 2
    assert _run(capsys, "reference", "--check", str(tmp_path))[0] == 0
    (tmp_path / "reference" / "metrics.md").write_text("hand edited\n")
    code, out, _ = _run(capsys, "reference", "--check", str(tmp_path))
    assert code == 1
    assert "metrics.md" in out


def test_the_committed_reference_pages_are_current(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(capsys, "reference", "--check", str(EXAMPLE.parents[2] / "docs"))[0] == 0


def test_demo_json_holds_each_examples_decisions_and_what_its_run_did(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = _run(capsys, "demo", "--json", str(EXAMPLE.parents[1]))
    assert code == 0, err
    data = json.loads(out)  # one document, nothing else on stdout
    assert data["status"] == 0
    examples = data["examples"]
    assert set(examples) == {"invoices", "wasm", "asgi_host"}
    # the decision tables
    private = {"capability": "fs", "payload": {"path": "./private/notes.txt"}}
    assert {**private, "decision": "deny", "reason": "path-not-in-allowlist"} in examples["wasm"][
        "decisions"
    ]
    for name in ("invoices", "wasm"):
        assert all(row["decision"] in ("allow", "deny") for row in examples[name]["decisions"])
    # the Python plugin's live run: what each call returned, what was refused and why
    invoices = examples["invoices"]
    assert invoices["plugin"] == "invoice-summary"
    calls = {(c["call"], tuple(c["args"][1:2])): c for c in invoices["run"]["calls"]}
    assert calls[("summarize", ())]["result"] == {"acme": 130.5, "globex": 99.99}
    paid = next(c for c in invoices["run"]["calls"] if c["call"] == "reconcile" and "result" in c)
    assert paid["args"][1].startswith("http://127.0.0.1:")
    assert paid["result"] == {"owed": {"acme": 10.0, "globex": 49.99}, "reports": 1}
    elsewhere = calls[("reconcile", ("https://payments.evil.example",))]
    assert "result" not in elsewhere
    assert elsewhere["refused"]["code"] == "SAND_PERM_DENIED"
    assert elsewhere["refused"]["details"] == {
        "capability": "fetch",
        "reason": "host-not-in-allowlist",
    }
    escape = calls[("try_to_escape", ())]["refused"]
    assert escape["details"] == {"capability": "fs", "reason": "path-not-in-allowlist"}
    assert "secrets.env" not in json.dumps(escape)  # a denial never names the target
    assert invoices["run"]["permission_denied_total"] == 2
    assert invoices["run"]["files_written"] == {
        "reports/march.txt": "acme: 130.50\nglobex: 99.99\n"
    }
    # the WASI module's run
    wasm = examples["wasm"]["run"]
    assert wasm["exit_code"] == 0
    assert wasm["preopens"] == [
        {"guest": "/input", "writable": False},
        {"guest": "/output", "writable": True},
    ]
    assert "read private: refused (errno 44)" in wasm["stdout"]
    assert wasm["files_written"] == {"output/result.txt": "sum=12\n"}
    # the web host: each request's status and result or coded refusal
    posts = {p["status"]: p for p in examples["asgi_host"]["requests"]}
    assert posts[200]["result"] == 7
    assert posts[403]["error"]["code"] == "SAND_PERM_DENIED"
    assert posts[429]["error"]["details"]["budget"] == "wallClockMs"
    assert posts[400]["error"]["details"]["path"] == "permissions.fs[0]"
    budget = 'plugin_budget_exceeded_total{budget="wallClockMs",plugin="word-count"} 1.0'
    assert budget in examples["asgi_host"]["metrics"]


def test_demo_json_reports_a_broken_example_and_an_empty_folder_with_exit_two(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(capsys, "demo", "--json", str(tmp_path))
    assert code == 2
    assert json.loads(out)["error"]["code"] == "SAND_INVALID_ARGUMENT"
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "manifest.toml").write_text('name = "p"\n[permissions]\nfs = ["/etc/*"]\n')
    code, out, _ = _run(capsys, "demo", "--json", str(tmp_path))
    assert code == 2
    data = json.loads(out)
    assert data["status"] == 2
    error = data["examples"]["bad"]["error"]
    assert (error["code"], error["details"]["path"]) == (
        "SAND_MANIFEST_INVALID",
        "permissions.fs[0]",
    )
