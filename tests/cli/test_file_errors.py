"""File-level problems read as code, file and reason, in the library and in the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from suaveplan_sandbox.cli import main
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import PermissionPolicy, load_manifest

EXAMPLES = Path(__file__).parents[2] / "examples"
MANIFEST = EXAMPLES / "invoices" / "manifest.toml"


def _file_problem(tmp_path: Path, name: str, content: str | bytes | None) -> Path:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    return path


@pytest.mark.parametrize(
    ("name", "content", "reason", "says"),
    [
        ("absent.toml", None, "unreadable", "cannot read it (No such file or directory)"),
        ("m.yaml", "name: p", "unsupported-suffix", "has '.yaml'; a manifest is a .toml or .json"),
        ("manifest", "name = 'p'", "unsupported-suffix", "has no suffix"),
        ("m.toml", "name = ", "unparsable", "is not valid TOML: "),
        ("m.json", "{not json", "unparsable", "is not valid JSON: "),
        ("m.json", b"\xff\xfe{}", "unparsable", "is not valid JSON: "),
        ("m.json", "[1, 2]", "not-a-mapping", "holds a list; a manifest is an object"),
        ("big.json", " " * (1024 * 1024 + 1), "too-large", "is larger than 1 MiB"),
    ],
)
def test_file_level_errors_name_the_file_and_the_reason(
    tmp_path: Path, name: str, content: str | bytes | None, reason: str, says: str
) -> None:
    path = _file_problem(tmp_path, name, content)
    for load in (load_manifest, lambda p: PermissionPolicy.from_manifest(p, root=tmp_path)):
        with pytest.raises(SuaveplanError) as info:
            load(path)
        err = info.value
        assert err.code == "SAND_MANIFEST_INVALID"
        assert err.details["file"] == str(path)
        assert err.details["reason"] == reason
        assert err.details["errors"] == []  # no field to point at
        assert err.message.startswith(f"manifest file {path}: ")
        assert says in err.message
        assert ": :" not in err.message  # the old empty field path


def test_field_errors_still_name_the_field_path(tmp_path: Path) -> None:
    path = _file_problem(tmp_path, "m.toml", 'name = "p"\n[permissions]\nfs = ["/abs"]\n')
    with pytest.raises(SuaveplanError) as info:
        load_manifest(path)
    assert info.value.details["path"] == "permissions.fs[0]"
    assert "file" not in info.value.details


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    "argv",
    [
        ["validate"],
        ["check", "fs", "./a", "--manifest"],
        ["run", str(EXAMPLES / "invoices" / "plugin.py"), "--call", "summarize", "--manifest"],
    ],
)
def test_cli_shows_a_missing_manifest_as_one_line_with_code_and_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    missing = str(tmp_path / "nope.toml")
    code, out, err = _cli(capsys, *argv, missing)
    assert code == 2
    assert out == ""
    assert err.strip().splitlines()[0] == (
        f"error SAND_MANIFEST_INVALID: manifest file {missing}: "
        "cannot read it (No such file or directory)"
    )
    code, out, _ = _cli(capsys, *argv[:1], "--json", *argv[1:], missing)
    assert code == 2
    error = json.loads(out)["error"]
    assert error["code"] == "SAND_MANIFEST_INVALID"
    assert error["details"]["file"] == missing
    assert error["details"]["reason"] == "unreadable"


@pytest.mark.parametrize(
    ("plugin", "what"),
    [
        (MANIFEST, ".toml suffix"),
        (EXAMPLES / "invoices", "folder without __init__.py"),
        (EXAMPLES / "wasm" / "report.c", ".c suffix"),
    ],
)
def test_run_on_something_that_is_not_a_plugin_names_the_accepted_kinds(
    capsys: pytest.CaptureFixture[str], plugin: Path, what: str
) -> None:
    argv = ["run", str(plugin), "--manifest", str(MANIFEST), "--call", "summarize"]
    code, _, err = _cli(capsys, *argv)
    assert code == 2
    assert err.startswith(f"error SAND_INVALID_ARGUMENT: cannot run {plugin} ({what}): ")
    assert "a .py file, a package folder with __init__.py or a .wasm module" in err
    assert "IMPORT_FORBIDDEN" not in err
    code, out, _ = _cli(capsys, "run", "--json", *argv[1:])
    assert code == 2
    error = json.loads(out)["error"]
    assert error["code"] == "SAND_INVALID_ARGUMENT"
    assert error["details"] == {
        "plugin": str(plugin),
        "accepted": [".py file", "package folder with __init__.py", ".wasm module"],
    }
