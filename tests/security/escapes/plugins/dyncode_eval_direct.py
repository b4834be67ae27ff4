# mypy: ignore-errors
# Technique: direct eval() of an import expression (RestrictedPython-style eval escape).
def attack(secret_path, canary_path):
    return eval("__import__('os').environ['SUAVEPLAN_ESCAPE_CANARY']")
