"""`make security-report`: run the boundary evidence and print it as one table.

Four producers feed it, each already part of the repository:

* the escape corpus (`tests/security/`) and the fault-injection tests (`tests/faults/`),
  which append one JSON row per technique or fault through the suite's `security_record`
  fixture when `SUAVEPLAN_SECURITY_REPORT_DIR` is set;
* the atheris fuzz runner, `python -m fuzz --seconds S --json`;
* the soak, `python -m benchmarks.soak --seconds S --sandboxes K --json`.

The table is the evidence the README's security section quotes. The script exits 1 when
any technique got out, any fault was not survived, a fuzz target crashed, the soak did not
end flat, or a producer failed to run — a report is never greener than its inputs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
REPORT_DIR_ENV = "SUAVEPLAN_SECURITY_REPORT_DIR"


@dataclass
class Tally:
    tried: int = 0
    contained: int = 0


@dataclass
class Report:
    """Everything the table shows; `problems` lists why the report is not green."""

    escapes: dict[str, dict[str, Tally]] = field(default_factory=dict)  # family -> layer -> tally
    faults: dict[str, Tally] = field(default_factory=dict)  # kind -> injected/survived
    fuzz: dict[str, dict[str, float]] = field(default_factory=dict)  # target -> figures
    soak: dict[str, Any] | None = None
    machine: dict[str, str] = field(default_factory=dict)  # what the evidence ran on
    problems: list[str] = field(default_factory=list)


def read_rows(path: Path) -> list[dict[str, Any]]:
    """JSON lines written by `security_record`; a malformed line is a problem, not a skip."""
    if not path.exists():
        return []
    rows: list[dict[str, Any]] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        value = json.loads(line)
        if not isinstance(value, dict):
            raise ValueError(f"{path.name}:{number}: expected a JSON object")
        rows.append(value)
    return rows


def add_escapes(report: Report, rows: Iterable[Mapping[str, Any]]) -> None:
    for row in rows:
        family = str(row.get("family", "?"))
        layer = str(row.get("layer", "both"))
        tally = report.escapes.setdefault(family, {}).setdefault(layer, Tally())
        tally.tried += 1
        if row.get("contained") is True:
            tally.contained += 1
        else:
            report.problems.append(f"escape {row.get('technique', '?')} ({layer}) not contained")


def add_faults(report: Report, rows: Iterable[Mapping[str, Any]]) -> None:
    for row in rows:
        kind = str(row.get("kind", "?"))
        tally = report.faults.setdefault(kind, Tally())
        injected = int(row.get("injected", 0))
        survived = int(row.get("survived", 0))
        tally.tried += injected
        tally.contained += survived
        if survived < injected:
            report.problems.append(f"fault {kind}: {injected - survived} not survived")


def add_fuzz(report: Report, summary: Mapping[str, Any]) -> None:
    targets = summary.get("targets", {})
    if not targets:
        report.problems.append("fuzz: no targets ran")
    for name, figures in targets.items():
        report.fuzz[str(name)] = {k: float(v) for k, v in figures.items()}
        if int(figures.get("crashes", 0)):
            report.problems.append(f"fuzz {name}: {figures['crashes']} crash(es)")
        if not int(figures.get("executions", 0)):
            report.problems.append(f"fuzz {name}: no executions")


def add_soak(report: Report, summary: Mapping[str, Any]) -> None:
    report.soak = dict(summary)
    if summary.get("flat") is not True:
        report.problems.append(f"soak: resource growth not flat: {summary.get('growth')}")


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    cells = [list(map(str, header))] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]

    def line(r: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |"

    return [line(cells[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [
        line(r) for r in cells[1:]
    ]


def render(report: Report) -> str:
    """One Markdown table per evidence kind under a single heading, ready to paste."""
    out: list[str] = []
    if report.machine:
        out.append("Machine: " + ", ".join(f"{k} {v}" for k, v in report.machine.items()))
        out.append("")
    layers = sorted({layer for by_layer in report.escapes.values() for layer in by_layer})
    rows: list[list[object]] = []
    totals = {layer: Tally() for layer in layers}
    for family in sorted(report.escapes):
        row: list[object] = [family]
        for layer in layers:
            tally = report.escapes[family].get(layer, Tally())
            totals[layer].tried += tally.tried
            totals[layer].contained += tally.contained
            row.append(f"{tally.contained}/{tally.tried}" if tally.tried else "-")
        rows.append(row)
    rows.append(["**all**", *(f"{t.contained}/{t.tried}" for t in totals.values())])
    out.append("Escape techniques (contained/tried)")
    out.append("")
    out.extend(_table(["family", *layers], rows))
    out.append("")
    out.append("Faults (survived/injected)")
    out.append("")
    fault_rows: list[list[object]] = [
        [kind, f"{t.contained}/{t.tried}"] for kind, t in sorted(report.faults.items())
    ]
    out.extend(_table(["fault", "survived/injected"], fault_rows or [["(none ran)", "-"]]))
    out.append("")
    out.append("Fuzzing (atheris)")
    out.append("")
    fuzz_rows: list[list[object]] = [
        [name, int(f.get("executions", 0)), int(f.get("crashes", 0)), f"{f.get('seconds', 0):.0f}"]
        for name, f in sorted(report.fuzz.items())
    ]
    out.extend(
        _table(["target", "executions", "crashes", "seconds"], fuzz_rows or [["(none)", 0, 0, 0]])
    )
    out.append("")
    out.append("Soak")
    out.append("")
    if report.soak is None:
        out.append("(did not run)")
    else:
        s = report.soak
        growth = s.get("growth", {})
        out.extend(
            _table(
                ["seconds", "sandboxes", "calls", "calls/s", "p50 ms", "p99 ms", "growth", "flat"],
                [
                    [
                        f"{float(s.get('seconds', 0)):.0f}",
                        s.get("sandboxes"),
                        s.get("calls"),
                        f"{float(s.get('throughput_per_s', 0)):.0f}",
                        f"{float(s.get('p50_ms', 0)):.2f}",
                        f"{float(s.get('p99_ms', 0)):.2f}",
                        ", ".join(f"{k} {v:+g}" for k, v in growth.items()),
                        "yes" if s.get("flat") is True else "NO",
                    ]
                ],
            )
        )
    out.append("")
    out.append("Result: " + ("all contained" if not report.problems else "PROBLEMS"))
    out.extend(f"- {p}" for p in report.problems)
    return "\n".join(out) + "\n"


def machine_facts() -> dict[str, str]:
    """Interpreter, kernel and which hardening layers this machine gives the VM workers."""
    from suaveplan_sandbox.vm._hardening import probe_hardening

    layers = probe_hardening()
    missing = {name: why for name, why in layers.items() if why != "ok"}
    return {
        "python": platform.python_version(),
        "kernel": platform.release(),
        "hardening": "all layers" if not missing else f"missing {missing}",
    }


def _run(cmd: list[str], env: Mapping[str, str], report: Report, what: str) -> str:
    print(f"security-report: {what} ...", file=sys.stderr, flush=True)
    # The commands are fixed argv lists built above from sys.executable; no shell, no input.
    done = subprocess.run(  # noqa: S603
        cmd, check=False, cwd=REPO, env=dict(env), capture_output=True, text=True
    )
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip().splitlines()[-15:]
        report.problems.append(f"{what} exited {done.returncode}: " + " / ".join(tail))
    return done.stdout


def _json_from(stdout: str, report: Report, what: str) -> dict[str, Any] | None:
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            value = json.loads(line)
            if isinstance(value, dict):
                return value
    report.problems.append(f"{what}: no JSON summary in its output")
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--fuzz-seconds", type=int, default=20, help="per fuzz target")
    parser.add_argument("--soak-seconds", type=int, default=60)
    parser.add_argument("--sandboxes", type=int, default=16)
    parser.add_argument("--output", type=Path, default=REPO / "build" / "security-report.md")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)

    report = Report(machine=machine_facts())
    py = sys.executable
    with tempfile.TemporaryDirectory(prefix="suaveplan-security-") as directory:
        env = dict(os.environ, **{REPORT_DIR_ENV: directory})
        _run(
            [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/security", "tests/faults"],
            env,
            report,
            "escape corpus and fault injection (pytest)",
        )
        add_escapes(report, read_rows(Path(directory) / "escapes.jsonl"))
        add_faults(report, read_rows(Path(directory) / "faults.jsonl"))
    if not report.escapes:
        report.problems.append("escape corpus recorded no rows")
    fuzz_cmd = [py, "-m", "fuzz", "--seconds", str(args.fuzz_seconds), "--json"]
    fuzz_out = _run(fuzz_cmd, os.environ, report, "fuzz")
    fuzz = _json_from(fuzz_out, report, "fuzz")
    if fuzz is not None:
        add_fuzz(report, fuzz)
    soak_cmd = [py, "-m", "benchmarks.soak", "--seconds", str(args.soak_seconds)]
    soak_cmd += ["--sandboxes", str(args.sandboxes), "--json"]
    soak_out = _run(soak_cmd, os.environ, report, "soak")
    soak = _json_from(soak_out, report, "soak")
    if soak is not None:
        add_soak(report, soak)

    text = render(report)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text, encoding="utf-8")
    if args.json:
        print(json.dumps({"problems": report.problems, "table": text}))
    else:
        print(text, end="")
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
