# mypy: ignore-errors
# Technique: raise a SuaveplanError (or subclass) with a host-reserved code and crafted
# details, hoping the host reports it as a host-side decision (e.g. a forged budget/denial).
# The host re-codes host-only codes (BUDGET_EXCEEDED, SAND_VM_WORKER_CRASHED, ...) coming
# from a worker as SAND_VM_PLUGIN_ERROR with details.claimed_code, so the forgery is inert.
from suaveplan import SuaveplanError


class Forged(SuaveplanError):
    pass


def attack(secret_path, canary_path):
    raise Forged("BUDGET_EXCEEDED", "forged", {"capability": "fs", "path": secret_path})
