# mypy: ignore-errors
# Technique: match mapping pattern capturing `__builtins__` out of a globals() mapping.
def attack(secret_path, canary_path):
    match globals():
        case {"__builtins__": b}:
            return repr(b)
    return None
