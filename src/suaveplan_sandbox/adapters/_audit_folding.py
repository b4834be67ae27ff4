"""`DenialFolding`: how many denial lines the audit log writes, and what it counts instead.

Theory of operation: denials are counted in one-second windows per (plugin, capability). A
window opens at the first denial after the last one closed; the first `per_s` denials in it
are written as usual, the rest are counted per (operation, reason, outcome), the fields a
denial line has (a denial names no resource). Once the window has closed, those counts become
one summary per group, written before the next line of any plugin reaches the sink, or at
`drain()` (the gateway's close). Every denial is thus either a line of its own or counted in
exactly one summary: nothing is dropped, and the counts add up.

Allowed requests are never folded: each names what the plugin touched, and folding them would
let a flood of harmless calls hide the one that matters. Not thread-safe: the sink holds a
lock around every call.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final, final

from suaveplan_sandbox.adapters._protocols import AuditRecord

WINDOW_S: Final = 1.0
# Open windows kept before expired ones are swept (each sandbox has at most one per capability).
_SWEEP_AT: Final = 1024
_Group = tuple[str, str | None, str]  # (operation, reason, outcome)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class FoldedDenials:
    """`count` denials of one kind not written as lines of their own, the first at `since`."""

    plugin: str
    capability: str
    operation: str
    reason: str | None
    outcome: str
    count: int
    since: datetime


_NOTHING: Final[tuple[FoldedDenials, ...]] = ()


@final
class _Window:
    __slots__ = ("ends", "groups", "written")

    def __init__(self, ends: float) -> None:
        self.ends = ends
        self.written = 0
        # (operation, reason, outcome) -> (count, wall time of the first)
        self.groups: dict[_Group, tuple[int, datetime]] = {}


@final
class DenialFolding:
    """Decides which denials are written; holds the counts of the others until summarised."""

    __slots__ = ("_per_s", "_wall", "_windows", "due_at", "held")

    def __init__(self, per_s: int, wall: Callable[[], datetime]) -> None:
        self._per_s = per_s
        self._wall = wall
        self._windows: dict[tuple[str, str], _Window] = {}
        # Read without the sink's lock on every record: while `held` is 0 nothing is due.
        self.held = 0
        self.due_at = math.inf

    def admit(self, entry: AuditRecord, now: float) -> bool:
        """True: write `entry` (a denial). False: it was counted for a summary instead.

        Call `due(now)` first, so a closed window's summaries precede what follows it."""
        key = (entry.plugin, entry.capability)
        window = self._windows.get(key)
        if window is None or now >= window.ends:
            if len(self._windows) >= _SWEEP_AT:
                self._sweep(now)
            window = self._windows[key] = _Window(now + WINDOW_S)
        if window.written < self._per_s:
            window.written += 1
            return True
        group = (entry.operation, entry.reason, entry.outcome)
        count, since = window.groups.get(group) or (0, self._wall())
        window.groups[group] = (count + 1, since)
        self.held += 1
        self.due_at = min(self.due_at, window.ends)
        return False

    def due(self, now: float) -> Sequence[FoldedDenials]:
        """Summaries of every window closed by `now`, each handed out once."""
        if now < self.due_at:
            return _NOTHING
        out: list[FoldedDenials] = []
        for key, window in list(self._windows.items()):
            if now >= window.ends:
                del self._windows[key]
                out += self._summaries(key, window)
        self.due_at = min((w.ends for w in self._windows.values() if w.groups), default=math.inf)
        return out

    def drain(self) -> Sequence[FoldedDenials]:
        """Summaries of everything held, closed windows or not; every window starts afresh."""
        out: list[FoldedDenials] = []
        for key, window in self._windows.items():
            out += self._summaries(key, window)
        self._windows.clear()
        self.due_at = math.inf
        return out

    def _summaries(self, key: tuple[str, str], window: _Window) -> list[FoldedDenials]:
        plugin, capability = key
        out = [
            FoldedDenials(
                plugin=plugin,
                capability=capability,
                operation=operation,
                reason=reason,
                outcome=outcome,
                count=count,
                since=since,
            )
            for (operation, reason, outcome), (count, since) in window.groups.items()
        ]
        self.held -= sum(s.count for s in out)
        return out

    def _sweep(self, now: float) -> None:
        """Forget expired windows that hold nothing (`due` has taken those that did)."""
        for key in [k for k, w in self._windows.items() if now >= w.ends and not w.groups]:
            del self._windows[key]
