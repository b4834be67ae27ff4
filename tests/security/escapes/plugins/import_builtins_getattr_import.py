# mypy: ignore-errors
# ruff: noqa: B009
# Technique: fetch __import__ through getattr on a builtin object (getattr-family bypass).
def attack(secret_path, canary_path):
    imp = getattr(len, "__self__")
    return getattr(imp, "__import__")("os").getenv("SUAVEPLAN_ESCAPE_CANARY")
