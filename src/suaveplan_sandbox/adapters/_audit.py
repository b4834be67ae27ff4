"""`JsonLinesAudit`: one JSON line per capability decision, and `iter_audit` to read them back.

Denials are bounded per plugin (`denials_per_s`, see `_audit_folding`): past the rate they are
counted into summary lines (`"suppressed": K`) instead of written one by one, so a plugin
looping on denied calls cannot fill the log, and the counts stay exact.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, final

from suaveplan_sandbox.adapters._audit_folding import DenialFolding, FoldedDenials
from suaveplan_sandbox.adapters._protocols import AuditRecord
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.metrics import AUDIT_DENIALS_SUPPRESSED, MetricsSink
from suaveplan_sandbox.permissions._clock import Clock, MonotonicClock

_AUDIT_LOGGER = logging.getLogger("suaveplan_sandbox.audit")
# Denial lines written per plugin and capability in each second; the rest are summarised.
DEFAULT_AUDIT_DENIALS_PER_S: Final = 10
_SUPPRESSED: Final = AUDIT_DENIALS_SUPPRESSED.name
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
        # a summary's: a record's `extra` must not be able to forge one
        "suppressed",
        "since",
    }
)


def _valid_rate(per_s: object) -> int | None:
    if per_s is None or (type(per_s) is int and per_s >= 0):
        return per_s
    raise SuaveplanError(
        "SAND_INVALID_ARGUMENT",
        "denials_per_s must be an int >= 0, or None for no limit",
        {"argument": "denials_per_s"},
    )


@final
class JsonLinesAudit:
    """An `AuditSink` writing one JSON object per decision through `logging` at INFO.

    The requested resource (path, URL, table, topic) is included only with
    `include_resource=True`. Secret *values* never reach an `AuditRecord`; for the secrets
    capability the resource is the declared name, never the value.

    `denials_per_s` (an int >= 0, default 10; None for no limit): denial lines written per
    plugin and capability in each one-second window. The others are counted, per operation,
    reason and outcome, into one summary line each (`"suppressed": K`, `"since"`: the first
    one's time), written when the window has closed and the next line reaches this sink, or
    at `flush()` (the gateway calls it when it closes). Allowed requests are always written.
    Each denial folded is counted at once in `plugin.audit_denials_suppressed_total` when
    `metrics` is given. `clock` (monotonic) times the windows.
    """

    def __init__(
        self,
        logger: logging.Logger = _AUDIT_LOGGER,
        *,
        include_resource: bool = False,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        denials_per_s: int | None = DEFAULT_AUDIT_DENIALS_PER_S,
        metrics: MetricsSink | None = None,
        clock: Clock | None = None,
    ) -> None:
        rate = _valid_rate(denials_per_s)
        self._logger = logger
        self._include_resource = include_resource
        self._now = now
        self._metrics = metrics
        self._clock = clock or MonotonicClock()
        self._folding = None if rate is None else DenialFolding(rate, now)
        self._lock = threading.Lock()  # the folding state: sandboxes on several threads

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

    def is_enabled(self) -> bool:
        """Whether a record would be written now (the logger is on for INFO)."""
        return self._logger.isEnabledFor(logging.INFO)

    def record(self, entry: AuditRecord) -> None:
        # The line is built only for a logger that will emit it: with no handler enabled
        # for INFO (logging's default), the JSON and the timestamp would be thrown away.
        if not self._logger.isEnabledFor(logging.INFO):
            return
        folding = self._folding
        if folding is None:
            self._logger.info("%s", self.line(entry))
        elif not entry.allowed:
            self._record_denial(folding, entry)
        else:
            # The allowed path: one attribute read unless a denial summary is pending.
            if folding.held and self._clock.now() >= folding.due_at:
                with self._lock:
                    self._write_summaries(folding.due(self._clock.now()))
            self._logger.info("%s", self.line(entry))

    def flush(self) -> None:
        """Write every pending denial summary now, its window closed or not."""
        folding = self._folding
        if folding is None or not folding.held:
            return
        with self._lock:
            summaries = folding.drain()
            if self._logger.isEnabledFor(logging.INFO):
                self._write_summaries(summaries)

    def _record_denial(self, folding: DenialFolding, entry: AuditRecord) -> None:
        with self._lock:
            now = self._clock.now()
            self._write_summaries(folding.due(now))  # a closed window's, before this line
            if folding.admit(entry, now):
                self._logger.info("%s", self.line(entry))
                return
        if self._metrics is not None:
            self._metrics.inc(_SUPPRESSED, {"plugin": entry.plugin, "capability": entry.capability})

    def _write_summaries(self, summaries: Sequence[FoldedDenials]) -> None:
        for folded in summaries:
            self._logger.info("%s", self._summary_line(folded))

    def _summary_line(self, folded: FoldedDenials) -> str:
        """The line standing for `folded.count` denials not written one by one."""
        data: dict[str, Any] = {
            "timestamp": self._now().isoformat(),
            "plugin": folded.plugin,
            "capability": folded.capability,
            "operation": folded.operation,
            "decision": "deny",
            "reason": folded.reason,
            "rule": None,
            "duration_ms": None,
            "outcome": folded.outcome,
            "suppressed": folded.count,
            "since": folded.since.isoformat(),
        }
        return json.dumps(data, separators=(",", ":"), sort_keys=True)


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
