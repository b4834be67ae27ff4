"""Decisions are data: `Allow(rule, target)` or `Deny(capability, reason)`."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final, NoReturn, final

from suaveplan_sandbox.errors import SuaveplanError

CAPABILITIES: Final = ("fs", "fetch", "db", "secrets", "events")


class DenyReason(enum.StrEnum):
    """Why a request was denied. The values are the metric's `reason` label."""

    PATH_NOT_IN_ALLOWLIST = "path-not-in-allowlist"
    INVALID_PATH = "invalid-path"
    MODE_NOT_PERMITTED = "mode-not-permitted"
    HOST_NOT_IN_ALLOWLIST = "host-not-in-allowlist"
    SCHEME_NOT_PERMITTED = "scheme-not-permitted"
    INVALID_URL = "invalid-url"
    TABLE_OUT_OF_SCOPE = "table-out-of-scope"
    STATEMENT_NOT_PERMITTED = "statement-not-permitted"
    SECRET_NOT_DECLARED = "secret-not-declared"  # noqa: S105 — a reason label, not a secret
    EVENT_NOT_DECLARED = "event-not-declared"
    UNKNOWN_CAPABILITY = "unknown-capability"
    MALFORMED_PAYLOAD = "malformed-payload"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Allow:
    """The request is permitted.

    `rule` is the manifest rule that matched, verbatim (None where no rule text applies, e.g.
    `SELECT 1`); `target` is the normalised resource the caller must act on (the lexically
    resolved path relative to the root such as `uploads/a.png`, the serialised URL, the SQL
    text) so that adapters never re-interpret the guest's raw input differently.
    """

    rule: str | None = None
    target: str | None = None

    @property
    def allowed(self) -> bool:
        return True


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Deny:
    """The request is refused for `reason`. Never carries the requested resource."""

    capability: str
    reason: DenyReason

    @property
    def allowed(self) -> bool:
        return False

    def to_error(self) -> SuaveplanError:
        """The redaction-safe `SAND_PERM_DENIED` error for this denial."""
        return SuaveplanError(
            "SAND_PERM_DENIED",
            f"permission denied: {self.capability} ({self.reason.value})",
            {"capability": self.capability, "reason": self.reason.value},
        )

    def raise_for_denial(self) -> NoReturn:
        raise self.to_error()


Decision = Allow | Deny

# A dataclass `__init__` (keywords, defaults, frozen `object.__setattr__`) costs about four
# times the slot writes it performs; the checkers build one Allow per uncached decision, so
# they use this instead. The result is an ordinary `Allow` (same slots, equality, hash, repr).
_new_object: Final = object.__new__
_set_rule: Final = Allow.__dict__["rule"].__set__
_set_target: Final = Allow.__dict__["target"].__set__


def new_allow(rule: str | None, target: str | None) -> Allow:
    """`Allow(rule=rule, target=target)` without the dataclass constructor's overhead."""
    decision: Allow = _new_object(Allow)
    _set_rule(decision, rule)
    _set_target(decision, target)
    return decision
