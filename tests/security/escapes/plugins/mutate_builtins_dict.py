# mypy: ignore-errors
# ruff: noqa: PLR1711
# Technique: mutate the curated builtins dict through a function's globals.
def attack(secret_path, canary_path):
    b = globals()["__builtins__"]
    b["len"] = None
    return None
