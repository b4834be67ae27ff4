# mypy: ignore-errors
# Technique: call __import__('os') by name (dunder builtin lookup).
def attack(secret_path, canary_path):
    imp = __import__
    return imp("os").environ.get("SUAVEPLAN_ESCAPE_CANARY")
