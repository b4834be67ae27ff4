# mypy: ignore-errors
# Technique: NFKC-normalised identifier: fullwidth/ligature letters in `__class__` (Python
# normalises identifiers; RestrictedPython name-check bypass family).
def attack(secret_path, canary_path):
    return repr(().__ｃlass__)
