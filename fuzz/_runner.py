"""`python -m fuzz`: run each atheris target in its own interpreter for a bounded time.

Every target runs in a separate `sys.executable` subprocess (libFuzzer owns the process: a
crash ends it), concurrently, with `-max_total_time`. Per target, under
`build/fuzz/<target>/`: `seeds/` (rewritten from `tests/vectors/` each run), `corpus/`
(libFuzzer's growing corpus, kept between runs), `fuzz.log` (the last run's output) and any
crash inputs as `crash-*` / `timeout-*` / `oom-*` files (libFuzzer's `-artifact_prefix`).
`fuzz/dictionaries/<target>.dict`, when present, is passed as libFuzzer's `-dict`. Exit
status 1 when any target crashed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from fuzz._target import DEEP_ENV, REPO_ROOT, SEEDS_ENV

TARGETS: Final[Mapping[str, str]] = {
    "frame_decoder": "fuzz.frame_decoder",
    "url_check": "fuzz.url_check",
    "fs_check": "fuzz.fs_check",
    "sql_gate": "fuzz.sql_gate",
    "fs_inline_read": "fuzz.fs_inline_read",
}
DEFAULT_BUILD_DIR: Final = REPO_ROOT / "build" / "fuzz"
DICTIONARIES: Final = Path(__file__).resolve().parent / "dictionaries"
# Long runs can afford instrumenting third-party parsers (seconds of start-up).
_DEEP_AFTER_SECONDS: Final = 60
_ARTIFACT_KINDS: Final = ("crash-", "timeout-", "oom-", "leak-")
_EXECUTED = re.compile(rb"stat::number_of_executed_units:\s*(\d+)")
_DONE = re.compile(rb"Done (\d+) runs in")
_PROGRESS = re.compile(rb"^#(\d+)\s", re.MULTILINE)


@dataclass(frozen=True, slots=True, kw_only=True)
class TargetResult:
    """One target's run: executions counted by libFuzzer, crash inputs saved, wall seconds."""

    name: str
    executions: int
    crashes: int
    seconds: float
    artifacts: tuple[Path, ...]
    returncode: int
    log: Path


def _artifacts(directory: Path) -> set[Path]:
    return {p for p in directory.iterdir() if p.is_file() and p.name.startswith(_ARTIFACT_KINDS)}


def executions_from_log(text: bytes) -> int:
    """libFuzzer's execution count: the final stats, else `Done N runs`, else the last `#N`."""
    for pattern in (_EXECUTED, _DONE):
        found = pattern.findall(text)
        if found:
            return int(found[-1])
    progress = _PROGRESS.findall(text)
    return int(progress[-1]) if progress else 0


@dataclass(slots=True)
class _Running:
    name: str
    out: Path
    before: set[Path]
    proc: subprocess.Popen[bytes]
    started: float


def _start(name: str, command: Sequence[str], seconds: int, out: Path, deep: bool) -> _Running:
    corpus, seeds = out / "corpus", out / "seeds"
    corpus.mkdir(parents=True, exist_ok=True)
    seeds.mkdir(parents=True, exist_ok=True)
    for old in seeds.iterdir():
        old.unlink()
    env = dict(os.environ)
    env[SEEDS_ENV] = str(seeds)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(REPO_ROOT), env.get("PYTHONPATH"))))
    env.pop(DEEP_ENV, None)
    if deep:
        env[DEEP_ENV] = "1"
    argv = [
        *command,
        f"-max_total_time={seconds}",
        "-print_final_stats=1",
        f"-artifact_prefix={out}{os.sep}",
        "-rss_limit_mb=2048",
        "-timeout=30",
        str(corpus),
        str(seeds),
    ]
    dictionary = DICTIONARIES / f"{name}.dict"
    if dictionary.is_file():
        argv.insert(len(command), f"-dict={dictionary}")
    before = _artifacts(out)
    with (out / "fuzz.log").open("wb") as log:
        proc = subprocess.Popen(  # noqa: S603 — our own interpreter and target
            argv, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log
        )
    return _Running(name, out, before, proc, time.monotonic())


def run_targets(
    targets: Mapping[str, Sequence[str]],
    *,
    seconds: float,
    build_dir: Path = DEFAULT_BUILD_DIR,
) -> list[TargetResult]:
    """Run every `name -> command` target concurrently for `seconds` each; their results."""
    whole = max(1, math.ceil(seconds))
    deep = seconds >= _DEEP_AFTER_SECONDS
    running = [_start(n, c, whole, build_dir / n, deep) for n, c in targets.items()]
    results: list[TargetResult] = []
    # Start-up (instrumenting imports) comes on top of the fuzzing time; a hang is a crash.
    deadline = time.monotonic() + whole + 120
    for run in running:
        try:
            returncode = run.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            run.proc.kill()
            returncode = run.proc.wait()
        elapsed = time.monotonic() - run.started
        log = run.out / "fuzz.log"
        new = tuple(sorted(_artifacts(run.out) - run.before))
        crashes = len(new) if new else int(returncode != 0)
        results.append(
            TargetResult(
                name=run.name,
                executions=executions_from_log(log.read_bytes()),
                crashes=crashes,
                seconds=round(elapsed, 2),
                artifacts=new,
                returncode=returncode,
                log=log,
            )
        )
    return results


def as_json(results: Sequence[TargetResult]) -> dict[str, dict[str, dict[str, int | float]]]:
    """The `--json` document: `{"targets": {name: {executions, crashes, seconds}}}`."""
    return {
        "targets": {
            r.name: {"executions": r.executions, "crashes": r.crashes, "seconds": r.seconds}
            for r in results
        }
    }


def as_table(results: Sequence[TargetResult]) -> str:
    rows = [("target", "executions", "exec/s", "crashes", "seconds")]
    for r in results:
        rate = f"{r.executions / r.seconds:.0f}" if r.seconds else "-"
        rows.append((r.name, str(r.executions), rate, str(r.crashes), f"{r.seconds:.1f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    for r in results:
        for artifact in r.artifacts:
            lines.append(f"{r.name}: crash input saved to {artifact} (log: {r.log})")
    return "\n".join(lines)


def _parse_targets(text: str | None) -> list[str]:
    if text is None:
        return list(TARGETS)
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in TARGETS]
    if unknown or not names:
        known = ", ".join(TARGETS)
        raise argparse.ArgumentTypeError(f"unknown target(s) {unknown}; known: {known}")
    return names


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fuzz", description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="fuzzing time per target")
    parser.add_argument("--targets", help=f"comma-separated subset of {','.join(TARGETS)}")
    parser.add_argument("--json", action="store_true", help="print the JSON summary only")
    parser.add_argument("--build-dir", type=Path, default=DEFAULT_BUILD_DIR, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.seconds <= 0:
        parser.error("--seconds must be positive")
    try:
        names = _parse_targets(args.targets)
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    commands = {n: [sys.executable, "-m", TARGETS[n]] for n in names}
    results = run_targets(commands, seconds=args.seconds, build_dir=args.build_dir)
    if args.json:
        print(json.dumps(as_json(results)))
    else:
        print(as_table(results))
    return 1 if any(r.crashes for r in results) else 0
