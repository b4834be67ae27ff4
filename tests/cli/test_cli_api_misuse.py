"""The command line under a careless or hostile caller: garbled arguments, a reader that goes
away, a full disk, Ctrl-C. Each ends with a documented exit code and at most one line on
stderr, never a traceback, and never an exit code that reads as an allow or a deny.

Exit codes pinned here beyond 0-3: 130 for Ctrl-C (128 + SIGINT) and 141 for a broken pipe
(128 + SIGPIPE), as a shell reports a process those signals ended.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from suaveplan_sandbox.cli import main

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "invoices" / "manifest.toml"


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "suaveplan_sandbox.cli", *args]


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _plugin(tmp: Path) -> tuple[Path, Path]:
    plugin = tmp / "plugin.py"
    plugin.write_text(
        "def echo(*args):\n    return list(args)\n\n"
        "def odd():\n    return [float('nan'), float('inf'), -float('inf'), 1.5]\n\n"
        "def spin():\n    while True:\n        pass\n"
    )
    manifest = tmp / "manifest.toml"
    manifest.write_text('name = "cli-misuse"\n')
    return plugin, manifest


# -- a reader that goes away, an output that cannot be written ---------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["check", "--manifest", str(EXAMPLE), "fs", "./uploads/a.csv"],  # an allow
        ["check", "--manifest", str(EXAMPLE), "fs", "./etc/passwd"],  # a deny
        ["check", "--manifest", str(EXAMPLE), "fs", "./uploads/a.csv", "--json"],
        ["check", "--json"],  # a usage error, reported on stdout under --json
        ["validate", str(EXAMPLE)],
        ["--help"],
    ],
    ids=["allow", "deny", "allow-json", "usage-json", "validate", "help"],
)
def test_a_reader_that_went_away_is_exit_141_without_a_traceback(argv: list[str]) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # `| head -c0`: nobody will read what is written
    try:
        done = subprocess.run(
            _cli(*argv), stdout=write_end, stderr=subprocess.PIPE, timeout=120, check=False
        )
    finally:
        os.close(write_end)
    assert done.returncode == 141
    assert b"Traceback" not in done.stderr and b"Exception ignored" not in done.stderr


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_an_output_that_cannot_be_written_is_one_line_and_exit_3(as_json: bool) -> None:
    # An allow prints on stdout; under --json so does an error (here, a missing manifest).
    argv = (
        ["check", "--manifest", "absent.toml", "fs", "./a", "--json"]
        if as_json
        else ["check", "--manifest", str(EXAMPLE), "fs", "./uploads/a.csv"]
    )
    with Path("/dev/full").open("wb") as full:
        done = subprocess.run(
            _cli(*argv), stdout=full, stderr=subprocess.PIPE, timeout=120, check=False
        )
    assert done.returncode == 3
    lines = done.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("internal error:"), lines


def test_a_fifo_given_as_the_manifest_is_refused_without_blocking(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = tmp_path / "manifest.toml"
    os.mkfifo(fifo)  # nobody writes to it: opening it for reading would wait for ever
    codes: list[int] = []
    worker = threading.Thread(target=lambda: codes.append(main(["validate", str(fifo)])))
    worker.daemon = True
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), "validate blocked on the FIFO"
    assert codes == [2]
    assert "SAND_MANIFEST_INVALID" in capsys.readouterr().err


# -- Ctrl-C --------------------------------------------------------------------------------


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_ctrl_c_mid_run_is_exit_130_and_leaves_no_worker(tmp_path: Path, as_json: bool) -> None:
    plugin, manifest = _plugin(tmp_path)
    argv = ["run", str(plugin), "--manifest", str(manifest), "--call", "spin"]
    proc = subprocess.Popen(
        _cli(*argv, *(["--json"] if as_json else [])),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        # Wait until the worker is spinning: the fork server and its worker are children.
        deadline = time.monotonic() + 60
        family: list[psutil.Process] = []
        while len(family) < 2 and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
            family = psutil.Process(proc.pid).children(recursive=True)
            time.sleep(0.05)
        assert len(family) >= 2, "the worker never started"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130
    assert b"Traceback" not in err
    assert err.decode().strip() == "interrupted"
    assert out == b""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        alive = [p for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not alive:
            break
        time.sleep(0.05)
    assert not alive, alive


def test_an_interrupt_inside_a_command_is_exit_130_in_process(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from suaveplan_sandbox.cli import _main

    def interrupted(*_args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(_main, "_decide", interrupted)
    code, out, err = _run(capsys, "check", "--manifest", str(EXAMPLE), "fs", "./a", "--json")
    assert code == 130
    assert out == ""
    assert err.strip() == "interrupted"


# -- garbled arguments -------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    ["[" * 5000 + "]" * 5000, "[NaN]", "[Infinity]", "[-Infinity]"],
    ids=["nested-5000", "nan", "infinity", "minus-infinity"],
)
def test_args_that_are_not_json_are_a_usage_error_not_an_internal_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: str
) -> None:
    plugin, manifest = _plugin(tmp_path)
    argv = ["run", str(plugin), "--manifest", str(manifest), "--call", "echo", "--args", args]
    code, out, _err = _run(capsys, *argv, "--json")
    assert code == 2
    assert json.loads(out)["error"]["code"] == "SAND_INVALID_ARGUMENT"


def test_a_result_holding_nan_or_infinity_is_printed_as_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plugin, manifest = _plugin(tmp_path)
    argv = ["run", str(plugin), "--manifest", str(manifest), "--call", "odd"]
    code, out, _err = _run(capsys, *argv, "--json")
    assert code == 0
    strict = json.loads(out, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    assert strict == {"result": [{"float": "nan"}, {"float": "inf"}, {"float": "-inf"}, 1.5]}


@pytest.mark.parametrize(
    ("module_source", "spec"),
    [
        ("", "cli_misuse_empty_host:Nothing"),  # no such object
        ("Factories = object()\n", "cli_misuse_no_factories:Factories"),  # nothing to run
        ("raise RuntimeError('host import failed')\n", "cli_misuse_raising_host:Factories"),
        ("def broken(:\n", "cli_misuse_syntax_host:Factories"),
        (None, ".relative:Factories"),
        (None, ":Factories"),
    ],
    ids=["no-object", "no-factories", "raises-on-import", "syntax-error", "relative", "no-module"],
)
def test_a_host_that_cannot_be_used_is_a_usage_error_never_a_pass(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    module_source: str | None,
    spec: str,
) -> None:
    if module_source is not None:
        module = spec.partition(":")[0]
        (tmp_path / f"{module}.py").write_text(module_source)
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.delitem(sys.modules, module, raising=False)
    code, out, _err = _run(capsys, "conformance", "--host", spec, "--json")
    assert code == 2
    assert json.loads(out)["error"]["code"] == "SAND_INVALID_ARGUMENT"


def test_the_help_documents_every_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _err = _run(capsys, "--help")
    assert code == 0
    text = " ".join(out.split())
    for documented in ("0 allow", "1 deny", "2 invalid", "3 internal", "130 interrupted", "141"):
        assert documented in text, documented
