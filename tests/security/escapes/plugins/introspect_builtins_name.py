# mypy: ignore-errors
# Technique: reference `__builtins__` directly as a name.
def attack(secret_path, canary_path):
    return repr(__builtins__)
