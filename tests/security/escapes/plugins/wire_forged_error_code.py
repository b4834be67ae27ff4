# mypy: ignore-errors
# Technique: raise a SuaveplanError (or subclass) with a host-reserved code and crafted
# details, hoping the host reports it as a host-side decision (e.g. a forged budget/denial).
# Today this passes through by design (docs: an uncaught SuaveplanError keeps its code and
# details), so the host sees BUDGET_EXCEEDED without a breach; contained, but spoofable.
from suaveplan import SuaveplanError


class Forged(SuaveplanError):
    pass


def attack(secret_path, canary_path):
    raise Forged("BUDGET_EXCEEDED", "forged", {"capability": "fs", "path": secret_path})
