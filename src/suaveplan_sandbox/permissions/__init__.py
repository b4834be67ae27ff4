"""Manifest → policy → checker, and budgets. Pure: no I/O, no asyncio, no sandbox imports."""

from suaveplan_sandbox.permissions._accel import speedups_status
from suaveplan_sandbox.permissions._budget import BudgetTracker, budget_error
from suaveplan_sandbox.permissions._checker import PermissionChecker
from suaveplan_sandbox.permissions._clock import Clock, MonotonicClock
from suaveplan_sandbox.permissions._decision import CAPABILITIES, Allow, Decision, Deny, DenyReason
from suaveplan_sandbox.permissions._manifest import (
    Budgets,
    DatabaseBlock,
    EventsBlock,
    Manifest,
    PermissionsBlock,
    SecretDecl,
    load_manifest,
    parse_manifest,
)
from suaveplan_sandbox.permissions._policy import PermissionPolicy

__all__ = [
    "CAPABILITIES",
    "Allow",
    "BudgetTracker",
    "Budgets",
    "Clock",
    "DatabaseBlock",
    "Decision",
    "Deny",
    "DenyReason",
    "EventsBlock",
    "Manifest",
    "MonotonicClock",
    "PermissionChecker",
    "PermissionPolicy",
    "PermissionsBlock",
    "SecretDecl",
    "budget_error",
    "load_manifest",
    "parse_manifest",
    "speedups_status",
]
