"""Survey the system calls a hardened VM worker makes once its seccomp filter is installed.

The worker's filter is an allow list (`vm/_hardening/_apply.py`, `_ALLOWED_SYSCALLS`): this
survey is how that list was drawn up, and how to redo it after a Python, glibc or kernel
upgrade. For each interpreter it runs, under `strace -f`,

* the VM and security suites (`pytest tests/vm tests/security`), which fork real workers
  through the fork server and hardened children of their own; and
* `exercise`: a plugin that uses every allowlisted stdlib module, big allocations, the
  `suaveplan` log and a CPU budget, run in a real sandbox (this script, second mode);

then splits the trace by process: a process (or thread) counts as a worker from the
`prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ...)` that succeeded in it, and a thread it
clones from its start. Everything else is the host, the fork server, or a worker before
hardening, and is listed separately. Each worker syscall is recorded with its count, its
results (`ok` or the errno), a few argument samples and the first tests that made it (a
pytest plugin in this module marks each test's start in the trace with an `access()` of a
path naming it). Under the allow list a refused call shows as EPERM: the suites' red-team
probes make rows that only ever got EPERM, while a call some legitimate code needs and the
list lacks would show EPERM *and* fail a test (the pytest exit status is recorded).

    python scripts/seccomp_survey.py run --python .venv/bin/python \
        --python /tmp/venv3.12/bin/python --python /tmp/venv3.13/bin/python \
        --out /tmp/seccomp_survey.json -- tests/vm tests/security
    python scripts/seccomp_survey.py table /tmp/seccomp_survey.json

Arguments after `--` are pytest's (`--ignore=...` for a module that is broken for other
reasons). `run` takes a few minutes per interpreter (strace slows every syscall) and needs
`strace`; tests sensitive to timing may fail under it, which does not spoil the survey.
`tests/vm/hardening/seccomp_survey.json` holds such a run under the allow list (`pythons`)
and, under `before`, one made with the deny list the allow list replaced (that filter is no
longer in the code; those rows show what the red-team probes tried with only the deny list
in the way). Raw traces are written to a temporary directory (`--keep DIR` keeps them) and
parsed once each run ends.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
MARKER = "/nonexistent-seccomp-survey-test/"
SUITES = ("tests/vm", "tests/security")
_ARG_SAMPLES = 2

# -- the pytest plugin: `-p seccomp_survey` with this directory on PYTHONPATH ----------------


def pytest_runtest_logstart(nodeid: str, location: object) -> None:
    """Mark a test's start in the trace: the host's `access()` of a path naming it."""
    os.access(MARKER + nodeid, os.F_OK)


# -- the stdlib exerciser: a plugin run in a real sandbox ------------------------------------

EXERCISE_PLUGIN = r"""
import base64
import binascii
import cmath
import collections
import csv
import dataclasses
import datetime
import decimal
import enum
import fractions
import functools
import hashlib
import hmac
import io
import itertools
import json
import math
import random
import re
import statistics
import textwrap
import typing
import urllib.parse
import uuid
from suaveplan import log


@dataclasses.dataclass
class Point:
    x: int
    y: int


class Colour(enum.Enum):
    RED = 1


