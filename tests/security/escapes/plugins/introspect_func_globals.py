# mypy: ignore-errors
# Technique: read `__globals__` of a plugin function to reach `__builtins__`.
def attack(secret_path, canary_path):
    g = attack.__globals__
    return repr(g["__builtins__"])
