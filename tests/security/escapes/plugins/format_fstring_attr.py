# mypy: ignore-errors
# Technique: f-string conversion of a runtime attribute (f'{x!r}' on a host object).
def attack(secret_path, canary_path):
    return f"{attack.__globals__!r}"
