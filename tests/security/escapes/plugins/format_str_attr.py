# mypy: ignore-errors
# ruff: noqa: UP030, UP032
# Technique: str.format attribute traversal `'{0.__class__.__base__}'` (the classic
# format-string escape).
# Advisory: CVE-2023-41039 / GHSA-xjw2-6jm9-rf67 (RestrictedPython: str.format reaches
# attributes the attribute guard refuses)
def attack(secret_path, canary_path):
    return "{0.__class__.__base__.__subclasses__}".format(())
