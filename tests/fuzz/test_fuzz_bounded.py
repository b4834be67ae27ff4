"""The atheris targets, run for a few seconds each by the real runner, and the runner itself.

The bounded run is the CI slice of `make fuzz`: every target must execute and find nothing.
The broken-target test proves that run can fail: a target whose code under test misbehaves
on one input is reported as a crash, its input saved, and the CLI exits 1.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fuzz import _runner, _target

_BOUNDED_SECONDS = 3


def test_every_target_runs_for_a_bounded_time_without_crashing(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "fuzz", "--seconds", str(_BOUNDED_SECONDS), "--json"]
    proc = subprocess.run(
        [*cmd, "--build-dir", str(tmp_path)],
        cwd=_target.REPO_ROOT,
        capture_output=True,
        timeout=90,
        check=False,
    )
    summary = json.loads(proc.stdout)
    assert set(summary) == {"targets"}
    assert set(summary["targets"]) == set(_runner.TARGETS)
    for name, figures in summary["targets"].items():
        log = (tmp_path / name / "fuzz.log").read_text(errors="replace")
        assert set(figures) == {"executions", "crashes", "seconds"}
        assert figures["crashes"] == 0, log[-3000:]
        assert isinstance(figures["executions"], int) and figures["executions"] > 0, log[-3000:]
        assert isinstance(figures["seconds"], float) and figures["seconds"] >= _BOUNDED_SECONDS
        assert any((tmp_path / name / "seeds").iterdir()), "seeds come from tests/vectors"
    assert proc.returncode == 0, proc.stderr[-3000:]


_BROKEN_TARGET = textwrap.dedent(
    '''
    """The real frame-decoder target with a decoder that fails uncoded on a `boom` log line."""
    from fuzz import frame_decoder
    from fuzz._target import run_target
    from suaveplan_sandbox.protocol import FrameDecoder, Log, encode


    class _Broken(FrameDecoder):
        __slots__ = ()

        def next_message(self):
            msg = super().next_message()
            if isinstance(msg, Log) and "boom" in msg.text:
                raise IndexError("an uncoded error escaping the decoder")
            return msg


    frame_decoder.FrameDecoder = _Broken
    run_target(
        frame_decoder.test_one_input,
        lambda: [bytes([0, 4]) + encode(Log(level="info", text="boom"))],
    )
    '''
)


def test_a_broken_target_is_reported_as_a_crash_with_its_input_saved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "broken_target.py").write_text(_BROKEN_TARGET, encoding="utf-8")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setitem(_runner.TARGETS, "broken", "broken_target")
    build = tmp_path / "build"

    status = _runner.main(["--seconds", "2", "--targets", "broken", "--json",
                           "--build-dir", str(build)])  # fmt: skip

    figures = json.loads(capsys.readouterr().out)["targets"]["broken"]
    log = (build / "broken" / "fuzz.log").read_text(errors="replace")
    assert status == 1
    assert figures["crashes"] >= 1, log[-3000:]
    crashes = sorted((build / "broken").glob("crash-*"))
    assert crashes, log[-3000:]
    assert b"boom" in crashes[0].read_bytes()
    assert "IndexError" in log


def test_a_clean_run_of_one_target_reports_no_crash(tmp_path: Path) -> None:
    (result,) = _runner.run_targets(
        {"frame_decoder": [sys.executable, "-m", _runner.TARGETS["frame_decoder"]]},
        seconds=1,
        build_dir=tmp_path,
    )
    assert (result.name, result.crashes, result.returncode) == ("frame_decoder", 0, 0)
    assert result.executions > 0
    assert not result.artifacts


def test_unknown_targets_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        _runner.main(["--targets", "frame_decoder,nope"])
    assert exit_info.value.code == 2
    assert "nope" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("log", "expected"),
    [
        (b"Done 1234 runs in 3 second(s)\nstat::number_of_executed_units: 1234\n", 1234),
        (b"#2\tINITED\n#4096\tpulse  cov: 1\n== ERROR: libFuzzer: fuzz target exited\n", 4096),
        (b"#7\tNEW\nDone 99 runs in 1 second(s)\n", 99),
        (b"INFO: Instrumenting x\n", 0),
    ],
)
def test_execution_counts_are_read_from_the_libfuzzer_log(log: bytes, expected: int) -> None:
    assert _runner.executions_from_log(log) == expected