def stdlib():
    out = {}
    out["json"] = json.loads(json.dumps({"a": [1, 2.5, "x" * 1000, None]}))["a"][1]
    out["re"] = len(re.findall(r"(\w+)@(\w+)\.com", "a@b.com c@d.com " * 2000))
    now = datetime.datetime.now()
    utc = datetime.datetime.now(datetime.timezone.utc)
    out["dt"] = [
        now.isoformat(),
        utc.astimezone().isoformat(),
        datetime.datetime.strptime("2024-01-02 10:11", "%Y-%m-%d %H:%M").strftime("%A %c %Z"),
        datetime.date.today().isoformat(),
        str(now.timetuple()),
        datetime.datetime.fromtimestamp(1_700_000_000).isoformat(),
    ]
    with decimal.localcontext() as ctx:
        ctx.prec = 60
        out["decimal"] = str(decimal.Decimal(1) / decimal.Decimal(7))
    out["fractions"] = str(fractions.Fraction(3, 7) ** 5)
    data = [random.random() for _ in range(10000)]
    out["statistics"] = [
        statistics.mean(data),
        statistics.median(data),
        statistics.stdev(data),
        statistics.NormalDist(0, 1).cdf(0.5),
    ]
    rng = random.Random()
    out["random"] = [
        rng.random(),
        random.randint(1, 6),
        random.SystemRandom().random(),
        len(random.randbytes(64)),
        random.sample(range(100), 5),
    ]
    random.seed()
    random.shuffle(data)
    out["hashlib"] = [
        hashlib.sha256(b"x" * 1_000_000).hexdigest(),
        hashlib.md5(b"x").hexdigest(),
        hashlib.sha1(b"x").hexdigest(),
        hashlib.blake2b(b"x").hexdigest(),
        hashlib.sha3_256(b"x").hexdigest(),
        hashlib.new("sha512", b"x").hexdigest(),
        hashlib.pbkdf2_hmac("sha256", b"pw", b"salt", 2000).hex(),
        hashlib.scrypt(b"pw", salt=b"salt", n=1024, r=8, p=1).hex(),
    ]
    out["hmac"] = hmac.compare_digest(hmac.new(b"k", b"m", "sha256").hexdigest(), "0")
    out["uuid"] = [str(uuid.uuid4()), str(uuid.uuid5(uuid.NAMESPACE_DNS, "example.com"))]
    buf = io.StringIO()
    writer = csv.writer(buf)
    for i in range(1000):
        writer.writerow([i, "a,b", 'q"uote'])
    rows = list(csv.reader(io.StringIO(buf.getvalue())))
    out["csv"] = [len(rows), csv.Sniffer().sniff("a;b;c\n1;2;3\n").delimiter]
    out["text"] = [
        textwrap.fill("word " * 200, 40)[:20],
        base64.b64encode(b"\x00\xff" * 100).decode()[:10],
        binascii.crc32(b"x" * 10000),
        urllib.parse.urlsplit("http://ex\u00e4mple.com:8080/p?q=1#f").hostname,
        urllib.parse.quote("a b/\u00e9"),
        "\u00e9t\u00e9".encode("cp1252").decode("cp1252"),
        "\u65e5\u672c".encode("shift_jis").decode("shift_jis"),
        "x".encode("utf-16").decode("utf-16"),
    ]
    out["collections"] = collections.Counter("abracadabra" * 100).most_common(2)
    out["itertools"] = list(itertools.islice(itertools.permutations(range(6)), 3))
    out["functools"] = functools.reduce(lambda a, b: a + b, range(1000))
    out["cmath"] = str(cmath.sqrt(-1))
    out["math"] = [math.sqrt(2), math.factorial(500) % 1000, math.lgamma(3.5)]
    out["dataclasses"] = dataclasses.asdict(Point(1, 2))
    out["enum"] = Colour.RED.name
    out["typing"] = str(typing.Optional[int])
    print("printed", len(out))
    log.info("logged")
    return len(out)


def big():
    total = 0
    block = bytearray(200_000_000)
    block[-1] = 1
    total += len(block)
    del block
    grow = b""
    for _ in range(40):
        grow = grow + b"y" * 1_000_000
    total += len(grow)
    del grow
    items = []
    for i in range(3_000_000):
        items.append(i)
    total += len(items)
    del items
    text = "z" * 80_000_000
    total += len(text.replace("z", "zz"))
    chunks = [bytes(100_000) for _ in range(500)]
    total += len(b"".join(chunks))
    return total


def spin():
    n = 0
    while n < 3_000_000:
        n += 1
    return n


def too_big():
    return len(bytearray(2_000_000_000))
"""


def exercise() -> int:
    """Run EXERCISE_PLUGIN's functions in a real sandbox (what `run` traces)."""
    from suaveplan_sandbox.errors import SuaveplanError
    from suaveplan_sandbox.permissions import PermissionPolicy
    from suaveplan_sandbox.vm import create_vm_sandbox_sync

    with tempfile.TemporaryDirectory() as tmp:
        plugin = Path(tmp) / "plugin.py"
        plugin.write_text(EXERCISE_PLUGIN)
        manifest: dict[str, object] = {
            "name": "seccomp-survey",
            "version": "1.0.0",
            "permissions": {"budgets": {"wallClockMs": 60_000, "memoryMb": 1024}},
        }
        policy = PermissionPolicy.from_manifest(manifest, root=Path(tmp))
        with create_vm_sandbox_sync(plugin_module_path=str(plugin), policy=policy) as sb:
            for name in ("stdlib", "big", "spin", "stdlib", "too_big"):
                try:
                    print(name, sb.call(name))
                except SuaveplanError as exc:
                    print(name, "failed:", exc.code)
    return 0


# -- parsing strace -f output -----------------------------------------------------------------

_LINE = re.compile(r"^(\d+) +(.*)$")
_CALL = re.compile(r"^([a-z_0-9]+)\((.*)$")
_RESUMED = re.compile(r"^<\.\.\. ([a-z_0-9]+) resumed>(.*)$")
_RESULT = re.compile(r"\) += (-?\d+|\?|0x[0-9a-f]+)(?: ([A-Z][A-Z0-9_]+))?")
_EXIT = re.compile(r"^\+\+\+ (exited|killed)")
_FILTER_ON = ("prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER", "seccomp(SECCOMP_SET_MODE_FILTER")
_NEW_TASK = frozenset({"clone", "clone3", "fork", "vfork"})


