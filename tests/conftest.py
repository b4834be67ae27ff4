"""Suite-wide fixtures.

`security_record` lets the escape corpus, the fault-injection tests and other evidence
producers append one JSON row per technique or fault to a report directory. It writes
only when `SUAVEPLAN_SECURITY_REPORT_DIR` is set (as `make security-report` does), so an
ordinary `make test` run leaves no files behind; the assertions in each test are what
decide pass or fail, never the row.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

REPORT_DIR_ENV = "SUAVEPLAN_SECURITY_REPORT_DIR"

SecurityRecord = Callable[..., None]


def _append_row(section: str, row: dict[str, object]) -> None:
    directory = os.environ.get(REPORT_DIR_ENV)
    if not directory:
        return
    path = Path(directory) / f"{section}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as out:
        out.write(json.dumps(row, sort_keys=True) + "\n")


@pytest.fixture
def security_record() -> SecurityRecord:
    """`security_record("faults", kind="worker-sigkill", injected=5, survived=5)`."""

    def record(section: str, **row: object) -> None:
        _append_row(section, row)

    return record
