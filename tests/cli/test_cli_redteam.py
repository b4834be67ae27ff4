"""The CLI fed an attacker's plugin folder: what it prints must not drive the terminal, and
the migrations it applies before the plugin runs must be the plugin's own regular files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from suaveplan_sandbox._printable import printable
from suaveplan_sandbox.adapters._migration_files import MAX_MIGRATION_BYTES, read_migration
from suaveplan_sandbox.cli import main
from suaveplan_sandbox.errors import SuaveplanError

ESCAPES = "\x1b]0;owned\x07\x1b[2J\x9b31m\u202e"
HOST_SECRET = "CREATE TABLE billing_x (v TEXT); -- hunter2\n"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _no_controls(text: str) -> None:
    assert not any(c in text for c in "\x1b\x07\x9b\u202e"), text


def test_printable_escapes_controls_c1_and_bidi_but_not_text() -> None:
    assert printable("café ✓ tab\there") == "café ✓ tab\\there"
    assert printable(ESCAPES) == "\\x1b]0;owned\\x07\\x1b[2J\\x9b31m\\u202e"
    assert printable("a\nb", keep_newlines=True) == "a\nb"
    assert printable("a\nb") == "a\\nb"


def test_validate_shows_an_unknown_key_full_of_escapes_as_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps({"name": "x", ESCAPES: 1}))
    code, out, err = _run(capsys, "validate", str(manifest))
    assert code == 2
    _no_controls(out + err)
    assert "\\x1b]0;owned" in err


def test_run_shows_a_bad_manifest_key_as_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps({"name": "x", "permissions": {ESCAPES: []}}))
    plugin = tmp_path / "p.py"
    plugin.write_text("def f():\n    return 1\n")
    code, out, err = _run(capsys, "run", str(plugin), "--manifest", str(manifest), "--call", "f")
    assert code == 2
    _no_controls(out + err)


def _plugin_with_migrations(tmp_path: Path) -> tuple[Path, Path, Path]:
    folder = tmp_path / "plugin"
    (folder / "migrations").mkdir(parents=True)
    (folder / "p.py").write_text("def f():\n    return 1\n")
    manifest = folder / "manifest.toml"
    manifest.write_text(
        'name = "billing"\n[database]\ntablePrefix = "billing_"\nmigrations = "migrations"\n'
    )
    return folder / "p.py", manifest, folder / "migrations"


def _run_refused(
    capsys: pytest.CaptureFixture[str], plugin: Path, manifest: Path, data: Path
) -> dict[str, object]:
    code, out, err = _run(
        capsys,
        "run",
        str(plugin),
        "--manifest",
        str(manifest),
        "--call",
        "f",
        "--data-dir",
        str(data),
        "--json",
    )
    assert code == 2, (out, err)
    error = json.loads(out)["error"]
    assert error["code"] == "SAND_DB_MIGRATION_FAILED"
    assert "hunter2" not in out + err
    details = error["details"]
    assert isinstance(details, dict)
    return details


@pytest.mark.timeout(60)
def test_a_fifo_among_the_migrations_is_refused_without_blocking(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plugin, manifest, migrations = _plugin_with_migrations(tmp_path)
    os.mkfifo(migrations / "001_init.sql")  # nobody ever writes to it
    details = _run_refused(capsys, plugin, manifest, tmp_path / "data")
    assert details == {"migration": "001_init.sql", "reason": "not-a-regular-file"}


def test_a_migration_linked_to_a_host_file_is_refused_and_never_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plugin, manifest, migrations = _plugin_with_migrations(tmp_path)
    host_file = tmp_path / "host" / "backup.sql"
    host_file.parent.mkdir()
    host_file.write_text(HOST_SECRET)  # valid, in-prefix SQL: it would run if followed
    (migrations / "001_init.sql").symlink_to(host_file)
    details = _run_refused(capsys, plugin, manifest, tmp_path / "data")
    assert details == {"migration": "001_init.sql", "reason": "symlink"}


def test_a_migration_that_is_not_utf8_is_a_coded_refusal_not_an_internal_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plugin, manifest, migrations = _plugin_with_migrations(tmp_path)
    (migrations / "001_init.sql").write_bytes(b"CREATE TABLE billing_x (v TEXT); -- \xff\n")
    details = _run_refused(capsys, plugin, manifest, tmp_path / "data")
    assert details == {"migration": "001_init.sql", "reason": "not-utf8"}


@pytest.mark.timeout(60)
def test_an_endless_migration_is_refused_after_the_size_bound(tmp_path: Path) -> None:
    huge = tmp_path / "001_init.sql"
    with open(huge, "wb") as f:
        f.truncate(1 << 40)  # sparse: a terabyte the host must not try to hold
    with pytest.raises(SuaveplanError) as info:
        read_migration(huge)
    assert info.value.details == {"migration": "001_init.sql", "reason": "too-large"}
    exact = tmp_path / "002_ok.sql"
    exact.write_bytes(b" " * MAX_MIGRATION_BYTES)
    assert len(read_migration(exact)) == MAX_MIGRATION_BYTES


def test_a_folder_named_like_a_migration_is_a_coded_refusal(tmp_path: Path) -> None:
    (tmp_path / "001_init.sql").mkdir()
    with pytest.raises(SuaveplanError) as info:
        read_migration(tmp_path / "001_init.sql")
    assert info.value.details == {"migration": "001_init.sql", "reason": "not-a-regular-file"}
