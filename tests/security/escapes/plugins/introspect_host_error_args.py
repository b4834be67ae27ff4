# mypy: ignore-errors
# Technique: inspect a caught SuaveplanError's attributes (details/cause) for host objects.
from suaveplan import SuaveplanError


def attack(secret_path, canary_path):
    try:
        eval("1")
    except SuaveplanError as e:
        return [repr(getattr(e, "cause", None)), repr(e.details), str(e)]
