"""Reference pages generated from the code's registries (a test fails when docs drift)."""

from __future__ import annotations

from pathlib import Path

from suaveplan_sandbox.errors import registered_codes
from suaveplan_sandbox.metrics import METRICS


def error_codes_markdown() -> str:
    lines = [
        "# Error codes",
        "",
        "Generated from `suaveplan_sandbox.errors` (`python -m suaveplan_sandbox.cli reference`).",
        "Match on `SuaveplanError.code`; messages are for humans and may change.",
        "",
        "| code | meaning |",
        "|---|---|",
    ]
    for code, entry in registered_codes().items():
        if entry.owner.startswith("suaveplan_sandbox"):
            lines.append(f"| `{code}` | {entry.description} |")
    return "\n".join(lines) + "\n"


def metrics_markdown() -> str:
    lines = [
        "# Metrics",
        "",
        "Generated from `suaveplan_sandbox.metrics.METRICS`.",
        "Prometheus names replace `.` with `_`.",
        "",
        "| name | Prometheus | labels | meaning |",
        "|---|---|---|---|",
    ]
    for m in METRICS:
        labels = ", ".join(f"`{label}`" for label in m.labels)
        lines.append(f"| `{m.name}` | `{m.prometheus_name}` | {labels} | {m.description} |")
    return "\n".join(lines) + "\n"


PAGES = {
    "reference/error-codes.md": error_codes_markdown,
    "reference/metrics.md": metrics_markdown,
}


def write_reference(docs: Path) -> list[Path]:
    written = []
    for name, render in PAGES.items():
        path = docs / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render())
        written.append(path)
    return written


def stale_reference(docs: Path) -> list[Path]:
    """The generated pages under `docs` that are missing or differ from the registries."""
    stale = []
    for name, render in PAGES.items():
        path = docs / name
        if not path.is_file() or path.read_text() != render():
            stale.append(path)
    return stale
