"""What every fuzz target shares: the atheris entry point and the "coded errors only" rule.

A target module defines `test_one_input(data: bytes) -> None` (pure: raises `Finding` or lets
an unexpected exception escape when the code under test misbehaves) and `seeds()`, the seed
corpus derived from `tests/vectors/`. `run_target` hands both to libFuzzer; the runner
(`python -m fuzz`) launches each target module in its own interpreter.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Final

from suaveplan_sandbox.errors import SuaveplanError, is_registered

REPO_ROOT: Final = Path(__file__).resolve().parent.parent
VECTORS: Final = REPO_ROOT / "tests" / "vectors"
SEEDS_ENV: Final = "SUAVEPLAN_FUZZ_SEEDS"
DEEP_ENV: Final = "SUAVEPLAN_FUZZ_DEEP"


class Finding(AssertionError):
    """The code under test broke a property: libFuzzer records the input as a crash."""


def vector_cases(name: str) -> list[dict[str, Any]]:
    """The `cases` rows of `tests/vectors/<name>.json`."""
    data = json.loads((VECTORS / f"{name}.json").read_text(encoding="utf-8"))
    cases: list[dict[str, Any]] = data["cases"]
    return cases


def require_coded(exc: SuaveplanError, code: str) -> None:
    """An error that reached us must carry `code`, and `code` must be registered."""
    if exc.code != code or not is_registered(exc.code):
        raise Finding(f"expected registered code {code}, got {exc.code!r}")


def write_seeds(seeds: Iterable[bytes], out: Path) -> int:
    """Write the seed corpus into `out` (one file per seed); the number written."""
    out.mkdir(parents=True, exist_ok=True)
    count = 0
    for count, seed in enumerate(seeds, start=1):
        (out / f"seed-{count:05d}").write_bytes(seed)
    return count


def run_target(
    test_one_input: Callable[[bytes], None],
    seeds: Callable[[], Iterable[bytes]],
    argv: list[str] | None = None,
) -> None:
    """libFuzzer main loop over `argv` (libFuzzer flags and corpus directories).

    With `SUAVEPLAN_FUZZ_SEEDS=DIR` in the environment the seed corpus is written to `DIR`
    first, in this same process, so the runner does not pay the start-up twice.
    """
    seeds_dir = os.environ.get(SEEDS_ENV)
    if seeds_dir:
        write_seeds(seeds(), Path(seeds_dir))
    import atheris

    atheris.Setup(list(sys.argv if argv is None else argv), test_one_input)
    atheris.Fuzz()
