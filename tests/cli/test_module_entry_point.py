"""`python -m suaveplan_sandbox` is the same command line as `suaveplan-sandbox`, and importing
the package still does not import the CLI (only running it as `__main__` does)."""

from __future__ import annotations

import subprocess
import sys


def test_python_dash_m_on_the_package_runs_the_cli() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "suaveplan_sandbox", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Usage: python -m suaveplan_sandbox [OPTIONS] COMMAND"), (
        done.stdout
    )
    for command in ("check", "validate", "run", "conformance", "demo", "reference"):
        assert f"\n  {command} " in done.stdout, command


def test_a_usage_error_through_the_package_entry_point_keeps_its_exit_code() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "suaveplan_sandbox", "check", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    assert '"SAND_INVALID_ARGUMENT"' in done.stdout


def test_importing_the_package_does_not_import_the_cli() -> None:
    probe = (
        "import sys, suaveplan_sandbox\n"
        "assert not [m for m in sys.modules if m.startswith('suaveplan_sandbox.cli')]\n"
        "assert 'click' not in sys.modules\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr


def test_importing_the_entry_module_runs_nothing() -> None:
    # A tool walking the package (docs, coverage) imports every module: that must not exit.
    import importlib

    importlib.import_module("suaveplan_sandbox.__main__")