def _result(text: str) -> str | None:
    """`ok`, the errno name, or None when the line has no result (unfinished)."""
    match = _RESULT.search(text)
    if match is None:
        return None
    value, name = match.groups()
    if value.startswith("-") and name:
        return name
    return "ok"


@dataclass
class _Task:
    """One incarnation of a pid in the trace."""

    filtered_from: int | None = None  # line number of its own filter install
    parent: tuple[int, int] | None = None  # (pid, generation) that cloned it
    cloned_at: int = 0
    before: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    after: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    first_test: dict[str, str] = field(default_factory=dict)
    samples: dict[str, list[str]] = field(default_factory=dict)
    before_tests: dict[str, str] = field(default_factory=dict)
    before_samples: dict[str, list[str]] = field(default_factory=dict)


def _lines(path: Path) -> Iterator[str]:
    with path.open(encoding="utf-8", errors="replace") as trace:
        yield from trace


def parse_trace(lines: Iterable[str]) -> dict[str, Any]:
    """Split an `strace -f` trace into worker (post-filter) and other syscalls."""
    generation: dict[int, int] = collections.defaultdict(int)
    tasks: dict[tuple[int, int], _Task] = collections.defaultdict(_Task)
    pending: dict[int, tuple[str, str, str]] = {}  # pid -> (syscall, test, args)
    test = "(before the first test)"
    for number, raw in enumerate(lines):
        line = _LINE.match(raw.rstrip("\n"))
        if line is None:
            continue
        pid, rest = int(line.group(1)), line.group(2)
        if MARKER in rest:
            test = rest.split(MARKER, 1)[1].split('"', 1)[0]
        if _EXIT.match(rest):
            generation[pid] += 1
            pending.pop(pid, None)
            continue
        key = (pid, generation[pid])
        task = tasks[key]
        resumed = _RESUMED.match(rest)
        if resumed:
            if pid not in pending:
                continue
            name, started_in, args = pending.pop(pid)
            tail = resumed.group(2)
        else:
            call = _CALL.match(rest)
            if call is None:
                continue  # a signal line
            name, args = call.group(1), call.group(2)
            started_in = test
            if rest.endswith("<unfinished ...>"):
                pending[pid] = (name, test, args)
                continue
            tail = rest
        result = _result(tail) or "?"
        installs = any(start in f"{name}({args}" for start in _FILTER_ON) and result == "ok"
        if installs and task.filtered_from is None:
            task.filtered_from = number
            task.before[(name, result)] += 1
            continue
        if name in _NEW_TASK and result == "ok":
            child_pid = _RESULT.search(tail)
            if child_pid is not None and child_pid.group(1).isdigit():
                child = int(child_pid.group(1))
                if child > 0:
                    child_task = tasks[(child, generation[child])]
                    child_task.parent = key
                    child_task.cloned_at = number
        own = task.after if task.filtered_from is not None else task.before
        own[(name, result)] += 1
        tests = task.first_test if task.filtered_from is not None else task.before_tests
        samples = task.samples if task.filtered_from is not None else task.before_samples
        tests.setdefault(name, started_in)
        seen = samples.setdefault(name, [])
        sample = args[:100]
        if len(seen) < _ARG_SAMPLES and sample not in seen:
            seen.append(sample)

    def inherited(task: _Task, depth: int = 0) -> bool:
        parent = task.parent
        if parent is None or depth > 64 or parent not in tasks:
            return False
        up = tasks[parent]
        if up.filtered_from is not None and up.filtered_from < task.cloned_at:
            return True
        return inherited(up, depth + 1)

    worker: dict[str, dict[str, Any]] = {}
    other: collections.Counter[str] = collections.Counter()
    workers = 0

    def add(name: str, result: str, count: int, first: str, samples: list[str]) -> None:
        entry = worker.setdefault(name, {"count": 0, "results": {}, "tests": [], "args": []})
        entry["count"] += count
        entry["results"][result] = entry["results"].get(result, 0) + count
        if first not in entry["tests"] and len(entry["tests"]) < 5:
            entry["tests"].append(first)
        for sample in samples:
            if sample not in entry["args"] and len(entry["args"]) < _ARG_SAMPLES:
                entry["args"].append(sample)

    for task in tasks.values():
        whole = task.filtered_from is None and inherited(task)
        if task.filtered_from is not None or whole:
            workers += 1
        for (name, result), count in task.after.items():
            add(name, result, count, task.first_test[name], task.samples[name])
        for (name, result), count in task.before.items():
            if whole:
                add(name, result, count, task.before_tests[name], task.before_samples[name])
            else:
                other[name] += count
    return {
        "workers": workers,
        "worker": dict(sorted(worker.items())),
        "other": dict(sorted(other.items())),
    }


