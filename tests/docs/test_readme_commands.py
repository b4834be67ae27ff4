"""The commands the README and the CLI page show are the real ones, with the output shown."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from suaveplan_sandbox.cli import main

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
CLI_PAGE = (ROOT / "docs" / "cli.md").read_text()


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return {m for m in re.findall(r"^([a-z][a-z-]*):", text, re.MULTILINE)}


def test_quick_start_is_exactly_make_run_and_make_test() -> None:
    block = re.search(r"```sh\n(.*?)```", _section(README, "Quick start"), re.DOTALL)
    assert block is not None
    commands = [line.split("#")[0].strip() for line in block.group(1).splitlines()]
    assert [c for c in commands if c] == ["make run", "make test"]


def test_the_make_targets_table_lists_every_makefile_target_and_only_those() -> None:
    rows = re.findall(r"^\| `make ([a-z-]+)` \|", _section(README, "Make targets"), re.MULTILINE)
    assert len(rows) == len(set(rows))
    assert set(rows) == _makefile_targets()


def test_the_makefile_parser_sees_the_targets() -> None:  # so the test above can fail
    assert {"run", "test", "fuzz", "soak", "security-report", "docs"} <= _makefile_targets()


def _console_examples(page: str) -> list[tuple[str, list[str]]]:
    """`$ command` (with `\\` continuations) and the output lines under it, per console block."""
    examples: list[tuple[str, list[str]]] = []
    for block in re.findall(r"```console\n(.*?)```", page, re.DOTALL):
        lines = block.splitlines()
        i = 0
        while i < len(lines):
            if not lines[i].startswith("$ "):
                i += 1
                continue
            command = lines[i][2:]
            while command.endswith("\\"):
                i += 1
                command = command[:-1] + lines[i].strip()
            i += 1
            output: list[str] = []
            while i < len(lines) and not lines[i].startswith("$ "):
                output.append(lines[i])
                i += 1
            examples.append((command.split("  #")[0].strip(), output))
    return examples


def _checkable(command: str, output: list[str]) -> bool:
    """Commands whose whole output is shown and that change nothing in the tree."""
    if not command.startswith("suaveplan-sandbox ") or not output:
        return False
    if any("..." in line for line in output):
        return False
    return "--call summarize" not in command  # writes examples/invoices/reports/


CLI_EXAMPLES = [(c, o) for c, o in _console_examples(CLI_PAGE) if _checkable(c, o)]


def test_the_cli_page_has_examples_to_check() -> None:
    commands = [c.split()[1] for c, _ in CLI_EXAMPLES]
    assert {"check", "explain", "validate", "run"} <= set(commands)


@pytest.mark.parametrize(("command", "output"), CLI_EXAMPLES, ids=[c for c, _ in CLI_EXAMPLES])
def test_each_cli_example_prints_what_the_page_shows(
    command: str,
    output: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(ROOT)
    code = main(shlex.split(command)[1:])
    out, err = capsys.readouterr()
    assert (out + err).splitlines() == output
    expect_deny = any(line.startswith(("deny", "error SAND_PERM_DENIED")) for line in output)
    if "error SAND_MANIFEST_INVALID" in out + err:
        assert code == 2
    else:
        assert code == (1 if expect_deny or '"decision": "deny"' in out else 0)
