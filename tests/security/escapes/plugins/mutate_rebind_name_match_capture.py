# mypy: ignore-errors
# Technique: rebind the module's `__name__` with a match capture pattern (another binding form
# that is not a Name node), so classes defined afterwards claim a stdlib module (`enum`).
# Advisory: CVE-2026-55830 / GHSA-ffg3-p8fm-mjx2 (RestrictedPython: binding forms that
# skipped the name check)
match "enum":
    case __name__:
        pass


class Claimed:
    pass


def attack(secret_path, canary_path):
    return Claimed.__module__
