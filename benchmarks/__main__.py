"""`make bench`: run every `benchmarks/bench_*.py` and print one table of ratios."""

from __future__ import annotations

import importlib
import pkgutil
import sys
import traceback
from pathlib import Path

from rich.console import Console
from rich.table import Table

from benchmarks._harness import BenchRow


def _fmt(seconds: float) -> str:
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.2f} µs"


def main(argv: list[str]) -> int:
    wanted = set(argv)
    here = Path(__file__).parent
    table = Table(title="suaveplan-sandbox benchmarks (ratios within one run)")
    for col in ("benchmark", "value", "baseline", "baseline value", "ratio", "target", "ok"):
        table.add_column(col)
    failures = 0
    for info in sorted(pkgutil.iter_modules([str(here)]), key=lambda m: m.name):
        if not info.name.startswith("bench_"):
            continue
        if wanted and info.name.removeprefix("bench_") not in wanted:
            continue
        try:
            module = importlib.import_module(f"benchmarks.{info.name}")
            rows: list[BenchRow] = module.run()
        except Exception:  # one broken benchmark must not hide the others
            traceback.print_exc()
            failures += 1
            continue
        for row in rows:
            table.add_row(
                row.name,
                _fmt(row.value_s),
                row.baseline_name,
                _fmt(row.baseline_s),
                f"{row.ratio:.3g}x",
                row.target,
                "—" if row.ok is None else "yes" if row.ok else "NO",
            )
    Console().print(table)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
