# mypy: ignore-errors
# Technique: inspect a caught SuaveplanError's attributes (details/cause) for host objects.
# Advisory: CVE-2023-30547 (vm2: exception sanitisation bypass in handleException leaked
# host exceptions and the host objects they carry)
from suaveplan import SuaveplanError


def attack(secret_path, canary_path):
    try:
        eval("1")
    except SuaveplanError as e:
        return [repr(getattr(e, "cause", None)), repr(e.details), str(e)]