# -- running -----------------------------------------------------------------------------------


def _trace(python: str, argv: list[str], trace: Path, log: Path) -> int:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO / "scripts"), env.get("PYTHONPATH", "")) if p
    )
    cmd = ["strace", "-f", "-q", "-s", "160", "-e", "trace=all", "-o", str(trace), python, *argv]
    with log.open("w") as out:
        done = subprocess.run(  # noqa: S603 - our own fixed argv
            cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, check=False
        )
        return done.returncode


def _merge(into: dict[str, Any], part: dict[str, Any], label: str) -> None:
    into["workers"] = into.get("workers", 0) + part["workers"]
    worker = into.setdefault("worker", {})
    for name, entry in part["worker"].items():
        mine = worker.setdefault(name, {"count": 0, "results": {}, "tests": [], "args": []})
        mine["count"] += entry["count"]
        for result, count in entry["results"].items():
            mine["results"][result] = mine["results"].get(result, 0) + count
        for test in entry["tests"]:
            tagged = test if label == "pytest" else f"{label}: {test}"
            if tagged not in mine["tests"] and len(mine["tests"]) < 5:
                mine["tests"].append(tagged)
        for sample in entry["args"]:
            if sample not in mine["args"] and len(mine["args"]) < _ARG_SAMPLES:
                mine["args"].append(sample)
    other = into.setdefault("other", {})
    for name, count in part["other"].items():
        other[name] = other.get(name, 0) + count


_VERSION = "import sys, platform; print(sys.version.split()[0], platform.libc_ver()[1])"


def run(pythons: list[str], out: Path, keep: Path | None, suites: list[str]) -> int:
    report: dict[str, Any] = {
        "how": "python scripts/seccomp_survey.py run " + " ".join(f"--python {p}" for p in pythons),
        "machine": {"kernel": platform.release(), "arch": platform.machine()},
        "pythons": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        base = keep or Path(tmp)
        for python in pythons:
            version = subprocess.run(  # noqa: S603 - the interpreter the caller named
                [python, "-c", _VERSION], capture_output=True, text=True, check=True
            ).stdout.split()
            label = f"python{version[0]}"
            entry: dict[str, Any] = {"python": version[0], "glibc": version[1], "runs": {}}
            pytest = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "seccomp_survey"]
            for what, argv in (
                ("pytest", [*pytest, *suites]),
                ("exercise", [str(REPO / "scripts" / "seccomp_survey.py"), "exercise"]),
            ):
                trace = base / f"{label}-{what}.strace"
                log = base / f"{label}-{what}.log"
                print(f"{label}: tracing {what} ...", file=sys.stderr, flush=True)
                status = _trace(python, argv, trace, log)
                entry["runs"][what] = {"exit_status": status}
                part = parse_trace(_lines(trace))
                _merge(entry, part, what)
                if keep is None:
                    trace.unlink()
            report["pythons"][label] = entry
    out.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    print(table(report))
    return 0


def table(report: dict[str, Any]) -> str:
    """Worker syscalls by interpreter: count and results, one row a syscall."""
    pythons = sorted(report["pythons"])
    names = sorted({n for p in pythons for n in report["pythons"][p]["worker"]})
    rows = [f"{'syscall':<22}" + "".join(f"{p:>30}" for p in pythons)]
    for name in names:
        cells = []
        for p in pythons:
            entry = report["pythons"][p]["worker"].get(name)
            if entry is None:
                cells.append(f"{'-':>30}")
                continue
            results = ",".join(f"{k}:{v}" for k, v in sorted(entry["results"].items()))
            cells.append(f"{results[:29]:>30}")
        rows.append(f"{name:<22}" + "".join(cells))
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    run_p = sub.add_parser("run", help="trace the suites and the exerciser, write the JSON")
    run_p.add_argument("--python", action="append", required=True)
    run_p.add_argument("--out", type=Path, required=True)
    run_p.add_argument("--keep", type=Path, help="keep the raw traces in this directory")
    run_p.add_argument("suites", nargs="*", default=list(SUITES))
    parse_p = sub.add_parser("parse", help="summarise one raw trace as JSON")
    parse_p.add_argument("trace", type=Path)
    table_p = sub.add_parser("table", help="print a survey JSON as a table")
    table_p.add_argument("survey", type=Path)
    sub.add_parser("exercise", help="run the stdlib exerciser plugin in a real sandbox")
    args = parser.parse_args(argv)
    if args.cmd == "run":
        return run(args.python, args.out, args.keep, args.suites)
    if args.cmd == "parse":
        print(json.dumps(parse_trace(_lines(args.trace)), indent=1, sort_keys=True))
        return 0
    if args.cmd == "table":
        print(table(json.loads(args.survey.read_text())))
        return 0
    return exercise()


if __name__ == "__main__":
    sys.exit(main())
