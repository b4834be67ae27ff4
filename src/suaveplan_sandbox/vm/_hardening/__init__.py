"""Process hardening applied inside a freshly forked worker before any plugin code runs."""

from suaveplan_sandbox.vm._hardening._apply import (
    LAYERS,
    HardeningPlan,
    HardeningReport,
    RlimitSettings,
    apply_hardening,
    arm_cpu_backstop,
    arm_lifeline,
    cpu_backstop_seconds,
    hardening_was_applied,
    prepare_hardening,
    probe_hardening,
    reset_signal_to_default,
)

__all__ = [
    "LAYERS",
    "HardeningPlan",
    "HardeningReport",
    "RlimitSettings",
    "apply_hardening",
    "arm_cpu_backstop",
    "arm_lifeline",
    "cpu_backstop_seconds",
    "hardening_was_applied",
    "prepare_hardening",
    "probe_hardening",
    "reset_signal_to_default",
]
