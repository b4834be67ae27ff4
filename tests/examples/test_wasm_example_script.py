"""`python examples/wasm/run.py` runs the C example under its manifest on a scratch copy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).parents[2] / "examples" / "wasm"


def test_the_wasm_example_script_reads_input_writes_output_and_is_refused_private() -> None:
    before = sorted(p.name for p in (EXAMPLE / "output").iterdir())
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE / "run.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "read input: ok (sum 12)",
        "write output: ok",
        "write input: refused (errno 63)",  # WASI EPERM-class errno for a read-only preopen
        "read private: refused (errno 44)",  # WASI ENOENT: /private is not preopened at all
        "output/result.txt: sum=12",
    ]
    # it worked on a scratch copy: the example folder is unchanged
    assert sorted(p.name for p in (EXAMPLE / "output").iterdir()) == before
