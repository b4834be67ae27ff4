"""`JsonLinesAudit`: one JSON line per capability decision, and `iter_audit` to read them back."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, final

from suaveplan_sandbox.adapters._protocols import AuditRecord

_AUDIT_LOGGER = logging.getLogger("suaveplan_sandbox.audit")
_RESERVED: Final = frozenset(
    {
        "timestamp",
        "plugin",
        "capability",
        "operation",
        "decision",
        "reason",
        "rule",
        "duration_ms",
        "outcome",
        "resource",
    }
)


@final
class JsonLinesAudit:
    """An `AuditSink` writing one JSON object per decision through `logging` at INFO.

    The requested resource (path, URL, table, topic) is included only with
    `include_resource=True`. Secret *values* never reach an `AuditRecord`; for the secrets
    capability the resource is the declared name, never the value.
    """

    def __init__(
        self,
        logger: logging.Logger = _AUDIT_LOGGER,
        *,
        include_resource: bool = False,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._logger = logger
        self._include_resource = include_resource
        self._now = now

    def line(self, entry: AuditRecord) -> str:
        data: dict[str, Any] = {
            "timestamp": self._now().isoformat(),
            "plugin": entry.plugin,
            "capability": entry.capability,
            "operation": entry.operation,
            "decision": "allow" if entry.allowed else "deny",
            "reason": entry.reason,
            "rule": entry.rule,
            "duration_ms": round(entry.duration_ms, 3),
            "outcome": entry.outcome,
        }
        if self._include_resource and entry.resource is not None:
            data["resource"] = entry.resource
        for key, value in entry.extra.items():  # e.g. `correlation_id`
            if key not in _RESERVED:  # never a standard field, never `resource` behind our back
                data[key] = value
        return json.dumps(data, separators=(",", ":"), sort_keys=True)

    def record(self, entry: AuditRecord) -> None:
        # The line is built only for a logger that will emit it: with no handler enabled
        # for INFO (logging's default), the JSON and the timestamp would be thrown away.
        if self._logger.isEnabledFor(logging.INFO):
            self._logger.info("%s", self.line(entry))


def iter_audit(
    path: str | os.PathLike[str],
    *,
    plugin: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> Iterator[dict[str, Any]]:
    """Audit entries from a JSON-lines file (other lines skipped), filtered by plugin and time."""
    with Path(path).open(encoding="utf-8") as handle:
        for raw in handle:
            start = raw.find("{")
            if start < 0:
                continue
            try:
                entry = json.loads(raw[start:])
                stamp = datetime.fromisoformat(entry["timestamp"])
            except (ValueError, KeyError, TypeError):
                continue
            if not isinstance(entry, dict):
                continue
            if plugin is not None and entry.get("plugin") != plugin:
                continue
            if since is not None and stamp < since:
                continue
            if until is not None and stamp >= until:
                continue
            yield entry
