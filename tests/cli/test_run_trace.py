"""`run --trace` streams each decision while the plugin is still running (not at the end)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from pathlib import Path

PLUGIN = """\
from suaveplan import fs


def slow():
    fs.read_text("/data/a.txt")
    try:
        fs.read_text("/secret.txt")
    except Exception:
        pass
    n = 0
    while True:
        n += 1
"""


def _read_lines(stream: object, lines: list[str], wanted: int, done: threading.Event) -> None:
    for line in stream:  # type: ignore[attr-defined]
        lines.append(line)
        if len(lines) >= wanted:
            done.set()
            return


def test_trace_lines_arrive_while_the_plugin_is_still_running(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.txt").write_text("x")
    (tmp_path / "secret.txt").write_text("s")
    (tmp_path / "plugin.py").write_text(PLUGIN)
    manifest = tmp_path / "manifest.json"
    manifest.write_text(
        json.dumps(
            {
                "name": "tracer",
                "kind": "python",
                "permissions": {"fs": ["./data/*"], "budgets": {"wallClockMs": 60000}},
            }
        )
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "suaveplan_sandbox.cli",
            "run",
            str(tmp_path / "plugin.py"),
            "--manifest",
            str(manifest),
            "--call",
            "slow",
            "--trace",
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    done = threading.Event()
    reader = threading.Thread(target=_read_lines, args=(proc.stderr, lines, 2, done), daemon=True)
    reader.start()
    try:
        assert done.wait(timeout=50), f"no trace within the budget: {lines}"
        # the plugin is spinning inside its 60 s budget: the lines were streamed, not batched
        assert proc.poll() is None
    finally:
        # Ctrl-C lets the CLI dispose the sandbox (kill its worker) on the way out.
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    traces = [json.loads(line)["trace"] for line in lines]
    assert [(t["capability"], t["allowed"], t["rule"], t["reason"]) for t in traces] == [
        ("fs", True, "./data/*", None),
        ("fs", False, None, "path-not-in-allowlist"),
    ]
